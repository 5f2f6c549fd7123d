"""Attack: a captured call's content items hold token arrays of their own.

`output_items` is a call's assistant content with the token arrays stripped, but a writer can
put an entry whose non-carrier item holds `prompt_token_ids`, `generation_token_ids` (never
generated) and log probs. Every delivered array comes from a call's own prompt, generation and
log probs: projection drops arrays from every content item and sets the carrier's from the
call, so those ids never train and one such call never fails a batch's rows.
Runs on local disk, memory and S3 (moto).
"""

from __future__ import annotations

import asyncio

import pytest

from capture_core.builder.trace_envelope import ENVELOPE_KEY
from capture_core.delivery import (
    capture_build_can_retire,
    finalize_rollout_token_capture,
    retire_rollout_token_capture,
)
from capture_core.records import TokenEntry
from capture_core.records.token_values import TOKEN_FIELDS
from capture_core.rows.trainer_rows import batch_rows, read_rows
from capture_core.store import TokenCaptureStore
from capture_core.testing.synthetic import RolloutShape, rollout_record, synthetic_rollout
from tests.support.reliability_figures import record_case
from tests.support.token_calls import NEVER_GENERATED, with_foreign_item

pytestmark = pytest.mark.integrity


def captured_with_foreign_items(store: TokenCaptureStore, rollout_id: str) -> list[TokenEntry]:
    """A 3-turn rollout whose last call carries a foreign item; the calls as captured."""
    calls = synthetic_rollout(rollout_id, RolloutShape(turns=3))
    calls[-1] = with_foreign_item(calls[-1])
    for call in calls:
        store.put_now(call)
    return calls


def delivered_arrays(record: dict) -> list[tuple[list, list, list]]:
    """Every (prompt, generation, log probs) a delivered record's response carries."""
    return [
        (item.get("prompt_token_ids"), item["generation_token_ids"], item["generation_log_probs"])
        for item in record["response"]["output"]
        if "generation_token_ids" in item
    ]


def test_arrays_inside_content_items_are_never_delivered(store: TokenCaptureStore) -> None:
    calls = captured_with_foreign_items(store, "3-4")
    record = rollout_record(3, 4)
    built = asyncio.run(finalize_rollout_token_capture(record, store))
    assert built is not None and built["mask_sample"] is False
    generations = [generation for _, generation, _ in delivered_arrays(record)]
    assert generations == [c.generation_token_ids for c in calls], "each call's own, once"
    log_probs = [lps for _, _, lps in delivered_arrays(record)]
    assert log_probs == [c.generation_log_probs for c in calls]
    foreign = [item for item in record["response"]["output"] if item["type"] == "reasoning"]
    assert foreign and not any(field in foreign[0] for field in TOKEN_FIELDS)
    rows = read_rows(batch_rows([(0, record, True)])).to_pylist()
    (row,) = rows
    last = calls[-1]
    assert row["token_ids"] == last.prompt_token_ids + last.generation_token_ids
    trained = [t for t, m in zip(row["token_ids"], row["loss_mask"], strict=True) if m]
    assert trained == [t for c in calls for t in c.generation_token_ids]
    assert capture_build_can_retire(built)
    assert asyncio.run(retire_rollout_token_capture("3-4", store, built))
    record_case(
        "main_chain: token arrays inside a call's content items never train",
        wrong_tokens_delivered=int(any(t in NEVER_GENERATED for t in trained)),
    )


def test_one_such_call_never_fails_the_batch_rows(store: TokenCaptureStore) -> None:
    """A batch of a healthy rollout and one whose call holds a foreign item: both train."""
    healthy = synthetic_rollout("3-5", RolloutShape(turns=2))
    for call in healthy:
        store.put_now(call)
    captured_with_foreign_items(store, "3-4")
    records = [rollout_record(3, 4), rollout_record(3, 5)]
    for record in records:
        built = asyncio.run(finalize_rollout_token_capture(record, store))
        assert built is not None and built["mask_sample"] is False
    rows = read_rows(batch_rows([(i, r, True) for i, r in enumerate(records)])).to_pylist()
    assert [row["rollout_id"] for row in rows] == ["3-4", "3-5"]
    assert not any(t in NEVER_GENERATED for row in rows for t in row["token_ids"])
    record_case("main_chain rows: one call with arrays in its content items fails no batch")


def test_all_traces_rows_never_hold_content_item_arrays(store: TokenCaptureStore) -> None:
    """The envelope is built from each call's own arrays; neither it nor the rows hold the
    item's, and the projection with `main_chain` of the same capture agrees."""
    calls = captured_with_foreign_items(store, "3-4")
    traced, chained = rollout_record(3, 4), rollout_record(3, 4)
    built = asyncio.run(finalize_rollout_token_capture(traced, store, delivery="all_traces"))
    assert built is not None and built["mask_sample"] is False
    rows = read_rows(batch_rows([(0, traced, False)])).to_pylist()
    trained = [
        t for row in rows for t, m in zip(row["token_ids"], row["loss_mask"], strict=True) if m
    ]
    assert trained == [t for c in calls for t in c.generation_token_ids]
    assert all(
        t not in NEVER_GENERATED for tr in traced[ENVELOPE_KEY]["traces"] for t in tr["token_ids"]
    )
    asyncio.run(finalize_rollout_token_capture(chained, store))
    assert [g for _, g, _ in delivered_arrays(chained)] == [c.generation_token_ids for c in calls]
