"""Attacks on the pipeline through token arrays on records and inside captured content items.

A run's receipts decide retirement, so each case is checked end to end: what a part holds,
which rows train, which captures retire and which stay as evidence. Flows run against the
session's real Prefect server, on local disk and S3 (moto).
"""

from __future__ import annotations

import pytest

from capture_core.builder.trace_envelope import ENVELOPE_KEY
from capture_core.rows.trainer_rows import read_rows
from capture_core.storage import open_byte_store
from capture_core.store import TokenCaptureStore
from capture_core.testing.synthetic import rollout_record
from tests.support.pipeline_helpers import (
    batch_entries,
    dest_records,
    finalize_locations,
    rollout_ids,
    write_rollouts,
)
from tests.support.reliability_figures import record_case
from tests.support.token_calls import NEVER_GENERATED, with_foreign_item

pytestmark = [pytest.mark.integrity, pytest.mark.usefixtures("prefect_api")]

CARRIED = {"prompt_token_ids": [11, 12, 13], "generation_token_ids": [4, 5]}
LOG_PROBS = {"generation_log_probs": [-0.1, -0.2]}


def _capture(store: TokenCaptureStore, count: int, foreign: str | None = None) -> None:
    """Capture rollouts `7-0` ... ; the last call of `foreign` holds a foreign content item."""
    for i in range(count):
        rollout_id = f"7-{i}"
        calls = batch_entries(rollout_id)
        if rollout_id == foreign:
            calls[-1] = with_foreign_item(calls[-1])
        for call in calls:
            store.put_now(call)


def _chat_record(index: int, arrays: dict) -> dict:
    """A record whose Chat message carries `arrays` beside an empty `output` list."""
    record = rollout_record(7, index)
    message = {"role": "assistant", "content": "final answer", **arrays}
    record["response"] = {"output": [], "choices": [{"message": message}]}
    return record


def _rows(locations: dict, run_id: str) -> list[dict]:
    dest = open_byte_store(locations["dest"], locations["options"])
    keys = dest.list_prefix(f"{run_id}/rows")
    assert keys, "the run wrote its rows"
    return [row for key in keys for row in read_rows(dest.get(key) or b"").to_pylist()]


def test_main_chain_run_delivers_one_token_set_and_keeps_what_it_masks(locations) -> None:
    """7-1's Chat message carries sampled ids beside an empty `output`: unchanged, retired.
    7-2's carries a -100 pad: masked, its capture kept. 7-3 has a call whose content item
    holds ids never generated: it trains its own ids only, and the batch's rows are written."""
    options = locations["options"]
    store = TokenCaptureStore(locations["store"], options)
    _capture(store, 4, foreign="7-3")
    malformed = {**CARRIED, "generation_token_ids": [-100, 7], **LOG_PROBS}
    records = [
        rollout_record(7, 0),
        _chat_record(1, {**CARRIED, **LOG_PROBS}),
        _chat_record(2, malformed),
        rollout_record(7, 3),
    ]
    write_rollouts(locations["rollouts"], records, options)
    summary = finalize_locations(locations, "token-sets", batch_size=4, rows="parquet")
    assert (summary.handed_off, summary.masked, summary.retired) == (4, 1, 3)
    out = dest_records(locations["dest"], "token-sets", options)
    assert rollout_ids(out) == ["7-0", "7-1", "7-2", "7-3"]
    assert out[1]["response"] == records[1]["response"], "the sampled ids, left unchanged"
    assert out[2]["mask_sample"] is True and out[2]["response"] == records[2]["response"]
    assert [bool(store.read_entries(f"7-{i}")) for i in range(4)] == [False, False, True, False]
    rows = _rows(locations, "token-sets")
    assert sorted(row["rollout_id"] for row in rows) == ["7-0", "7-1", "7-3"]
    (carried,) = [row for row in rows if row["rollout_id"] == "7-1"]
    assert carried["token_ids"] == [11, 12, 13, 4, 5]
    foreign = [t for row in rows for t in row["token_ids"] if t in NEVER_GENERATED]
    record_case(
        "main_chain pipeline: Chat ids beside an output list, malformed ones, content arrays",
        wrong_tokens_delivered=len(foreign),
    )


def test_all_traces_run_masks_a_record_with_malformed_arrays_and_keeps_its_capture(
    locations,
) -> None:
    options = locations["options"]
    store = TokenCaptureStore(locations["store"], options)
    _capture(store, 2)
    records = [rollout_record(7, 0), rollout_record(7, 1)]
    records[1]["response"]["output"][0].update(
        {"prompt_token_ids": [-100, 7], "generation_token_ids": [8], "generation_log_probs": [-1]}
    )
    write_rollouts(locations["rollouts"], records, options)
    summary = finalize_locations(
        locations, "traces-malformed", batch_size=2, delivery="all_traces", rows="parquet"
    )
    assert (summary.handed_off, summary.masked, summary.retired) == (2, 1, 1)
    healthy, masked = dest_records(locations["dest"], "traces-malformed", options)
    assert ENVELOPE_KEY in healthy and not healthy.get("mask_sample")
    assert masked["mask_sample"] is True and ENVELOPE_KEY not in masked
    assert masked["response"] == records[1]["response"]
    assert [bool(store.read_entries(f"7-{i}")) for i in range(2)] == [False, True]
    assert {row["rollout_id"] for row in _rows(locations, "traces-malformed")} == {"7-0"}
    record_case(
        "all_traces pipeline: malformed arrays on the record mask it, capture kept",
        wrong_tokens_delivered=int(not masked.get("mask_sample")),
    )
