"""Attack: token arrays already on a record are malformed, and the record is taken as carrying them.

Arrays on the record pass the validation of a captured call (one log prob per generated id,
ids non-negative integers, log probs finite, all three arrays present). Malformed ones mask
the rollout, with or without a capture, and the capture is kept as evidence: it is never
retired while the arrays on the record are malformed. Well-formed arrays on a Chat
Completions record are the policy's sampled ids: the record is a redundant capture, left
unchanged.
Runs on local disk, memory and S3 (moto).
"""

from __future__ import annotations

import asyncio
import copy
import math
from typing import Any

import pytest

from capture_core.builder.build_result import TOKEN_CAPTURE_KEY
from capture_core.builder.token_provenance import TOKEN_PROVENANCE_KEY
from capture_core.delivery import (
    capture_build_can_retire,
    finalize_rollout_token_capture,
    retire_rollout_token_capture,
    rollout_carries_token_ids,
)
from capture_core.rows.trainer_rows import record_rows, rows_table
from capture_core.store import TokenCaptureStore
from capture_core.testing.synthetic import RolloutShape, rollout_record, synthetic_rollout
from tests.support.reliability_figures import record_case
from tests.support.token_calls import token_call

pytestmark = pytest.mark.integrity

PROMPT = [11, 12, 13]
MALFORMED: dict[str, dict[str, Any]] = {
    "3 ids, 1 log prob": {"generation_token_ids": [1, 2, 3], "generation_log_probs": [-0.1]},
    "ids without log probs": {"generation_token_ids": [1, 2]},
    "null and negative ids": {"generation_token_ids": [None, -5], "generation_log_probs": [-1, -1]},
    "a negative id": {"generation_token_ids": [4, -5], "generation_log_probs": [-0.1, -0.2]},
    "a NaN log prob": {"generation_token_ids": [4], "generation_log_probs": [math.nan]},
    "no prompt ids": {"generation_token_ids": [4], "generation_log_probs": [-0.1], "prompt": 0},
}


def _carrying_record(arrays: dict[str, Any], chat: bool) -> dict:
    """A finished record whose one item carries `arrays` (with prompt ids unless `prompt: 0`)."""
    record = rollout_record(3, 4)
    fields = {k: v for k, v in arrays.items() if k != "prompt"}
    if arrays.get("prompt", 1):
        fields["prompt_token_ids"] = PROMPT
    if chat:
        message = {"role": "assistant", "content": "final answer", **fields}
        record["response"] = {"object": "chat.completion", "choices": [{"message": message}]}
    else:
        record["response"]["output"][0].update(fields)
    return record


def _where(chat: bool) -> str:
    return "response.choices[0].message" if chat else "response.output[0]"


@pytest.mark.parametrize("chat", [False, True], ids=["responses", "chat"])
@pytest.mark.parametrize("shape", sorted(MALFORMED))
def test_malformed_arrays_on_the_record_mask_and_keep_the_capture(
    store: TokenCaptureStore, shape: str, chat: bool
) -> None:
    for entry in synthetic_rollout("3-4", RolloutShape(turns=2)):
        store.put_now(entry)
    record = _carrying_record(MALFORMED[shape], chat)
    response = copy.deepcopy(record["response"])
    assert rollout_carries_token_ids(record), "the attack: a non-empty id array"
    built = asyncio.run(finalize_rollout_token_capture(record, store))
    assert built is not None and "_redundant_capture" not in built
    assert built["mask_sample"] is True and record["mask_sample"] is True
    error = record[TOKEN_CAPTURE_KEY]["error"]
    assert "token arrays on the record are malformed" in error and _where(chat) in error
    assert record["response"] == response, "nothing is rebuilt beside them"
    assert not capture_build_can_retire(built)
    assert not asyncio.run(retire_rollout_token_capture("3-4", store, built))
    assert len(store.read_entries("3-4")) == 2, "the capture stays as evidence"
    form = "chat" if chat else "responses"
    record_case(
        f"malformed token arrays on the record ({shape}, {form}): masked, capture kept",
        wrong_tokens_delivered=int(not record["mask_sample"]),
    )


@pytest.mark.parametrize("shape", sorted(MALFORMED))
def test_malformed_arrays_without_a_capture_mask_and_nothing_retires(
    store: TokenCaptureStore, shape: str
) -> None:
    record = _carrying_record(MALFORMED[shape], chat=False)
    built = asyncio.run(finalize_rollout_token_capture(record, store))
    assert built is not None and record["mask_sample"] is True
    error = record[TOKEN_CAPTURE_KEY]["error"]
    assert "token arrays on the record are malformed" in error and "response.output[0]" in error
    assert not capture_build_can_retire(built)
    record_case(
        f"malformed token arrays on the record ({shape}), no capture: masked",
        wrong_tokens_delivered=int(not record["mask_sample"]),
    )


def test_malformed_arrays_with_an_incomplete_capture_mask_and_keep_it(
    store: TokenCaptureStore,
) -> None:
    for entry in synthetic_rollout("3-4", RolloutShape(turns=2)):
        store.put_now(entry)
    store.mark_incomplete_now("3-4", "call-00002", reason="model server timed out")
    record = _carrying_record(MALFORMED["3 ids, 1 log prob"], chat=False)
    built = asyncio.run(finalize_rollout_token_capture(record, store))
    assert built is not None and record["mask_sample"] is True
    assert not capture_build_can_retire(built)
    assert not asyncio.run(retire_rollout_token_capture("3-4", store, built))
    assert len(store.freeze_now("3-4").entries) == 2, "the evidence stays"
    record_case("malformed token arrays on the record, incomplete capture: masked, kept")


def test_malformed_arrays_on_a_record_without_an_id_mask() -> None:
    record = _carrying_record(MALFORMED["null and negative ids"], chat=True)
    del record["_ng_task_index"], record["_ng_rollout_index"]
    built = asyncio.run(finalize_rollout_token_capture(record, TokenCaptureStore("memory://x")))
    assert built is not None and record["mask_sample"] is True
    assert "token arrays on the record are malformed" in record[TOKEN_CAPTURE_KEY]["error"]
    record_case("malformed token arrays on a record without an id: masked")


@pytest.mark.parametrize("chat", [False, True], ids=["responses", "chat"])
def test_well_formed_arrays_on_the_record_are_a_redundant_capture(
    store: TokenCaptureStore, chat: bool
) -> None:
    """A Chat Completions response carrying ids counts like a Responses one (NeMo Gym differs).

    The ids are what the policy sampled and take precedence over a reconstruction, so the
    record is left unchanged (no `output` is added beside its `choices`), and its frozen
    capture retires after handoff.
    """
    for entry in synthetic_rollout("3-4", RolloutShape(turns=2)):
        store.put_now(entry)
    arrays = {"generation_token_ids": [4, 5], "generation_log_probs": [-0.1, -0.2]}
    record = _carrying_record(arrays, chat)
    before = repr(record)
    built = asyncio.run(finalize_rollout_token_capture(record, store))
    assert built is not None and built["_redundant_capture"] is True
    assert built["mask_sample"] is False and built["rebuilt_response"] is None
    assert repr(record) == before, "left unchanged"
    assert asyncio.run(retire_rollout_token_capture("3-4", store, built))


def test_a_captured_call_with_a_negative_id_is_refused() -> None:
    with pytest.raises(ValueError, match="negative"):
        token_call("c", [1, -2], [3])
    with pytest.raises(ValueError, match="negative"):
        token_call("c", [1], [-3])


@pytest.mark.integrity
def test_versions_beside_token_ids_a_record_brought_are_not_trusted(
    store: TokenCaptureStore,
) -> None:
    """No capture vouches for a `token_provenance` beside ids the record brought itself: it is
    removed, so the rows say -1 (unknown) rather than a version nobody captured."""
    for entry in synthetic_rollout("3-4", RolloutShape(turns=2)):
        store.put_now(entry)
    arrays = {"generation_token_ids": [4, 5], "generation_log_probs": [-0.1, -0.2]}
    record = _carrying_record(arrays, chat=False)
    made_up = {"chain": ["zz"], "calls": {"zz": {"start_weight_version": 999}}}
    record[TOKEN_PROVENANCE_KEY] = made_up
    built = asyncio.run(finalize_rollout_token_capture(record, store))
    assert built is not None and built["_redundant_capture"] is True
    assert TOKEN_PROVENANCE_KEY not in record
    (row,) = rows_table(record_rows(record, 1)).to_pylist()
    assert set(row["weight_version"]) == {-1} and row["max_weight_version"] is None
    record_case("versions a record brought beside its own token ids are not trusted")
