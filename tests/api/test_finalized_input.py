"""Records that arrive carrying finalize's own fields: an envelope, an earlier finalize's output.

Finalize builds from the capture and from what the harness wrote, never from what a record
claims it already delivered: an incoming `training_traces` envelope never survives, and a
record an earlier finalize rewrote is finalized as the harness's original (whose fields that
finalize kept under `_before_finalize`). A masked record never carries an envelope and its
capture is never retired.
"""

from __future__ import annotations

import asyncio
import copy

import orjson
import pytest

from capture_core.builder.build_result import MASK_SAMPLE_KEY, TOKEN_CAPTURE_KEY
from capture_core.builder.terminal import BEFORE_FINALIZE_KEY
from capture_core.builder.token_provenance import TOKEN_PROVENANCE_KEY
from capture_core.builder.trace_envelope import ENVELOPE_KEY, check_envelope
from capture_core.consumer import trajectories_from_source
from capture_core.delivery import capture_build_can_retire, finalize_rollout_token_capture
from capture_core.rows.trainer_rows import read_rows
from capture_core.run.batch_finalize import finalize_batch
from capture_core.run.part_upload import handoff_batch
from capture_core.run.retirement import retire_receipt
from capture_core.run.rollout_io import plan_rollout_file, read_batch
from capture_core.storage import open_byte_store
from capture_core.store import TokenCaptureStore
from capture_core.testing.agent_captures import agent_rollouts, write_capture
from capture_core.testing.synthetic import VOCAB, RolloutShape, rollout_record, synthetic_rollout
from tests.support.reliability_figures import record_case

pytestmark = pytest.mark.integrity

DELIVERIES = ("main_chain", "all_traces")
MADE_UP = VOCAB + 7
"""A token id outside the vocabulary: no policy sampled it, so no row may hold it."""


def made_up_envelope(rollout_id: str) -> dict:
    """An envelope that passes the envelope's own rules but names tokens never captured."""
    trace = {
        "trace_id": f"{rollout_id}:made-up",
        "model_call_ids": ["made-up"],
        "token_ids": [MADE_UP, MADE_UP + 1, MADE_UP + 2],
        "generation_logprobs": [0.0, -0.1, -0.1],
        "loss_mask": [0, 1, 1],
        "sampled_spans": [{"model_call_id": "made-up", "start": 1, "end": 3}],
    }
    envelope = {
        "schema_version": 1,
        "rollout_id": rollout_id,
        "builder": "prefix_merging",
        "traces": [trace],
    }
    check_envelope(envelope, rollout_id)
    return envelope


def carried_ids() -> dict:
    """A harness response that carries valid sampled ids (a redundant capture)."""
    item = {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "done"}],
        "prompt_token_ids": [11, 12],
        "generation_token_ids": [13, 14],
        "generation_log_probs": [-0.2, -0.3],
    }
    return {"id": "resp-7-2", "object": "response", "output": [item]}


def enveloped_inputs(store: TokenCaptureStore) -> list[dict]:
    """Three captured rollouts whose records each arrive with a made-up envelope: 7-0 clean,
    7-1 with an auxiliary root (masks under main_chain), 7-2 carrying its own sampled ids."""
    records = []
    for index in range(3):
        rollout_id = f"7-{index}"
        shape = RolloutShape(
            turns=3, prompt_tokens=16, generated_tokens=4, auxiliary_call=index == 1
        )
        for entry in synthetic_rollout(rollout_id, shape):
            store.put_now(entry)
        record = rollout_record(7, index)
        if index == 2:
            record["response"] = carried_ids()
        record[ENVELOPE_KEY] = made_up_envelope(rollout_id)
        records.append(record)
    return records


@pytest.mark.parametrize("delivery", DELIVERIES)
def test_a_made_up_envelope_on_the_input_never_becomes_rows_or_retires_a_capture(
    store: TokenCaptureStore, tmp_path, delivery: str
) -> None:
    captured = {}
    records = enveloped_inputs(store)
    for record in records:
        rollout_id = f"7-{record['_ng_rollout_index']}"
        captured[rollout_id] = {e.model_call_id: e for e in store.read_entries(rollout_id)}
    rollouts = tmp_path / "rollouts.jsonl"
    rollouts.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    (batch,) = plan_rollout_file(str(rollouts), 10).batches
    lines = read_batch(str(rollouts), batch)
    finalized = asyncio.run(
        finalize_batch("run", batch, lines, store, rows="parquet", delivery=delivery)
    )
    rows = read_rows(finalized.rows or b"").to_pylist()
    assert rows, "the clean rollout delivers rows"
    assert all(max(row["token_ids"]) < VOCAB for row in rows), "no made-up token is a row"
    assert not [row for row in rows if row["trace_id"].endswith(":made-up")]
    for line in finalized.part.splitlines():
        record = orjson.loads(line)
        rollout_id = f"7-{record['_ng_rollout_index']}"
        envelope = record.get(ENVELOPE_KEY)
        if delivery == "main_chain" or record.get(MASK_SAMPLE_KEY):
            assert envelope is None, f"{rollout_id} keeps an envelope this finalize did not build"
        else:
            check_envelope(envelope, rollout_id, calls=captured[rollout_id])
    dest = open_byte_store(str(tmp_path / "dest"))
    receipt = handoff_batch("run", finalized, dest)
    retired = asyncio.run(retire_receipt(receipt, store, dest)).retired
    assert retired, "delivered rollouts retire"
    assert set(retired) <= {row["rollout_id"] for row in rows}, "retired only for real rows"
    masked = {o.rollout_id for o in finalized.outcomes if o.masked}
    assert not masked & set(retired)
    record_case(f"a made-up envelope on the input never reaches the rows ({delivery})")


def finalized(record: dict, store: TokenCaptureStore, delivery: str) -> tuple[dict, dict | None]:
    """A copy of `record` finalized with `delivery`, and its build."""
    copied = copy.deepcopy(record)
    built = asyncio.run(finalize_rollout_token_capture(copied, store, delivery=delivery))
    return copied, built


def test_refinalizing_agent_rollouts_gives_what_finalizing_the_originals_gives(tmp_path) -> None:
    """64 seeded agent rollouts, finalized, then finalized again with either delivery."""
    store = TokenCaptureStore(str(tmp_path / "store"))
    rollouts = agent_rollouts(64, seed=2)
    for rollout in rollouts:
        write_capture(store, rollout)
    enveloped_masks = differ = retire_masked = masked_by_both = 0
    for rollout in rollouts:
        first = {d: finalized(rollout.record, store, d)[0] for d in DELIVERIES}
        masked = {d: bool(first[d].get(MASK_SAMPLE_KEY)) for d in DELIVERIES}
        masked_by_both += masked["main_chain"] and masked["all_traces"]
        for earlier in DELIVERIES:
            for delivery in DELIVERIES:
                again, built = finalized(first[earlier], store, delivery)
                enveloped_masks += bool(again.get(MASK_SAMPLE_KEY) and ENVELOPE_KEY in again)
                differ += again != first[delivery]
                retire_masked += bool(
                    again.get(MASK_SAMPLE_KEY) and capture_build_can_retire(built)
                )
    shapes = {s for r in rollouts for s in r.shapes}
    assert {"auxiliary", "subagent", "diverse_final_retry", "lost_call"} <= shapes
    assert masked_by_both >= 5, "the seed holds rollouts that stay masked when finalized again"
    record_case("re-finalizing a finalized record gives the original's result")
    assert (enveloped_masks, differ, retire_masked) == (0, 0, 0)


def without_kept_fields(record: dict) -> dict:
    """A finalized record as a finalize that keeps nothing writes it (NeMo Gym's, say)."""
    legacy = copy.deepcopy(record)
    legacy.pop(BEFORE_FINALIZE_KEY, None)
    return legacy


def test_a_finalized_record_keeps_what_the_harness_wrote_and_is_read_from_it(tmp_path) -> None:
    store = TokenCaptureStore(str(tmp_path / "store"))
    rollouts = agent_rollouts(64, seed=2)
    misread = 0
    for rollout in rollouts:
        write_capture(store, rollout)
        record, _ = finalized(rollout.record, store, "main_chain")
        if record.get("response") != rollout.record["response"]:
            assert record[BEFORE_FINALIZE_KEY]["response"] == rollout.record["response"]

        def build(given: dict, rollout_id: str = rollout.rollout_id) -> dict | None:
            return asyncio.run(trajectories_from_source(rollout_id, store, record=given))

        assert build(record) == build(rollout.record)
        misread += build(without_kept_fields(record)) != build(rollout.record)
    assert misread, "the seed holds rollouts whose rebuilt output reads as another transcript"
    record_case("terminal attribution reads the scored response the harness wrote")


def test_a_rebuilt_record_without_the_harness_fields_is_never_read_as_the_transcript(
    tmp_path,
) -> None:
    """The scored transcript is lost: all_traces masks it by name; main_chain leaves it
    unchanged as a redundant capture, and one that was masked stays masked and keeps its
    capture."""
    store = TokenCaptureStore(str(tmp_path / "store"))
    rollouts = agent_rollouts(16, seed=2)
    seen_masked = seen_delivered = 0
    for rollout in rollouts:
        write_capture(store, rollout)
        legacy = without_kept_fields(finalized(rollout.record, store, "main_chain")[0])
        traced, built = finalized(legacy, store, "all_traces")
        if TOKEN_CAPTURE_KEY in legacy and "chains" in legacy[TOKEN_CAPTURE_KEY]:
            assert traced[MASK_SAMPLE_KEY] is True and ENVELOPE_KEY not in traced
            assert "without keeping the one the harness wrote" in traced[TOKEN_CAPTURE_KEY]["error"]
            assert not capture_build_can_retire(built)
            again, built = finalized(legacy, store, "main_chain")
            unvouched = {k: v for k, v in legacy.items() if k != TOKEN_PROVENANCE_KEY}
            assert again == unvouched, "left unchanged, but for versions no capture vouches for"
            assert capture_build_can_retire(built) is not bool(legacy.get(MASK_SAMPLE_KEY))
            seen_masked += bool(legacy.get(MASK_SAMPLE_KEY))
            seen_delivered += not legacy.get(MASK_SAMPLE_KEY)
    assert seen_masked and seen_delivered
    record_case("a rebuilt record without the harness's fields is never read as the transcript")


def test_a_record_that_arrives_masked_carries_no_envelope_and_keeps_its_capture(store) -> None:
    for entry in synthetic_rollout("7-0", RolloutShape(turns=3)):
        store.put_now(entry)
    record = {**rollout_record(7, 0), MASK_SAMPLE_KEY: True}
    for delivery in DELIVERIES:
        done, built = finalized(record, store, delivery)
        assert done[MASK_SAMPLE_KEY] is True and ENVELOPE_KEY not in done
        assert built is not None and built["mask_sample"] is True
        assert ENVELOPE_KEY not in built and not capture_build_can_retire(built)
        assert "arrived masked" in done[TOKEN_CAPTURE_KEY]["error"]
        assert BEFORE_FINALIZE_KEY not in done or MASK_SAMPLE_KEY not in done[BEFORE_FINALIZE_KEY]
    record_case("a record that arrives masked carries no envelope and keeps its capture")


@pytest.mark.parametrize("edited", ["junk", [], {}, {"reward": 1.0}, {"response": 3, "x": 1}])
def test_an_edited_before_finalize_masks_and_keeps_the_capture(store, edited) -> None:
    """Finalize writes `_before_finalize` as an object of the fields it replaced; anything
    else is an edited record, never a record whose tokens may retire its capture."""
    for entry in synthetic_rollout("7-0", RolloutShape(turns=3)):
        store.put_now(entry)
    first, _ = finalized(rollout_record(7, 0), store, "main_chain")
    assert first.get(MASK_SAMPLE_KEY) is not True and BEFORE_FINALIZE_KEY in first
    for delivery in DELIVERIES:
        done, built = finalized({**first, BEFORE_FINALIZE_KEY: edited}, store, delivery)
        assert done[MASK_SAMPLE_KEY] is True and ENVELOPE_KEY not in done
        assert built is not None and not capture_build_can_retire(built)
        assert "the record was edited" in done[TOKEN_CAPTURE_KEY]["error"]
    record_case("an edited _before_finalize never retires a capture")
