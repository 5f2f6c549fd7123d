"""Attack: a record whose items carry empty token arrays must not count as carrying tokens.

Such a record is finalized from its capture like any other, and its capture is retired only
when its captured tokens were delivered. Runs on local disk, memory and S3 (moto).
"""

from __future__ import annotations

import asyncio

import pytest

from capture_core.builder.build_result import TOKEN_CAPTURE_KEY
from capture_core.delivery import (
    capture_build_can_retire,
    finalize_rollout_token_capture,
    retire_rollout_token_capture,
    rollout_carries_token_ids,
)
from capture_core.testing.synthetic import RolloutShape, rollout_record, synthetic_rollout
from tests.support.reliability_figures import record_case

pytestmark = pytest.mark.integrity


def _empty_arrays_record(chat: bool) -> dict:
    record = rollout_record(3, 4)
    empty = {"prompt_token_ids": [], "generation_token_ids": [], "generation_log_probs": []}
    if chat:
        message = {"role": "assistant", "content": "final answer", **empty}
        record["response"] = {"object": "chat.completion", "choices": [{"message": message}]}
    else:
        record["response"]["output"][0].update(empty)
    return record


def _delivered_ids(record: dict) -> list[list[int]]:
    output = record["response"].get("output") or []
    return [item["generation_token_ids"] for item in output if item.get("generation_token_ids")]


@pytest.mark.parametrize("chat", [False, True], ids=["responses", "chat"])
def test_empty_token_arrays_are_finalized_from_the_capture(store, chat: bool) -> None:
    captured = synthetic_rollout("3-4", RolloutShape(turns=3))
    for entry in captured:
        store.put_now(entry)
    record = _empty_arrays_record(chat)
    assert not rollout_carries_token_ids(record)
    built = asyncio.run(finalize_rollout_token_capture(record, store))
    assert built is not None and built["mask_sample"] is False
    assert "_redundant_capture" not in built, "an empty list carries nothing"
    expected = [e.generation_token_ids for e in captured]
    delivered = _delivered_ids(record)
    assert delivered == expected, "the captured tokens are delivered"
    assert capture_build_can_retire(built)
    assert asyncio.run(retire_rollout_token_capture("3-4", store, built))
    wrong = 0 if delivered == expected else 1
    form = "chat" if chat else "responses"
    record_case(
        f"empty generation_token_ids finalized from the capture ({form})",
        records_lost=0,
        wrong_tokens_delivered=wrong,
    )


def test_empty_token_arrays_without_a_capture_mask_and_keep_evidence(store) -> None:
    store.mark_incomplete_now("3-4", "call-1", reason="model server timed out")
    record = _empty_arrays_record(chat=False)
    built = asyncio.run(finalize_rollout_token_capture(record, store))
    assert built["mask_sample"] and record["mask_sample"] is True
    assert record[TOKEN_CAPTURE_KEY]["error"] == "capture incomplete: model server timed out"
    assert not capture_build_can_retire(built)
    assert not asyncio.run(retire_rollout_token_capture("3-4", store, built))
    assert store.freeze_now("3-4").incomplete, "the evidence stays"
    record_case("empty generation_token_ids with no capture: masked, evidence kept")


def test_non_empty_token_arrays_still_win_over_the_capture(store) -> None:
    for entry in synthetic_rollout("3-4", RolloutShape(turns=2)):
        store.put_now(entry)
    record = _empty_arrays_record(chat=True)
    record["response"]["choices"][0]["message"]["generation_token_ids"] = [7]
    record["response"]["choices"][0]["message"]["generation_log_probs"] = [-0.1]
    assert rollout_carries_token_ids(record)
    built = asyncio.run(finalize_rollout_token_capture(record, store))
    assert built["_redundant_capture"] is True and "output" not in record["response"]
