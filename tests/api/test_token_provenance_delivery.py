"""Weight versions through put, freeze and finalize, into the record and its trainer rows.

Calls carrying versions (one across a weight update in the middle of its generation, one
without any) are put through the store on every backend (local disk, memory, S3 on a moto
server), finalized with both deliveries by the seed function, and their rows derived; every
delivered generated token must carry exactly its captured version, every other position -1.
"""

from __future__ import annotations

import copy

import orjson
import pytest

from capture_core.builder.build_result import MASK_SAMPLE_KEY
from capture_core.builder.token_provenance import TOKEN_PROVENANCE_KEY
from capture_core.builder.trace_envelope import (
    DELIVERIES,
    ENVELOPE_FIELDS,
    ENVELOPE_KEY,
    SPAN_FIELDS,
    TRACE_FIELDS,
    check_envelope,
)
from capture_core.delivery import capture_build_can_retire
from capture_core.rows.trainer_rows import record_rows, rows_table
from capture_core.run.receipt import HandoffReceipt, RolloutOutcome
from capture_core.run.retire_verdict import retirable
from capture_core.testing.synthetic import RolloutShape, rollout_record, synthetic_rollout
from tests.api.test_finalized_input import finalized
from tests.support.reliability_figures import record_case
from tests.support.weight_versions import (
    expected_replicas,
    expected_row_versions,
    versioned_rollout,
)

pytestmark = pytest.mark.integrity


def captured(store, rollout_index: int, shape: RolloutShape, versioned: bool = True) -> list:
    rollout_id = f"7-{rollout_index}"
    if versioned:
        entries = versioned_rollout(rollout_id, base=rollout_index, shape=shape)
    else:
        entries = synthetic_rollout(rollout_id, shape)
    for entry in entries:
        store.put_now(entry)
    return entries


def rows_of(record: dict, delivery: str) -> list[dict]:
    return rows_table(record_rows(record, 1, projected=delivery == "main_chain")).to_pylist()


@pytest.mark.parametrize("delivery", DELIVERIES)
def test_versions_across_a_mid_generation_update_survive_finalize_and_rows(store, delivery) -> None:
    wrong = 0
    for n, turns in enumerate([2, 4, 7]):
        shape = RolloutShape(turns=turns, generated_tokens=5 + 9 * n)
        entries = captured(store, n, shape)
        record, built = finalized(rollout_record(7, n), store, delivery)
        assert built is not None and not record.get(MASK_SAMPLE_KEY)
        key = record[TOKEN_PROVENANCE_KEY]
        assert set(key["calls"]) == {e.model_call_id for e in entries}
        for row in rows_of(record, delivery):
            expected = expected_row_versions(record, row, entries)
            wrong += row["weight_version"] != expected
            known = [v for v in expected if v >= 0]
            assert (row["min_weight_version"], row["max_weight_version"]) == (
                min(known),
                max(known),
            )
            assert row["replicas"] == expected_replicas(record, row, entries)
    record_case("weight versions across a mid-generation update reach the rows exactly")
    assert wrong == 0


@pytest.mark.parametrize("delivery", DELIVERIES)
def test_a_rollout_without_provenance_says_so_in_the_record_and_rows(store, delivery) -> None:
    entries = captured(store, 0, RolloutShape(turns=3), versioned=False)
    record, _ = finalized(rollout_record(7, 0), store, delivery)
    key = record[TOKEN_PROVENANCE_KEY]
    assert list(key["calls"].values()) == [None] * len(entries)
    generated = sum(len(e.generation_token_ids) for e in entries)
    assert key["versions"]["unknown_tokens"] == generated and key["versions"]["tokens"] == {}
    for row in rows_of(record, delivery):
        assert set(row["weight_version"]) == {-1}
        assert row["min_weight_version"] is None and row["max_weight_version"] is None
        assert row["replicas"] == []


@pytest.mark.parametrize("delivery", DELIVERIES)
def test_refinalizing_a_finalized_record_gives_the_same_record_and_key(store, delivery) -> None:
    captured(store, 0, RolloutShape(turns=4))
    first, _ = finalized(rollout_record(7, 0), store, delivery)
    assert TOKEN_PROVENANCE_KEY in first
    for again_with in DELIVERIES:
        again, built = finalized(first, store, again_with)
        original, _ = finalized(rollout_record(7, 0), store, again_with)
        assert again == original and capture_build_can_retire(built)
    edited = copy.deepcopy(first)
    edited[TOKEN_PROVENANCE_KEY]["calls"] = {}
    again, _ = finalized(edited, store, delivery)
    assert again == first, "finalize replaces an incoming key with its own"
    record_case("re-finalizing a record with token_provenance gives the same key")


def test_a_masked_rollout_carries_no_key(store) -> None:
    captured(store, 0, RolloutShape(turns=3, auxiliary_call=True))  # two roots
    record, _ = finalized(rollout_record(7, 0), store, "main_chain")
    assert record[MASK_SAMPLE_KEY] is True and TOKEN_PROVENANCE_KEY not in record
    made_up = {"schema_version": 1, "calls": {"made-up": {"start_weight_version": 99}}}
    arrived_masked = {**rollout_record(7, 0), MASK_SAMPLE_KEY: True}
    for delivery in DELIVERIES:
        for incoming in (rollout_record(7, 0), arrived_masked):
            record, _ = finalized({**incoming, TOKEN_PROVENANCE_KEY: made_up}, store, delivery)
            assert record[MASK_SAMPLE_KEY] is True and TOKEN_PROVENANCE_KEY not in record


def test_an_envelope_with_provenance_beside_it_passes_the_check_before_handoff(store) -> None:
    captured(store, 0, RolloutShape(turns=5))
    record, built = finalized(rollout_record(7, 0), store, "all_traces")
    envelope = record[ENVELOPE_KEY]
    assert TOKEN_PROVENANCE_KEY in record and TOKEN_PROVENANCE_KEY not in envelope
    assert tuple(envelope) == ENVELOPE_FIELDS, "the envelope stays version 1 exactly"
    for trace in envelope["traces"]:
        assert tuple(trace) == TRACE_FIELDS
        assert all(tuple(span) == SPAN_FIELDS for span in trace["sampled_spans"])
    check_envelope(envelope, "7-0")
    snapshot = built["_capture_snapshot"]
    outcome = RolloutOutcome(
        rollout_id="7-0", line=1, traces=len(envelope["traces"]), can_retire=True, **snapshot
    )
    part = orjson.dumps(record) + b"\n"
    receipt = HandoffReceipt(
        run_id="run",
        batch=0,
        receipt_key="batch-00000-0123456789abcdef",
        part_key="part",
        sha256="0" * 64,
        bytes=len(part),
        records=1,
        rollouts=[outcome],
    )
    assert retirable(receipt, part) == ([outcome], {}), "the verdict accepts the record"
    record_case("an envelope with token_provenance beside it passes the check before handoff")
