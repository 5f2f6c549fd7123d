"""TokenEntry validation and token-field extraction (docs/contract.md, Records)."""

from __future__ import annotations

import math
import re
from decimal import Decimal

import numpy as np
import orjson
import pytest
from pydantic import ValidationError

from capture_core.errors import InvalidRecordError
from capture_core.records import (
    TOKEN_ENTRY_RECORD_SCHEMA_VERSION,
    TokenEntry,
    check_entry_consistency,
    coerce_token_entry,
    extract_token_fields,
    response_to_output_items,
    strip_token_fields,
    token_entry_from_response,
)
from capture_core.records.token_values import (
    FLOAT32_MAX,
    MAX_TOKEN_ID,
    TOKEN_FIELDS,
    all_finite,
    are_token_ids,
    float32_holds,
)
from capture_core.store.checked_entries import construct_sealed_entry, storable_entry
from tests.support.reliability_figures import record_case


def entry(**overrides: object) -> dict[str, object]:
    base: dict[str, object] = {
        "rollout_id": "r1",
        "model_call_id": "c1",
        "prompt_token_ids": [1, 2],
        "generation_token_ids": [3],
        "generation_log_probs": [-0.1],
    }
    return {**base, **overrides}


def test_defaults_match_schema_version_one() -> None:
    record = TokenEntry(**entry())
    assert record.schema_version == TOKEN_ENTRY_RECORD_SCHEMA_VERSION == 1
    assert (record.model, record.output_items, record.token_item_index) == ("", [], None)
    assert record.routed_experts is None and record.created_at == 0.0


def test_newer_schema_is_refused_with_what_to_do() -> None:
    with pytest.raises(ValidationError, match="newer than this reader supports.*upgrade"):
        TokenEntry(**entry(schema_version=2))


def test_older_schema_zero_is_read_and_round_trips() -> None:
    record = TokenEntry.model_validate(entry(schema_version=0))
    assert record.schema_version == 0
    assert TokenEntry.model_validate_json(record.model_dump_json()) == record
    assert coerce_token_entry(record.model_dump()).schema_version == 0
    with pytest.raises(ValidationError, match="versions start at 0"):
        TokenEntry(**entry(schema_version=-1))


def test_mismatched_token_and_log_prob_lengths_are_refused() -> None:
    with pytest.raises(ValidationError, match="2 ids but generation_log_probs has 1"):
        TokenEntry(**entry(generation_token_ids=[3, 4]))


def test_token_item_index_must_index_output_items() -> None:
    with pytest.raises(ValidationError, match="token_item_index 1 does not index"):
        TokenEntry(**entry(output_items=[{"type": "message"}], token_item_index=1))
    assert TokenEntry(**entry(output_items=[{"type": "message"}], token_item_index=0))


def test_non_finite_log_probs_are_refused() -> None:
    with pytest.raises(ValidationError, match="NaN or infinite"):
        TokenEntry(**entry(generation_log_probs=[float("-inf")]))
    with pytest.raises(ValidationError, match="NaN or infinite"):
        TokenEntry(**entry(generation_token_ids=[3, 4], generation_log_probs=[-math.inf, math.inf]))


@pytest.mark.integrity
@pytest.mark.parametrize("beyond", [-1e39, 1e39, -3.5e38, -1e308])
def test_a_log_prob_float32_cannot_hold_is_refused_by_name(beyond: float) -> None:
    """Finite as a float64, an infinity in the float32 trainer rows: no finite log prob."""
    with np.errstate(over="ignore"):
        assert math.isfinite(beyond) and not np.isfinite(np.float32(beyond))
    with pytest.raises(ValidationError, match="generation_log_probs.*beyond float32's range"):
        TokenEntry(**entry(generation_token_ids=[3, 4], generation_log_probs=[-0.5, beyond]))
    assert not all_finite([-0.5, beyond])
    built = TokenEntry(**entry())
    built.generation_log_probs[0] = beyond
    with pytest.raises(InvalidRecordError, match="call 'c1': generation_log_probs.*float32"):
        check_entry_consistency(built)
    record_case(f"log prob {beyond:g}: finite as float64, beyond float32, refused by name")


def test_log_probs_float32_holds_are_finite_down_to_underflow() -> None:
    """Float32's largest magnitude (and what rounds to it) is kept; a value too small for
    float32 becomes 0 or a subnormal there, a log prob of about 0: harmless, accepted."""
    held = [-FLOAT32_MAX, -3.4028235e38, -1e-50, -5e-45, 0.0, -1]
    assert all_finite(held) and float32_holds(held)
    assert np.isfinite(np.asarray(held, dtype=np.float32)).all()
    assert TokenEntry(**entry(generation_token_ids=[3] * 6, generation_log_probs=held))
    assert not float32_holds([-3.402824e38]), "rounds to an infinity in float32"


def test_a_log_prob_no_float_can_hold_is_not_finite() -> None:
    """As stdlib `json` parses a 400-digit number: refused by name, not `OverflowError`."""
    assert not all_finite([-0.5, -(10**400)])
    assert not all_finite([10**400, -(10**400), -0.5]), "no cancelling out unseen"
    assert all_finite([0, -1, True, -0.5]), "integers a float holds are finite numbers"
    built = TokenEntry.model_construct(**entry(generation_log_probs=[10**400]))
    with pytest.raises(InvalidRecordError, match="NaN or infinite"):
        check_entry_consistency(built)


@pytest.mark.parametrize(
    "ids", [[], [0, 5], [True, 2], [np.int64(7)], [np.uint64(2**63 - 1)], list(range(3000))]
)
def test_token_ids_are_integers_from_zero_to_the_int64_maximum(ids: list) -> None:
    assert are_token_ids(ids)
    assert are_token_ids([*ids, MAX_TOKEN_ID])


@pytest.mark.parametrize(
    "ids",
    [
        [-100],
        [1, -1],
        [1.5],
        [1.0],
        ["3"],
        [None],
        [2**70, -1],
        (1, 2),
        None,
        [[1]],
        [2**63],
        [5, 2**64 - 1],
        [np.uint64(2**63)],
    ],
)
def test_anything_else_is_no_list_of_token_ids(ids: object) -> None:
    assert not are_token_ids(ids)


@pytest.mark.integrity
@pytest.mark.parametrize(
    ("what", "change", "problem"),
    [
        (
            "a -100 pad and its log prob appended",
            lambda e: (e.generation_token_ids.append(-100), e.generation_log_probs.append(-0.5)),
            "generation_token_ids holds -100 at position 1",
        ),
        ("a -100 pad in the prompt", lambda e: e.prompt_token_ids.append(-100), "prompt_token_ids"),
        ("an id appended alone", lambda e: e.generation_token_ids.append(5), "has 2 ids but"),
        ("a NaN log prob", lambda e: e.generation_log_probs.__setitem__(0, math.nan), "NaN"),
        ("a text id", lambda e: e.generation_token_ids.__setitem__(0, "7"), "holds '7'"),
        ("a float id", lambda e: e.generation_token_ids.__setitem__(0, 7.5), "holds 7.5"),
        ("ids reassigned to a tuple", lambda e: setattr(e, "prompt_token_ids", (1, 2)), "tuple"),
        (
            "log probs reassigned to None",
            lambda e: setattr(e, "generation_log_probs", None),
            "None",
        ),
    ],
)
def test_an_entry_changed_after_it_was_built_is_not_storable(what: str, change, problem) -> None:
    built = TokenEntry(**entry())
    change(built)
    with pytest.raises(InvalidRecordError, match=f"call 'c1': .*{re.escape(problem)}"):
        storable_entry(built)
    record_case(f"entry changed after it was built, checked before storing: {what}")


def test_what_a_put_stores_is_a_checked_copy_the_caller_cannot_change() -> None:
    built = TokenEntry(**entry(future_field=1))
    stored, prompt_ids, _ = storable_entry(built)
    assert stored == built and stored.model_fields_set == built.model_fields_set
    assert prompt_ids is not None and prompt_ids.tolist() == [1, 2], "the prompt as checked"
    built.generation_token_ids.append(-100)
    built.generation_log_probs.append(-0.5)
    assert (stored.generation_token_ids, stored.generation_log_probs) == ([3], [-0.1])
    mapped, none, _ = storable_entry(entry())
    assert mapped == TokenEntry(**entry()) and none is None, "validated into lists of its own"
    with pytest.raises(InvalidRecordError, match="generation_token_ids"):
        storable_entry(entry(generation_token_ids=[-100]))


@pytest.mark.parametrize("bad", [None, "-0.5", Decimal("-0.5")])
def test_a_log_prob_reassigned_to_no_number_is_refused_by_name(bad: object) -> None:
    """Assignment skips validation; the cross-field check names the field, never `TypeError`."""
    built = TokenEntry(**entry())
    built.generation_log_probs = [bad]
    with pytest.raises(InvalidRecordError, match="one that is no number"):
        check_entry_consistency(built)


def test_unknown_fields_round_trip_unchanged() -> None:
    record = TokenEntry(**entry(future_field={"nested": [1, 2]}, sampler="top_p"))
    again = TokenEntry.model_validate(orjson.loads(record.model_dump_json()))
    assert again.model_dump() == record.model_dump()
    assert again.model_dump()["future_field"] == {"nested": [1, 2]}


def test_coerce_accepts_foreign_models_and_mappings_and_revalidates() -> None:
    class Foreign:
        def model_dump(self) -> dict[str, object]:
            return entry(model_call_id="foreign")

    assert coerce_token_entry(Foreign()).model_call_id == "foreign"
    assert coerce_token_entry(entry()).rollout_id == "r1"
    with pytest.raises(ValidationError):
        coerce_token_entry(entry(generation_log_probs=[]))
    with pytest.raises(TypeError, match="model_dump"):
        coerce_token_entry(42)


def test_extract_from_responses_output_item() -> None:
    response = {
        "output": [
            {"type": "reasoning", "summary": []},
            {"type": "message", "content": [], **{f: [1] for f in TOKEN_FIELDS[:3]}},
        ]
    }
    fields = extract_token_fields(response_json=response)
    assert fields is not None and set(fields) == set(TOKEN_FIELDS)
    assert fields["routed_experts"] is None
    items, index = strip_token_fields(items=response_to_output_items(payload=response))
    assert index == 1 and all("prompt_token_ids" not in item for item in items)


def test_extract_from_chat_completions_message() -> None:
    message = {
        "role": "assistant",
        "content": "hi",
        "prompt_token_ids": [1],
        "generation_token_ids": [2],
        "generation_log_probs": [-1.0],
        "routed_experts": [[0]],
    }
    fields = extract_token_fields({"choices": [{"message": message}]})
    assert fields == {
        "prompt_token_ids": [1],
        "generation_token_ids": [2],
        "generation_log_probs": [-1.0],
        "routed_experts": [[0]],
    }
    items, index = strip_token_fields(response_to_output_items({"choices": [{"message": message}]}))
    assert index == 0
    assert items == [{"role": "assistant", "content": "hi", "type": "message"}]


def test_extract_none_missing_and_two_carriers() -> None:
    assert extract_token_fields({"output": [{"type": "message"}]}) is None
    assert extract_token_fields({"output": [{"type": "message", "prompt_token_ids": None}]}) is None
    with pytest.raises(ValueError, match="lacks \\['generation_log_probs'\\]"):
        extract_token_fields({"output": [{"prompt_token_ids": [1], "generation_token_ids": [2]}]})
    carrier = {f: [1] for f in TOKEN_FIELDS[:3]}
    with pytest.raises(ValueError, match="exactly one item may carry"):
        extract_token_fields({"output": [carrier, dict(carrier)]})


def test_strip_and_build_entry_from_response() -> None:
    item = {"type": "message", "content": [{"text": "x"}], **{f: [1] for f in TOKEN_FIELDS[:3]}}
    assert strip_token_fields([item, {"type": "reasoning"}]) == (
        [{"type": "message", "content": [{"text": "x"}]}, {"type": "reasoning"}],
        0,
    )
    with pytest.raises(ValueError, match="exactly one item may carry"):
        strip_token_fields([item, dict(item)])
    built = token_entry_from_response("r1", "c1", {"model": "m", "output": [item]})
    assert built is not None and built.model == "m" and built.token_item_index == 0
    assert built.output_items == [{"type": "message", "content": [{"text": "x"}]}]
    assert token_entry_from_response("r1", "c1", {"output": [{"type": "message"}]}) is None


def test_carrier_index_counts_only_content_items() -> None:
    """A non-item entry in `output` is dropped from the content, so the index skips it."""
    carrier = {"type": "message", **{f: [1] for f in TOKEN_FIELDS[:3]}}
    built = token_entry_from_response("r1", "c1", {"output": ["junk", carrier]})
    assert built is not None and built.token_item_index == 0
    assert built.output_items == [{"type": "message"}]


def test_null_token_fields_on_every_item_carry_nothing() -> None:
    """A serializer that writes the token fields as null on every item: no carrier, as in Gym."""
    nulls = {f: None for f in TOKEN_FIELDS}
    carrier = {"type": "message", **{f: [1] for f in TOKEN_FIELDS[:3]}}
    response = {"output": [{"type": "reasoning", **nulls}, carrier]}
    built = token_entry_from_response("r1", "c1", response)
    assert built is not None and built.token_item_index == 1
    assert extract_token_fields({"output": [{"type": "message", **nulls}] * 2}) is None


def test_a_sealed_entry_is_built_as_validation_builds_it() -> None:
    fields = entry(
        schema_version=0,
        model="m",
        output_items=[{"type": "message"}],
        token_item_index=0,
        response_id="resp-1",
        created_at=2.5,
        sampler={"top_p": 0.9},
    )
    built, validated = construct_sealed_entry(dict(fields)), TokenEntry.model_validate(fields)
    assert built is not None and built == validated
    assert built.model_fields_set == validated.model_fields_set
    assert built.model_dump_json() == validated.model_dump_json()
    bare = construct_sealed_entry(entry())
    assert bare is not None and bare.model_dump() == TokenEntry(**entry()).model_dump()


@pytest.mark.parametrize(
    "overrides",
    [
        {"created_at": 3},  # validation converts it to a float
        {"token_item_index": True},
        {"response_id": ""},  # validation reads it as None
        {"model_call_id": 7},
        {"generation_log_probs": (-0.1,)},
        {"output_items": ["text"]},
        {"generation_log_probs": [-0.1, -0.2]},
        {"generation_log_probs": [math.nan]},
        {"token_item_index": 0},  # no output item to index
        {"schema_version": 2},
        {"prompt_token_ids": None},
        {"_fields_set": ["x"]},  # an extra named like `model_construct`'s own parameter
    ],
)
def test_a_sealed_entry_of_another_shape_is_left_to_validation(overrides: dict) -> None:
    assert construct_sealed_entry(entry(**overrides)) is None
    fields = entry(**overrides)
    del fields["rollout_id"]
    assert construct_sealed_entry(fields) is None
