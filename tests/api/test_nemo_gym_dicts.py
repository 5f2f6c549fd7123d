"""Same output for the same capture: the dict shapes NeMo Gym's seed functions return."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import orjson

from capture_core.builder.build_result import TOKEN_CAPTURE_KEY
from capture_core.consumer import trajectories_for_rollout, trajectories_from_source
from capture_core.delivery import finalize_rollout_token_capture, rollout_carries_token_ids
from capture_core.protocols import TokenCaptureSnapshot
from capture_core.records import TokenEntry
from capture_core.store import TokenCaptureStore
from capture_core.testing.synthetic import RolloutShape, rollout_record, synthetic_rollout
from tests.support.build_result_cases import FixedSource
from tests.support.token_calls import token_call

BUILD_KEYS = {
    "rollout_id",
    "builder",
    "rebuilt_response",
    "mask_sample",
    "unresolved_retries",
    "metrics",
    "_capture_snapshot",
}
METRIC_KEYS = {
    "n_calls",
    "chains",
    "roots",
    "quarantined_calls",
    "quarantined_fraction",
    "delivered_fraction",
    "generated_tokens_captured",
    "generated_tokens_delivered",
    "empty_generation_calls",
    "terminal_attribution",  # NeMo Gym 0.7.0: on every build, failed ones included
}
NOT_ATTRIBUTED = {"method": "", "call_id": None, "reason": "", "chain": ""}
FAILED_KEYS = {"rollout_id", "builder", "rebuilt_response", "mask_sample", "error", "metrics"}


@dataclass(frozen=True)
class ForeignSnapshot:
    """Another library's snapshot type: the five protocol fields and nothing else."""

    rollout_id: str
    entries: tuple[Any, ...]
    incomplete: bool
    snapshot_id: str
    version: int


class ForeignEntry:
    """Another library's entry type: anything with `model_dump()`."""

    def __init__(self, payload: dict) -> None:
        self.payload = payload

    def model_dump(self, **_: Any) -> dict:
        return dict(self.payload)


def foreign_snapshot(incomplete: bool, turns: int = 3) -> ForeignSnapshot:
    entries = tuple(
        ForeignEntry(orjson.loads(e.model_dump_json()))
        for e in synthetic_rollout("3-4", RolloutShape(turns=turns))
    )
    return ForeignSnapshot("3-4", entries, incomplete, "s1", len(entries))


def test_successful_build_has_nemo_gym_keys(tmp_path) -> None:
    store = TokenCaptureStore(tmp_path / "store")
    for entry in synthetic_rollout("3-4", RolloutShape(turns=3)):
        store.put_now(entry)
    built = trajectories_for_rollout("3-4", [tmp_path / "store"])
    assert set(built) == BUILD_KEYS and set(built["metrics"]) == METRIC_KEYS
    assert built["rebuilt_response"]["model"] == "", "the model is used as given"
    assert set(built["rebuilt_response"]) == {"id", "model", "object", "output", "usage"}


def test_failed_build_has_nemo_gym_keys(tmp_path) -> None:
    built = trajectories_for_rollout("9-9", [tmp_path / "store"])
    assert set(built) == FAILED_KEYS | {"_capture_snapshot"}
    assert built["metrics"] == {"n_calls": 0, "terminal_attribution": NOT_ATTRIBUTED}


def test_record_metrics_have_an_error_key_only_with_an_error(tmp_path) -> None:
    store = TokenCaptureStore(tmp_path / "store")
    for entry in synthetic_rollout("3-4", RolloutShape(turns=3)):
        store.put_now(entry)
    clean = rollout_record(3, 4)
    asyncio.run(finalize_rollout_token_capture(clean, store))
    assert set(clean[TOKEN_CAPTURE_KEY]) == METRIC_KEYS
    for entry in synthetic_rollout("5-5", RolloutShape(turns=3, auxiliary_call=True)):
        store.put_now(entry)
    masked = rollout_record(5, 5)
    built = asyncio.run(finalize_rollout_token_capture(masked, store))
    assert masked["mask_sample"] is True and "error" not in masked[TOKEN_CAPTURE_KEY]
    assert set(built) == BUILD_KEYS
    empty = rollout_record(7, 7)
    asyncio.run(finalize_rollout_token_capture(empty, store))
    assert empty[TOKEN_CAPTURE_KEY]["error"] == "capture contains no token records"


def test_redundant_and_unusable_results_have_nemo_gym_keys(tmp_path) -> None:
    store = TokenCaptureStore(tmp_path / "store")
    carrying = rollout_record(3, 4)
    carried = {"prompt_token_ids": [7], "generation_token_ids": [1], "generation_log_probs": [-1]}
    carrying["response"]["output"][0].update(carried)
    built = asyncio.run(finalize_rollout_token_capture(carrying, store))
    assert set(built) == {
        "rebuilt_response",
        "mask_sample",
        "_redundant_capture",
        "_capture_snapshot",
    }
    unusable = {"reward": 1.0}
    built = asyncio.run(finalize_rollout_token_capture(unusable, store))
    assert set(built) == {"rebuilt_response", "mask_sample", "error", "metrics"}
    assert (
        built["metrics"] == unusable[TOKEN_CAPTURE_KEY] == {"n_calls": 0, "error": "no capture key"}
    )


def test_chat_messages_carry_token_ids_only_when_non_empty() -> None:
    def chat(ids: list[int] | None) -> dict:
        message: dict = {"role": "assistant", "content": "x"}
        if ids is not None:
            message["generation_token_ids"] = ids
        return {"response": {"choices": [{"message": message}]}}

    assert rollout_carries_token_ids(chat([5]))
    assert not rollout_carries_token_ids(chat([]))
    assert not rollout_carries_token_ids(chat(None))
    assert not rollout_carries_token_ids({"response": {"output": [{"generation_token_ids": []}]}})
    assert rollout_carries_token_ids({"response": {"output": [{"generation_token_ids": (4,)}]}})


def test_foreign_snapshot_types_build_like_our_own() -> None:
    clean = asyncio.run(trajectories_from_source("3-4", FixedSource(foreign_snapshot(False))))
    assert clean["mask_sample"] is False and set(clean) == BUILD_KEYS
    incomplete = asyncio.run(trajectories_from_source("3-4", FixedSource(foreign_snapshot(True))))
    assert incomplete["mask_sample"] is True
    assert incomplete["metrics"]["capture_incomplete"] is True
    assert incomplete["_capture_snapshot"] == {"snapshot_id": "s1", "version": 3}
    record = rollout_record(3, 4)
    built = asyncio.run(finalize_rollout_token_capture(record, FixedSource(foreign_snapshot(True))))
    assert built["mask_sample"] and record["mask_sample"] is True


def test_an_unreadable_foreign_snapshot_is_a_failed_build() -> None:
    class Broken:
        rollout_id = "3-4"
        entries = None
        incomplete = True

    built = asyncio.run(trajectories_from_source("3-4", FixedSource(Broken())))
    assert built["mask_sample"] and built["rebuilt_response"] is None
    assert built["error"].startswith("unreadable snapshot")


# Builds NeMo Gym's prefix_merging gives for captures with identical cumulative sequences,
# written from its algorithm: an ambiguous child is quarantined under its first candidate
# parent (prompt length, call id), so that parent is no leaf and yields no chain.
def _call(call_id: str, prompt: list[int], generation: list[int], created_at: float) -> TokenEntry:
    item = {"type": "message", "role": "assistant", "content": [{"type": "output_text"}]}
    return token_call(
        call_id,
        prompt,
        generation,
        rollout_id="3-4",
        output_items=[item],
        token_item_index=0,
        created_at=created_at,
    )


def _build(entries: list[TokenEntry]) -> dict:
    snapshot = TokenCaptureSnapshot("3-4", tuple(entries), False, "snap-1", len(entries))
    return asyncio.run(trajectories_from_source("3-4", FixedSource(snapshot)))


def _projected(prompt: list[int], generation: list[int]) -> dict:
    item = {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text"}],
        "prompt_token_ids": prompt,
        "generation_token_ids": generation,
        "generation_log_probs": [-0.5] * len(generation),
    }
    usage = {"input_tokens": len(prompt), "output_tokens": len(generation)}
    return {"id": "proj-3-4", "model": "", "object": "response", "output": [item], "usage": usage}


DUPLICATES = [
    _call("call-a", [1, 2, 3], [4, 5], 1.0),
    _call("call-b", [1, 2, 3], [4, 5], 1.5),
    _call("call-c", [1, 2, 3, 4, 5, 6], [7], 3.0),
]
SNAPSHOT_KEY_VALUE = {"snapshot_id": "snap-1", "version": 3}


def test_identical_duplicates_next_to_a_child_fail_as_in_nemo_gym() -> None:
    built = _build(DUPLICATES)
    assert built == {
        "rollout_id": "3-4",
        "builder": "prefix_merging",
        "rebuilt_response": None,
        "mask_sample": True,
        "error": "ValueError: capture produced no safe trainable chain",
        "metrics": {"n_calls": 3, "terminal_attribution": NOT_ATTRIBUTED},
        "_capture_snapshot": SNAPSHOT_KEY_VALUE,
    }


def test_one_sequence_split_two_ways_delivers_nemo_gyms_chain() -> None:
    built = _build(
        [
            _call("call-a", [1, 2, 3], [4, 5], 1.0),
            _call("call-b", [1, 2, 3, 4], [5], 2.0),
            _call("call-c", [1, 2, 3, 4, 5, 6], [7], 3.0),
        ]
    )
    assert built["rebuilt_response"] == _projected([1, 2, 3, 4], [5])
    assert built["mask_sample"] is True and built["unresolved_retries"] == []
    assert built["metrics"] == {
        "n_calls": 3,
        "chains": 1,
        "roots": 2,
        "quarantined_calls": 1,
        "quarantined_fraction": 0.3333,
        "delivered_fraction": 0.25,
        "generated_tokens_captured": 4,
        "generated_tokens_delivered": 1,
        "empty_generation_calls": 0,
        "terminal_attribution": NOT_ATTRIBUTED,
    }


def test_a_sub_agent_root_next_to_duplicates_delivers_nemo_gyms_chain() -> None:
    built = _build([_call("call-s", [50, 51], [52], 0.5), *DUPLICATES])
    assert built["rebuilt_response"] == _projected([50, 51], [52])
    assert built["mask_sample"] is True
    assert built["unresolved_retries"] == ["call-a", "call-b"]
    metrics = built["metrics"]
    assert (metrics["chains"], metrics["quarantined_calls"]) == (1, 2)
    assert metrics["delivered_fraction"] == 0.1667
    # NeMo Gym counts 3 roots (the quarantined retry too); tokcap counts roots that are not
    # quarantined (docs/nemo-gym.md). Both mask.
    assert metrics["roots"] == 2


def test_metrics_hold_numbers_beside_the_one_attribution_mapping(tmp_path) -> None:
    """The shape docs/nemo-gym.md documents: numbers, plus `terminal_attribution` (a mapping of
    four fields, where NeMo Gym has put it since it attributes terminals)."""
    store = TokenCaptureStore(tmp_path / "store")
    for entry in synthetic_rollout("3-4", RolloutShape(turns=3, auxiliary_call=True)):
        store.put_now(entry)
    for built in (trajectories_for_rollout("3-4", [tmp_path / "store"]), _build(DUPLICATES)):
        metrics = dict(built["metrics"])
        assert set(metrics.pop("terminal_attribution")) == set(NOT_ATTRIBUTED)
        assert all(type(v) in (int, float) for v in metrics.values()), metrics


def test_unusable_masks_the_record_and_warns_its_message(caplog) -> None:
    from capture_core.delivery import _unusable

    record = {"reward": 0.5, "response": {"output": []}}
    with caplog.at_level("WARNING", logger="capture_core.delivery"):
        built = _unusable(record, "no capture key", "rollout masked: no capture key")
    assert built == {
        "rebuilt_response": None,
        "mask_sample": True,
        "error": "no capture key",
        "metrics": {"n_calls": 0, "error": "no capture key"},
    }
    assert record["mask_sample"] is True and record["reward"] == 0.5
    assert record[TOKEN_CAPTURE_KEY] == {"n_calls": 0, "error": "no capture key"}
    assert [r.getMessage() for r in caplog.records] == ["rollout masked: no capture key"]


def test_failed_build_is_nemo_gyms_failed_dict() -> None:
    from capture_core.consumer import _failed_build

    failed = _failed_build("3-4", "prefix_merging", "capture contains no token records", 2)
    assert set(failed) == FAILED_KEYS
    assert failed["rebuilt_response"] is None and failed["mask_sample"] is True
    assert failed["error"] == "capture contains no token records"
    assert failed["metrics"]["n_calls"] == 2


def test_assemble_builds_entries_as_the_seed_functions_do(tmp_path) -> None:
    from capture_core.consumer import _assemble

    entries = synthetic_rollout("3-4", RolloutShape(turns=3))
    store = TokenCaptureStore(tmp_path / "store")
    for entry in entries:
        store.put_now(entry)
    through_store = trajectories_for_rollout("3-4", [tmp_path / "store"])
    built = _assemble("3-4", entries, "prefix_merging", "")
    assert built["mask_sample"] is False and "_capture_snapshot" not in built
    assert set(built) == BUILD_KEYS - {"_capture_snapshot"}
    assert built["rebuilt_response"] == through_store["rebuilt_response"]
    refused = _assemble("3-4", entries, "per_request", "")
    assert refused["mask_sample"] is True and refused["rebuilt_response"] is None
