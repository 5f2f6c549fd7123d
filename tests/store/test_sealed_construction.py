"""A read builds each sealed entry without `model_construct`; it must be the same object."""

from __future__ import annotations

from typing import Any

import pytest

from capture_core.records import TokenEntry
from capture_core.store.checked_entries import _constructed

BASE: dict[str, Any] = {
    "schema_version": 1,
    "rollout_id": "r-0",
    "model_call_id": "call 1",
    "prompt_token_ids": [1, 2, 3],
    "generation_token_ids": [4, 5],
    "generation_log_probs": [-0.5, -1.25],
}


@pytest.mark.parametrize(
    "fields",
    [
        BASE,
        {**BASE, "model": "m", "output_items": [{"type": "message"}], "token_item_index": 0},
        {**BASE, "created_at": 2.5, "response_id": "resp", "replica": "a"},
        {**BASE, "zeta": {"kept": True}, "alpha": [1]},  # extras, in their order
        {"model_call_id": "c", **{k: v for k, v in BASE.items() if k != "model_call_id"}},
    ],
)
def test_a_sealed_entry_is_built_as_model_construct_builds_it(fields: dict[str, Any]) -> None:
    expected = TokenEntry.model_construct(set(fields), **fields)
    built = _constructed(dict(fields))
    assert list(built.__dict__.items()) == list(expected.__dict__.items())
    assert built.model_fields_set == expected.model_fields_set
    assert list((built.__pydantic_extra__ or {}).items()) == list(
        (expected.__pydantic_extra__ or {}).items()
    )
    assert built.model_dump_json() == expected.model_dump_json()
    assert built == expected


def test_defaults_built_by_a_factory_are_never_shared() -> None:
    first, second = _constructed(dict(BASE)), _constructed(dict(BASE))
    assert first.output_items == [] and first.output_items is not second.output_items
