"""Attacks on `all_traces` delivery: what must not train stays masked or unowned.

Each case finalizes through `finalize_rollout_token_capture(..., delivery="all_traces")`
from a real store (local disk, memory and S3 on moto), checks every delivered envelope the
way a consumer does, and records the attack case for `bench/reliability_report.py`.
"""

from __future__ import annotations

import asyncio
import copy
import math

import orjson
import pytest

from capture_core.builder.build_result import SNAPSHOT_KEY, TOKEN_CAPTURE_KEY
from capture_core.builder.snapshot import build_from_snapshot
from capture_core.builder.terminal import TerminalInputs
from capture_core.builder.trace_envelope import ENVELOPE_KEY, check_envelope, owned_calls
from capture_core.delivery import (
    capture_build_can_retire,
    finalize_rollout_token_capture,
    mask_reason,
    retire_rollout_token_capture,
)
from capture_core.errors import CaptureConflictError
from capture_core.protocols import TokenCaptureSnapshot
from capture_core.run.capture_source import clear_captures
from capture_core.run.receipt import HandoffReceipt, RolloutOutcome
from capture_core.run.retire_verdict import retirable
from capture_core.store import TokenCaptureStore
from capture_core.store.capture_layout import call_key
from capture_core.testing.synthetic import RolloutShape, rollout_record, synthetic_rollout
from capture_core.testing.trace_shapes import episode, write_episode
from tests.store.test_store_attacks import edit_one_digit, replace_object
from tests.support.attempts import write_mixed_attempts
from tests.support.reliability_figures import record_case
from tests.support.token_calls import token_call

pytestmark = pytest.mark.integrity

ALL_TRACES = {"delivery": "all_traces"}


def _finalize(record: dict, store: TokenCaptureStore) -> dict:
    built = asyncio.run(finalize_rollout_token_capture(record, store, **ALL_TRACES))
    assert built is not None
    return built


def _delivered(record: dict, store: TokenCaptureStore, rollout_id: str) -> list[str]:
    """The checked envelope's owned calls; the record stays unmasked and may retire."""
    envelope = record[ENVELOPE_KEY]
    calls = {e.model_call_id: e for e in store.freeze_now(rollout_id).entries}
    check_envelope(envelope, rollout_id, calls=calls)
    assert not record.get("mask_sample")
    return owned_calls(envelope)


def _assert_masked(record: dict, built: dict, why: str | None = None) -> None:
    """Masked, no envelope, capture kept; `why` in the error, or (`None`) an incomplete capture."""
    assert built["mask_sample"] is True and record["mask_sample"] is True
    assert ENVELOPE_KEY not in record and ENVELOPE_KEY not in built
    if why is None:
        assert built["metrics"].get("capture_incomplete") is True
    else:
        assert why in (record[TOKEN_CAPTURE_KEY].get("error") or "")
    assert not capture_build_can_retire(built), "a masked build keeps its capture as evidence"


def _captured(store: TokenCaptureStore, task: int, index: int) -> list:
    calls = synthetic_rollout(f"{task}-{index}", RolloutShape(turns=3))
    for entry in calls:
        store.put_now(entry)
    return calls


def test_lost_call_masks_and_carries_no_envelope(store) -> None:
    ep = episode(0, "lost", seed=2)
    write_episode(store, ep)
    record = copy.deepcopy(ep.record)
    built = _finalize(record, store)
    _assert_masked(record, built)
    record_case("all_traces: a lost call masks the rollout", wrong_tokens_delivered=0)


def test_a_forged_envelope_on_the_input_never_survives(store) -> None:
    ep = episode(1, "lost", seed=2)
    write_episode(store, ep)
    record = copy.deepcopy(ep.record)
    forged = {"schema_version": 1, "rollout_id": ep.rollout_id, "builder": "per_request"}
    record[ENVELOPE_KEY] = {**forged, "traces": [{"token_ids": [1, 2]}]}
    built = _finalize(record, store)
    _assert_masked(record, built)
    record_case("all_traces: an envelope already on the input is dropped", wrong_tokens_delivered=0)


def test_conflicting_duplicate_masks(store) -> None:
    calls = _captured(store, 3, 4)
    n = len(calls[1].generation_token_ids)
    other = calls[1].model_copy(update={"generation_token_ids": [5] * n})
    with pytest.raises(CaptureConflictError):
        store.put_now(other)
    record = rollout_record(3, 4)
    built = _finalize(record, store)
    _assert_masked(record, built)
    record_case("all_traces: two different captures of one call id mask", wrong_tokens_delivered=0)


def test_edited_capture_masks(store) -> None:
    calls = _captured(store, 3, 5)
    key = f"3-5/e/{call_key(calls[-1].model_call_id)}"
    replace_object(store, key, edit_one_digit(store.byte_store.get(key) or b"", b'"g":['))
    record = rollout_record(3, 5)
    built = _finalize(record, store)
    _assert_masked(record, built, "digest")
    record_case("all_traces: an edited capture masks", wrong_tokens_delivered=0)


def test_abandoned_try_is_never_owned_and_the_rest_trains_and_retires(store) -> None:
    ep = episode(2, "abandoned", seed=2)
    write_episode(store, ep)
    record = copy.deepcopy(ep.record)
    built = _finalize(record, store)
    owned = _delivered(record, store, ep.rollout_id)
    assert set(owned) == ep.used and not set(owned) & ep.abandoned
    assert built["metrics"]["excluded_calls"] == {"abandoned_try": 1}
    assert capture_build_can_retire(built)
    assert asyncio.run(retire_rollout_token_capture(ep.rollout_id, store, built))
    record_case(
        "all_traces: an abandoned retry of the scored call is never owned",
        wrong_tokens_delivered=len(set(owned) & ep.abandoned),
    )


def test_parallel_samples_both_train(store) -> None:
    ep = episode(3, "parallel", seed=2)
    write_episode(store, ep)
    record = copy.deepcopy(ep.record)
    _finalize(record, store)
    owned = _delivered(record, store, ep.rollout_id)
    assert sorted(owned) == sorted(ep.used) and len(owned) == len(set(owned))
    record_case("all_traces: two used samples of one prompt both train once")


@pytest.mark.parametrize("writer_fields", [False, True], ids=["tokens-only", "nemo-gym-writer"])
def test_rewritten_history_roots_train_from_the_tokens_alone(store, writer_fields) -> None:
    ep = episode(4, "thinking", seed=2)
    if writer_fields:  # NeMo Gym 0.7.0's writer: each rewritten-history call is a root
        extra = {"parent_call_id": None, "parent_resolution": "root"}
        ep.entries = [e.model_copy(update=extra) for e in ep.entries]
    write_episode(store, ep)
    record = copy.deepcopy(ep.record)
    _finalize(record, store)
    owned = _delivered(record, store, ep.rollout_id)
    assert set(owned) == ep.used
    assert len(record[ENVELOPE_KEY]["traces"]) == len(ep.used), "every call is a root"
    record_case(f"all_traces: rewritten history trains every root ({len(ep.used)} calls)")


def test_non_finite_log_prob_masks() -> None:
    call = token_call("a", [1, 2], [3, 4])
    call.generation_log_probs = [-0.5, math.nan]  # reassigned after validation
    snapshot = TokenCaptureSnapshot("r", (call,), False, "snap", 1)
    built = build_from_snapshot(snapshot, "prefix_merging", "", None, "all_traces")
    assert built.mask_sample and built.training_traces is None
    assert "NaN or infinite" in (built.error or "")
    record_case("all_traces: a non-finite log prob masks", wrong_tokens_delivered=0)


def test_response_and_reward_stay_byte_for_byte(store) -> None:
    ep = episode(5, "subagent", seed=2)
    write_episode(store, ep)
    record = copy.deepcopy(ep.record)
    before = orjson.dumps({"response": record["response"], "reward": record["reward"]})
    built = _finalize(record, store)
    after = orjson.dumps({"response": record["response"], "reward": record["reward"]})
    assert after == before
    assert SNAPSHOT_KEY in built and record[TOKEN_CAPTURE_KEY]["delivery"] == "all_traces"
    assert record[TOKEN_CAPTURE_KEY]["tokens_trained"] == ep.sampled_tokens()


def test_default_delivery_is_unchanged(store) -> None:
    ep = episode(6, "plain", seed=2)
    write_episode(store, ep)
    default, explicit = copy.deepcopy(ep.record), copy.deepcopy(ep.record)
    first = asyncio.run(finalize_rollout_token_capture(default, store))
    second = asyncio.run(finalize_rollout_token_capture(explicit, store, delivery="main_chain"))
    assert orjson.dumps(default) == orjson.dumps(explicit) and first == second
    assert ENVELOPE_KEY not in default and "delivery" not in default[TOKEN_CAPTURE_KEY]


def test_retirement_refuses_a_part_whose_envelope_fails_its_checks(store) -> None:
    ep = episode(7, "fork", seed=2)
    write_episode(store, ep)
    record = copy.deepcopy(ep.record)
    built = _finalize(record, store)
    snapshot = built[SNAPSHOT_KEY]
    outcome = RolloutOutcome(
        line=0,
        rollout_id=ep.rollout_id,
        can_retire=True,
        snapshot_id=snapshot["snapshot_id"],
        version=snapshot["version"],
        traces=len(record[ENVELOPE_KEY]["traces"]),
    )
    receipt = HandoffReceipt(
        run_id="run",
        batch=0,
        receipt_key="k",
        part_key="p",
        sha256="",
        bytes=0,
        records=1,
        rollouts=[outcome],
    )
    allowed, refuted = retirable(receipt, orjson.dumps(record) + b"\n")
    assert [r.rollout_id for r in allowed] == [ep.rollout_id] and refuted == {}
    record["training_traces"]["traces"][0]["loss_mask"][0] = 1
    allowed, refuted = retirable(receipt, orjson.dumps(record) + b"\n")
    assert allowed == [] and "first position" in refuted[ep.rollout_id]
    del record["training_traces"]
    allowed, refuted = retirable(receipt, orjson.dumps(record) + b"\n")
    assert allowed == [] and ep.rollout_id in refuted
    record_case("all_traces: a part whose envelope fails its checks is not retired")


def test_an_unsettled_retry_without_a_scored_call_masks(store) -> None:
    for call in (
        token_call("a", [1, 2], [3], rollout_id="5-1"),
        token_call("b", [1, 2], [4], rollout_id="5-1"),
    ):
        store.put_now(call)
    record = rollout_record(5, 1)
    record["response"] = {"object": "response", "output": []}
    built = _finalize(record, store)
    _assert_masked(record, built, "unsettled retry groups")
    assert TerminalInputs.from_record(record).explicit_call_id is None
    record_case("all_traces: an unsettled retry masks instead of owning a maybe-abandoned try")


@pytest.mark.parametrize(
    ("fields", "error"),
    [({}, "no capture key"), ({"_ng_rollout_id": "../x"}, "malformed rollout id")],
    ids=["no-id", "malformed-id"],
)
def test_a_record_without_a_usable_id_masks_without_an_envelope(store, fields, error) -> None:
    record = {"reward": 1.0, "response": {"output": []}, **fields}
    record[ENVELOPE_KEY] = {"schema_version": 1}
    built = _finalize(record, store)
    _assert_masked(record, built, error)
    record_case(f"all_traces: a record with {error} masks", wrong_tokens_delivered=0)


@pytest.mark.parametrize("shared", [False, True], ids=["own-first-prompt", "shared-first-prompt"])
def test_a_stale_attempt_in_the_capture_never_trains_nor_retires(store, shared) -> None:
    """An earlier attempt never finalized nor cleared, then this attempt's calls: two chains
    that look like independent traces. Nothing shows a dispatch-time clear ran, so the
    rollout masks naming it, under either delivery, and keeps its capture as evidence."""
    write_mixed_attempts(store, "8-1", shared_first_prompt=shared)
    record = rollout_record(8, 1)
    built = _finalize(record, store)
    _assert_masked(record, built, "dispatch-time clear")
    assert record["reward"] == rollout_record(8, 1)["reward"]
    assert not asyncio.run(retire_rollout_token_capture("8-1", store, built))
    assert len(store.read_entries("8-1")) == 6, "the capture stays as evidence"
    main = rollout_record(8, 1)
    masked = asyncio.run(finalize_rollout_token_capture(main, store))
    assert masked["mask_sample"] is True and "2 roots and 2 chains" in mask_reason(masked)
    owned = built["metrics"].get("owned_calls", 0)
    record_case(
        f"all_traces: a stale attempt ({'shared' if shared else 'own'} first prompt) masks",
        wrong_tokens_delivered=owned,
    )


@pytest.mark.parametrize("shape", ["subagent", "thinking", "fork", "parallel"])
def test_independent_traces_after_the_dispatch_time_clear_train_and_retire(store, shape) -> None:
    """The clear removes a stale attempt and marks the new one, so several traces are this
    attempt's own: every sampled call trains once and the capture retires."""
    ep = episode(9, shape, seed=4)
    write_mixed_attempts(store, ep.rollout_id, shared_first_prompt=False)
    assert clear_captures(store, [ep.rollout_id]) == 1
    for entry in ep.entries:
        store.put_now(entry)
    record = copy.deepcopy(ep.record)
    built = _finalize(record, store)
    owned = _delivered(record, store, ep.rollout_id)
    assert set(owned) == ep.used and len(record[ENVELOPE_KEY]["traces"]) > 1
    assert asyncio.run(retire_rollout_token_capture(ep.rollout_id, store, built))
    record_case(f"all_traces: {shape} traces after the dispatch-time clear train once")
