"""Consumer and delivery (docs/contract.md, Builds and masking) on local, memory and S3."""

from __future__ import annotations

import asyncio
import copy

import orjson
import pytest

from capture_core import delivery
from capture_core.builder import snapshot
from capture_core.builder.build_result import MASK_SAMPLE_KEY, TOKEN_CAPTURE_KEY
from capture_core.builder.snapshot import assemble
from capture_core.consumer import (
    clear_token_captures_for_rollouts,
    trajectories_for_rollout,
    trajectories_from_source,
)
from capture_core.delivery import (
    capture_build_can_retire,
    finalize_rollout_token_capture,
    retire_rollout_token_capture,
    rollout_carries_token_ids,
)
from capture_core.records import TokenEntry
from capture_core.store import TokenCaptureStore
from capture_core.store.capture_layout import call_key
from capture_core.testing.synthetic import RolloutShape, rollout_record, synthetic_rollout


@pytest.fixture()
def env_store_root(store_location, monkeypatch) -> str:
    """A root usable without storage options: S3 settings come from the AWS environment."""
    root, options = store_location
    if options:
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", str(options["endpoint_url"]))
    return root


def capture(store: TokenCaptureStore, rollout_id: str, shape: RolloutShape | None = None) -> None:
    for entry in synthetic_rollout(rollout_id, shape or RolloutShape()):
        store.put_now(entry)


def finalize(result: dict, source) -> dict | None:
    return asyncio.run(finalize_rollout_token_capture(result, source))


def retire(rollout_id: str, source, built) -> bool:
    return asyncio.run(retire_rollout_token_capture(rollout_id, source, built))


def test_clean_rollout_is_rebuilt_and_not_masked(store) -> None:
    capture(store, "3-4")
    built = asyncio.run(trajectories_from_source("3-4", store))
    assert built is not None and built["mask_sample"] is False and "error" not in built
    assert built["metrics"]["delivered_fraction"] == 1.0 and built["metrics"]["n_calls"] == 4
    assert set(built["_capture_snapshot"]) == {"snapshot_id", "version"}
    response = built["rebuilt_response"]
    assert response["id"] == "proj-3-4" and len(response["output"]) == 4


def test_trajectories_for_rollout_uses_the_configured_location(env_store_root) -> None:
    root = env_store_root
    capture(TokenCaptureStore(root), "1-1")
    assert trajectories_for_rollout("1-1", []) is None
    built = trajectories_for_rollout("1-1", [root])
    assert built is not None and built["mask_sample"] is False


def test_empty_capture_is_a_failed_build_with_snapshot(store) -> None:
    built = asyncio.run(trajectories_from_source("9-9", store))
    assert built["mask_sample"] and built["error"] == "capture contains no token records"
    assert built["rebuilt_response"] is None and "_capture_snapshot" in built


def test_incomplete_capture_masks_with_capture_incomplete(store, caplog) -> None:
    capture(store, "3-4")
    store.mark_incomplete_now("3-4", "call-9", reason="model server timed out")
    built = asyncio.run(trajectories_from_source("3-4", store))
    assert built["mask_sample"] and built["metrics"]["capture_incomplete"] is True
    assert "error" not in built, "a masked build without an error has no error key"
    assert "model server timed out" in caplog.text
    assert delivery.mask_reason(built).startswith("capture incomplete")


def test_malformed_capture_masks_instead_of_raising(store) -> None:
    capture(store, "3-4")
    store.byte_store.create(f"3-4/e/{call_key('junk')}", b"{not json")
    built = asyncio.run(trajectories_from_source("3-4", store))
    assert built["mask_sample"] and built["error"].startswith("freeze failed: UnreadableCapture")
    result = rollout_record(3, 4)
    assert finalize(result, store)["mask_sample"]
    assert "UnreadableCaptureError" in result[TOKEN_CAPTURE_KEY]["error"]


def test_per_request_is_refused_for_single_response_delivery(store) -> None:
    capture(store, "3-4")
    built = asyncio.run(trajectories_from_source("3-4", store, builder="per_request"))
    assert built["mask_sample"] and "single-response delivery" in built["error"]


def test_builder_runs_once_per_rollout(store, monkeypatch) -> None:
    capture(store, "3-4")
    calls = []
    real = snapshot.run_builder
    monkeypatch.setattr(snapshot, "run_builder", lambda *a: calls.append(a) or real(*a))
    finalize(rollout_record(3, 4), store)
    assert len(calls) == 1


def test_finalize_replaces_only_response_output(store) -> None:
    capture(store, "3-4")
    result = rollout_record(3, 4, reward=0.75)
    result["harness"] = {"turns": 4}
    before = copy.deepcopy(result)
    built = finalize(result, store)
    assert built["mask_sample"] is False and MASK_SAMPLE_KEY not in result
    assert result["response"]["output"] == built["rebuilt_response"]["output"]
    for key in ("reward", "verifier", "harness", "_ng_task_index", "_ng_rollout_index"):
        assert result[key] == before[key]
    assert {k: v for k, v in result["response"].items() if k != "output"} == {
        k: v for k, v in before["response"].items() if k != "output"
    }
    assert result[TOKEN_CAPTURE_KEY]["delivered_fraction"] == 1.0
    assert "error" not in result[TOKEN_CAPTURE_KEY]


def test_record_without_response_gets_the_rebuilt_one(store) -> None:
    capture(store, "3-4")
    result = {"_ng_task_index": 3, "_ng_rollout_index": 4, "reward": 1.0}
    finalize(result, store)
    assert result["response"]["id"] == "proj-3-4"


def test_record_with_token_ids_is_unchanged_and_redundant_capture_can_retire(store) -> None:
    capture(store, "3-4")
    result = rollout_record(3, 4)
    carried = {"prompt_token_ids": [7], "generation_token_ids": [1, 2]}
    result["response"]["output"][0].update(carried, generation_log_probs=[-0.1, -0.2])
    before = copy.deepcopy(result)
    assert rollout_carries_token_ids(result)
    built = finalize(result, store)
    assert result == before
    assert built["_redundant_capture"] is True and built["mask_sample"] is False
    assert capture_build_can_retire(built)
    assert retire("3-4", store, built)
    assert store.byte_store.list_prefix("3-4") == ["3-4/FROZEN", "3-4/RETIRED"]


@pytest.mark.parametrize(
    ("record", "error"),
    [
        ({"_ng_rollout_id": "../escape"}, "malformed rollout id"),
        ({"reward": 1.0}, "no capture key"),
    ],
)
def test_unusable_records_mask_with_their_error(store, record: dict, error: str) -> None:
    built = finalize(record, store)
    assert built["mask_sample"] and built["rebuilt_response"] is None
    assert error in built["error"] and record[MASK_SAMPLE_KEY] is True
    assert record[TOKEN_CAPTURE_KEY]["n_calls"] == 0 and error in record[TOKEN_CAPTURE_KEY]["error"]


def test_source_failure_masks_with_the_exception() -> None:
    class Broken:
        async def freeze(self, rollout_id: str):
            raise ConnectionError("token service down")

        async def drop(self, rollout_id: str, *, snapshot_id: str, version: int) -> bool:
            return False

        async def close(self) -> None:
            return None

    result = rollout_record(3, 4)
    built = finalize(result, Broken())
    assert built["mask_sample"] and "ConnectionError: token service down" in built["error"]
    assert finalize(rollout_record(3, 4), None) is None


def test_masked_builds_never_retire_and_keep_their_evidence(store) -> None:
    capture(store, "3-4", RolloutShape(turns=3, auxiliary_call=True))
    result = rollout_record(3, 4)
    built = finalize(result, store)
    assert built["mask_sample"] and result[MASK_SAMPLE_KEY] is True
    assert result[TOKEN_CAPTURE_KEY]["roots"] == 2
    assert not capture_build_can_retire(built)
    assert not retire("3-4", store, built)
    assert len(store.freeze_now("3-4").entries) == 4


def test_retirement_with_a_stale_snapshot_returns_false(store) -> None:
    capture(store, "3-4")
    built = finalize(rollout_record(3, 4), store)
    store.mark_incomplete_now("3-4", "late")
    assert not retire("3-4", store, built)
    assert len(store.read_entries("3-4")) == 4


def test_resolved_retry_rollout_is_clean_and_retires(store) -> None:
    capture(store, "3-4", RolloutShape(turns=4, retried_turn=1))
    built = finalize(rollout_record(3, 4), store)
    assert built["mask_sample"] is False and built["metrics"]["quarantined_calls"] == 1
    assert retire("3-4", store, built)


def test_dispatch_time_clear_deletes_exactly_the_given_rollouts(env_store_root) -> None:
    root = env_store_root
    store = TokenCaptureStore(root)
    for rollout_id in ("1-0", "1-1", "2-0"):
        capture(store, rollout_id)
    records = [
        {"_ng_task_index": 1, "_ng_rollout_index": 0},
        {"_ng_rollout_id": "2-0"},
        {"reward": 0.0},
    ]
    clear_token_captures_for_rollouts(records, [root])
    for cleared in ("1-0", "2-0"):  # only the marker of the next attempt stays
        assert store.byte_store.list_prefix(cleared) == [f"{cleared}/ATTEMPT"]
    assert len(store.read_entries("1-1")) == 4
    with pytest.raises(ValueError, match="1 record\\(s\\) have malformed rollout ids"):
        clear_token_captures_for_rollouts(
            [{"_ng_rollout_id": "a/b"}, {"_ng_rollout_id": "1-1"}], [root]
        )
    assert store.byte_store.list_prefix("1-1") == ["1-1/ATTEMPT"], "valid ids are still cleared"


def test_foreign_entry_objects_are_revalidated(store) -> None:
    class GymEntry:
        def __init__(self, payload: dict) -> None:
            self.payload = payload

        def model_dump(self) -> dict:
            return self.payload

    for entry in synthetic_rollout("5-5", RolloutShape(turns=2)):
        asyncio.run(store.put(GymEntry(orjson.loads(entry.model_dump_json()))))
    assert not finalize(rollout_record(5, 5), store)["mask_sample"]
    bad = GymEntry(
        {
            **synthetic_rollout("5-6", RolloutShape(turns=1))[0].model_dump(),
            "generation_log_probs": [],
        }
    )
    with pytest.raises(ValueError, match="generation_log_probs"):
        asyncio.run(store.put(bad))


def test_direct_assemble_of_invalid_entries_is_a_failed_build() -> None:
    broken = TokenEntry.model_construct(
        rollout_id="r",
        model_call_id="a",
        prompt_token_ids=[1],
        generation_token_ids=[2],
        generation_log_probs=[],
        output_items=[],
        token_item_index=None,
        created_at=0.0,
        schema_version=1,
        model="",
        routed_experts=None,
    )
    built = assemble("r", [broken], "prefix_merging", "").to_dict()
    assert built["mask_sample"] and "generation_log_probs" in built["error"]
    assert delivery.mask_reason(built) == built["error"]


def test_attempt_one_is_finalized_from_its_own_capture_never_a_stale_attempt(store) -> None:
    capture(store, "job-9", RolloutShape(turns=2, generated_tokens=3))
    record = {"_ng_rollout_id": "job-9", "_ng_attempt_index": 1, "reward": 1.0}
    built = finalize(record, store)
    assert built["mask_sample"] and built["error"] == "capture contains no token records"
    assert not store.byte_store.exists("job-9/FROZEN"), "the stale attempt is not fenced"
    assert store.byte_store.exists("job-9-a1/FROZEN")
    store.delete("job-9-a1")
    capture(store, "job-9-a1", RolloutShape(turns=2, generated_tokens=5))
    record = {"_ng_rollout_id": "job-9", "_ng_attempt_index": 1, "reward": 1.0}
    built = finalize(record, store)
    assert built["mask_sample"] is False
    generated = [i["generation_token_ids"] for i in record["response"]["output"]]
    assert [len(ids) for ids in generated if ids] == [5, 5], "attempt 1's own tokens"
