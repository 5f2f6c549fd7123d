"""Attack: a record's token arrays sit on a carrier finalize does not look at, or are malformed.

Token arrays may sit on a Responses `output` item or on a Chat `choices[*].message`, also when
the response has both an `output` list (even an empty one) and `choices`. Valid ids on either
carrier make the record a redundant capture, left unchanged; malformed arrays on any carrier
mask the rollout under either delivery, its capture kept as evidence; a rebuilt record carries
exactly one token set. Runs on local disk, memory and S3 (moto).
"""

from __future__ import annotations

import asyncio
import copy
import math
from typing import Any

import pytest

from capture_core.builder.build_result import TOKEN_CAPTURE_KEY
from capture_core.builder.trace_envelope import ENVELOPE_KEY
from capture_core.delivery import (
    capture_build_can_retire,
    finalize_rollout_token_capture,
    retire_rollout_token_capture,
    rollout_carries_token_ids,
)
from capture_core.records.token_values import TOKEN_FIELDS
from capture_core.store import TokenCaptureStore
from capture_core.testing.synthetic import RolloutShape, rollout_record, synthetic_rollout
from tests.support.reliability_figures import record_case

pytestmark = pytest.mark.integrity

PROMPT = [11, 12, 13]
VALID = {"prompt_token_ids": PROMPT, "generation_token_ids": [4, 5]}
VALID_LPS = {"generation_log_probs": [-0.1, -0.2]}
MALFORMED: dict[str, dict[str, Any]] = {
    "a -100 pad": {**VALID, "generation_token_ids": [-100, 7], **VALID_LPS},
    "a NaN log prob": {**VALID, "generation_log_probs": [-0.1, math.nan]},
    "a -100 prompt, empty generation": {
        "prompt_token_ids": [-100, 7],
        "generation_token_ids": [],
        "generation_log_probs": [],
    },
}
OUTPUTS = {"empty output": [], "content output": rollout_record(3, 4)["response"]["output"]}


def _chat_record(message_arrays: dict[str, Any], output: list[dict] | None) -> dict:
    """A finished record whose one Chat message carries `message_arrays`, beside `output`."""
    record = rollout_record(3, 4)
    message = {"role": "assistant", "content": "final answer", **message_arrays}
    response: dict[str, Any] = {"object": "chat.completion", "choices": [{"message": message}]}
    if output is not None:
        response["output"] = copy.deepcopy(output)
    record["response"] = response
    return record


def _capture(store: TokenCaptureStore) -> list:
    captured = synthetic_rollout("3-4", RolloutShape(turns=2))
    for entry in captured:
        store.put_now(entry)
    return captured


def _token_sets(response: dict) -> list[str]:
    """Which carrier kinds of a response hold any token array: `output`, `choices`."""
    kinds = []
    for kind, items in (
        ("output", response.get("output") or []),
        ("choices", [c.get("message") or {} for c in response.get("choices") or []]),
    ):
        if any(field in item for item in items for field in TOKEN_FIELDS):
            kinds.append(kind)
    return kinds


def _assert_masked_and_kept(record: dict, before: dict, built: dict, store, where: str) -> None:
    """Masked by name, the response as the harness wrote it, the capture kept and not retired."""
    assert built["mask_sample"] is True and record["mask_sample"] is True
    assert ENVELOPE_KEY not in record
    assert record["response"] == before["response"], "nothing is rebuilt beside the arrays"
    error = record[TOKEN_CAPTURE_KEY]["error"]
    assert "token arrays on the record are malformed" in error and where in error
    assert not capture_build_can_retire(built)
    assert not asyncio.run(retire_rollout_token_capture("3-4", store, built))
    assert len(store.read_entries("3-4")) == 2, "the capture stays as evidence"


@pytest.mark.parametrize("output", sorted(OUTPUTS))
def test_valid_message_ids_beside_an_output_list_leave_the_record_unchanged(
    store: TokenCaptureStore, output: str
) -> None:
    """An `output` list (even an empty one) does not hide ids a Chat message carries."""
    _capture(store)
    record = _chat_record({**VALID, **VALID_LPS}, OUTPUTS[output])
    before = copy.deepcopy(record)
    assert rollout_carries_token_ids(record)
    built = asyncio.run(finalize_rollout_token_capture(record, store))
    assert built is not None and built["_redundant_capture"] is True
    assert record == before, "left unchanged: one token set, the sampled one"
    assert _token_sets(record["response"]) == ["choices"]
    assert asyncio.run(retire_rollout_token_capture("3-4", store, built))
    record_case(
        f"main_chain: ids on a Chat message beside an {output} are the record's ids",
        wrong_tokens_delivered=int(record != before),
    )


@pytest.mark.parametrize("delivery", ["main_chain", "all_traces"])
@pytest.mark.parametrize("output", sorted(OUTPUTS))
@pytest.mark.parametrize("shape", sorted(MALFORMED))
def test_malformed_message_arrays_beside_an_output_list_mask_and_keep_the_capture(
    store: TokenCaptureStore, shape: str, output: str, delivery: str
) -> None:
    _capture(store)
    record = _chat_record(MALFORMED[shape], OUTPUTS[output])
    before = copy.deepcopy(record)
    built = asyncio.run(finalize_rollout_token_capture(record, store, delivery=delivery))
    assert built is not None
    _assert_masked_and_kept(record, before, built, store, "response.choices[0].message")
    record_case(
        f"{delivery}: malformed Chat message arrays ({shape}) beside an {output}: masked, kept",
        wrong_tokens_delivered=int(not record["mask_sample"]),
    )


@pytest.mark.parametrize("delivery", ["main_chain", "all_traces"])
@pytest.mark.parametrize("shape", sorted(MALFORMED))
def test_malformed_output_item_arrays_mask_and_keep_the_capture_under_either_delivery(
    store: TokenCaptureStore, shape: str, delivery: str
) -> None:
    """`all_traces` leaves `response` as the harness wrote it, so arrays there are delivered
    beside the envelope: malformed ones mask the rollout (as under `main_chain`), never
    beside a capture that retires."""
    _capture(store)
    record = rollout_record(3, 4)
    record["response"]["output"][0].update(MALFORMED[shape])
    before = copy.deepcopy(record)
    built = asyncio.run(finalize_rollout_token_capture(record, store, delivery=delivery))
    assert built is not None
    _assert_masked_and_kept(record, before, built, store, "response.output[0]")
    record_case(
        f"{delivery}: malformed output item arrays ({shape}): masked, capture kept",
        wrong_tokens_delivered=int(not record["mask_sample"]),
    )


def test_ids_on_output_items_and_on_chat_messages_are_two_token_sets_and_mask(
    store: TokenCaptureStore,
) -> None:
    """Which of two token sets the policy sampled cannot be told: the rollout masks."""
    _capture(store)
    output = [{"type": "message", "role": "assistant", **VALID, **VALID_LPS}]
    other = {**VALID, "generation_token_ids": [8, 9], **VALID_LPS}
    record = _chat_record(other, output)
    before = copy.deepcopy(record)
    built = asyncio.run(finalize_rollout_token_capture(record, store))
    assert built is not None
    _assert_masked_and_kept(record, before, built, store, "two token sets")
    record_case("main_chain: ids on output items and on Chat messages: masked, kept")


@pytest.mark.parametrize("output", [None, []], ids=["no output", "empty output"])
def test_a_rebuilt_record_carries_exactly_one_token_set(
    store: TokenCaptureStore, output: list | None
) -> None:
    """Empty arrays on a Chat message carry nothing; the rebuilt `output` is the one set."""
    captured = _capture(store)
    empty = {"prompt_token_ids": [], "generation_token_ids": [], "generation_log_probs": []}
    record = _chat_record(empty, output)
    built = asyncio.run(finalize_rollout_token_capture(record, store))
    assert built is not None and built["mask_sample"] is False
    assert _token_sets(record["response"]) == ["output"]
    delivered = [i["generation_token_ids"] for i in record["response"]["output"]]
    assert delivered == [e.generation_token_ids for e in captured]
    assert record["response"]["choices"][0]["message"]["content"] == "final answer"
    assert asyncio.run(retire_rollout_token_capture("3-4", store, built))
    record_case(
        "main_chain: a rebuilt Chat record keeps no arrays on its messages",
        wrong_tokens_delivered=int(_token_sets(record["response"]) != ["output"]),
    )
