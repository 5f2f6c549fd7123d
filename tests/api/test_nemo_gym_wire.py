"""A NeMo Gym entry read by tokcap and written back is the entry NeMo Gym wrote.

`GymEntry` mirrors NeMo Gym 0.7.0's `TokenEntry` (its field names, defaults and order,
schema 1 with `response_id`); `OlderGymEntry` the seed revision's, before `response_id`
existed. Every record shape round-trips unchanged on the wire (`wire_dump`, what stores write)
and through `model_dump()` in Python and in JSON, both ways, and through every store: NeMo
Gym reads back an entry equal to the one it wrote. `model_dump()` is NeMo Gym's: every field,
defaults included, as the revision that wrote the record dumps it; `response_id` only when the
entry has one (or was given one). An entry carrying weight-version provenance under tokcap's
names (extras to NeMo Gym) round-trips too; one carrying NeMo Gym #3419's names is written
under tokcap's.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from pydantic import BaseModel, ConfigDict, Field, create_model

from capture_core.records import TokenEntry, token_entry_from_response
from capture_core.store import TokenCaptureStore
from capture_core.store.nemo_gym_store import NemoGymFileStore
from tests.support.reliability_figures import record_case

# NeMo Gym's schema-1 `TokenEntry` fields, in its order: (type, default); `...` is required.
GYM_FIELDS: dict[str, tuple[Any, Any]] = {
    "schema_version": (int, 1),
    "rollout_id": (str, ...),
    "model_call_id": (str, ...),
    "model": (str, ""),
    "prompt_token_ids": (list[int], ...),
    "generation_token_ids": (list[int], ...),
    "generation_log_probs": (list[float], ...),
    "routed_experts": (Any | None, None),
    "output_items": (list[dict], Field(default_factory=list)),
    "token_item_index": (int | None, None),
    "response_id": (str | None, None),
    "created_at": (float, 0.0),
}
EXTRA_ALLOWED = ConfigDict(extra="allow")
GymEntry = create_model("GymEntry", __config__=EXTRA_ALLOWED, **GYM_FIELDS)
OlderGymEntry = create_model(
    "OlderGymEntry",
    __config__=EXTRA_ALLOWED,
    **{name: spec for name, spec in GYM_FIELDS.items() if name != "response_id"},
)


REQUIRED = {
    "rollout_id": "3-4",
    "model_call_id": "c1",
    "prompt_token_ids": [1, 2, 3],
    "generation_token_ids": [4, 5],
    "generation_log_probs": [-0.5, -0.25],
}
ITEM = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "hi"}]}

# (name, NeMo Gym model that wrote it, the fields it was given)
SHAPES: list[tuple[str, type[BaseModel], dict[str, Any]]] = [
    (
        "full with extras",
        GymEntry,
        {
            **REQUIRED,
            "model": "policy",
            "routed_experts": [[0, 1], [2, 3]],
            "output_items": [ITEM],
            "token_item_index": 0,
            "response_id": "resp_1",
            "created_at": 12.5,
            "parent_call_id": "c0",
            "sampler": {"top_p": 0.9},
        },
    ),
    ("defaults only", GymEntry, dict(REQUIRED)),
    (
        "empty generation",
        GymEntry,
        {**REQUIRED, "generation_token_ids": [], "generation_log_probs": [], "output_items": []},
    ),
    ("no carrier index", GymEntry, {**REQUIRED, "output_items": [ITEM], "created_at": 3.0}),
    ("older record", OlderGymEntry, {**REQUIRED, "output_items": [ITEM], "token_item_index": 0}),
    (
        "weight-version provenance",
        GymEntry,
        {
            **REQUIRED,
            "output_items": [ITEM],
            "token_item_index": 0,
            "start_weight_version": 7,
            "end_weight_version": 8,
            "generation_weight_versions": [7, 8],
            "weight_version_label": "step-8",
            "replica": "replica-2",
        },
    ),
]
SHAPE_IDS = [name for name, _, _ in SHAPES]


def _written(model: type[BaseModel], fields: dict[str, Any]) -> dict[str, Any]:
    """What NeMo Gym writes: its model's whole dump."""
    return model(**fields).model_dump(mode="json")


@pytest.mark.parametrize(("name", "model", "fields"), SHAPES, ids=SHAPE_IDS)
def test_round_trip_is_the_identity_in_python(name: str, model: type, fields: dict) -> None:
    written = _written(model, fields)
    assert TokenEntry.model_validate(written).wire_dump() == written
    assert TokenEntry.model_validate(written).model_dump() == model(**fields).model_dump()


@pytest.mark.parametrize(("name", "model", "fields"), SHAPES, ids=SHAPE_IDS)
def test_round_trip_is_the_identity_in_json(name: str, model: type, fields: dict) -> None:
    text = model(**fields).model_dump_json()
    assert TokenEntry.model_validate_json(text).wire_dump() == orjson.loads(text)
    gym = model.model_validate_json(text).model_dump_json()
    assert TokenEntry.model_validate_json(text).model_dump_json() == gym


def test_a_record_without_optional_fields_is_written_without_them() -> None:
    sparse = dict(REQUIRED)
    assert TokenEntry.model_validate(sparse).wire_dump() == {"schema_version": 1, **sparse}


@pytest.mark.integrity
def test_model_dump_returns_nemo_gyms_fields_defaults_included() -> None:
    """Code written against NeMo Gym reads `entry.model_dump()["created_at"]` and the like."""
    dumped = TokenEntry.model_validate(dict(REQUIRED)).model_dump()
    assert dumped == OlderGymEntry(**REQUIRED).model_dump()
    assert list(dumped) == list(OlderGymEntry.model_fields)
    assert dumped["created_at"] == 0.0 and dumped["model"] == "" and dumped["output_items"] == []
    assert dumped["token_item_index"] is None and dumped["routed_experts"] is None
    record_case("TokenEntry.model_dump() omits NeMo Gym's default fields")


def test_a_served_response_without_an_id_writes_no_response_id() -> None:
    response = {"output": [{**ITEM, "prompt_token_ids": [1], **_generated()}]}
    entry = token_entry_from_response("3-4", "c1", response)
    assert entry is not None and "response_id" not in entry.wire_dump()
    assert "response_id" not in entry.model_dump()
    served = token_entry_from_response("3-4", "c1", {**response, "id": "resp_9"})
    assert served is not None and served.wire_dump()["response_id"] == "resp_9"


@pytest.mark.integrity
@pytest.mark.parametrize("fields", [dict(REQUIRED), {**REQUIRED, "output_items": [ITEM]}])
def test_the_seed_revisions_entry_round_trips_through_model_dump_both_ways(fields) -> None:
    """NeMo Gym's seed `TokenEntry` has no `response_id`: it would keep a `None` one as an
    extra, so NeMo Gym -> tokcap -> NeMo Gym is the identity only when tokcap's `model_dump()`
    of an entry without a response id carries none. Both ways, in Python and in JSON."""
    gym = OlderGymEntry(**fields)
    ours = TokenEntry.model_validate(gym.model_dump())
    assert "response_id" not in ours.model_dump() and "response_id" not in ours.model_dump_json()
    back = OlderGymEntry.model_validate(ours.model_dump())
    assert back.model_dump() == gym.model_dump() and not back.model_extra
    text = gym.model_dump_json()
    assert TokenEntry.model_validate_json(text).model_dump_json() == text
    assert (
        OlderGymEntry.model_validate_json(
            TokenEntry.model_validate_json(text).model_dump_json()
        ).model_dump_json()
        == text
    )
    # tokcap -> NeMo Gym -> tokcap: an entry tokcap built, with and without a served id.
    for served in ({}, {"response_id": "resp_1"}):
        built = TokenEntry(**fields, **served)
        again = TokenEntry.model_validate(
            OlderGymEntry.model_validate(built.model_dump()).model_dump()
        )
        assert again.model_dump() == built.model_dump() and again == built
        json_again = TokenEntry.model_validate_json(
            OlderGymEntry.model_validate_json(built.model_dump_json()).model_dump_json()
        )
        assert json_again.model_dump_json() == built.model_dump_json()
    assert TokenEntry(**fields, response_id="resp_1").model_dump()["response_id"] == "resp_1"
    record_case("NeMo Gym -> tokcap -> NeMo Gym through model_dump() adds response_id: None")


def _generated() -> dict[str, Any]:
    return {"generation_token_ids": [2], "generation_log_probs": [-0.1]}


@pytest.mark.parametrize(("name", "model", "fields"), SHAPES, ids=SHAPE_IDS)
def test_nemo_gym_reads_back_what_it_wrote_from_tokcaps_store(
    store: TokenCaptureStore, name: str, model: type, fields: dict
) -> None:
    written = _written(model, fields)
    store.put_now(TokenEntry.model_validate(written))
    (read,) = store.freeze_now("3-4").entries
    assert model.model_validate(read.wire_dump()) == model.model_validate(written)
    assert set(read.wire_dump()) <= set(written), "no key the entry never had"


@pytest.mark.parametrize(("name", "model", "fields"), SHAPES, ids=SHAPE_IDS)
def test_nemo_gym_file_store_lines_are_the_lines_nemo_gym_writes(
    tmp_path, name: str, model: type, fields: dict
) -> None:
    written = _written(model, fields)
    store = NemoGymFileStore(tmp_path)
    store.put_now(TokenEntry.model_validate(written))
    line = (tmp_path / "3-4.tokens.jsonl").read_bytes()
    assert line == orjson.dumps(written, option=orjson.OPT_SORT_KEYS) + b"\n"
    (read,) = store.freeze_now("3-4").entries
    assert read.wire_dump() == written


def test_schema_zero_survives_tokcaps_store(store: TokenCaptureStore) -> None:
    written = _written(GymEntry, {**REQUIRED, "schema_version": 0})
    store.put_now(TokenEntry.model_validate(written))
    (read,) = store.freeze_now("3-4").entries
    assert read.schema_version == 0
    assert GymEntry.model_validate(read.model_dump()) == GymEntry.model_validate(written)


def test_an_empty_response_id_reads_and_writes_back_as_null() -> None:
    """The one value not kept (docs/nemo-gym.md): a meaningless served id is no evidence."""
    written = _written(GymEntry, {**REQUIRED, "response_id": ""})
    assert TokenEntry.model_validate(written).model_dump()["response_id"] is None


@pytest.mark.parametrize("where", ["tokcap", "nemo_gym"])
def test_nemo_gym_3419_names_are_written_under_tokcaps_names(tmp_path, where: str) -> None:
    """What NeMo Gym's #3419 branch writes reads as provenance; stores write tokcap's names."""
    written = _written(
        GymEntry,
        {
            **REQUIRED,
            "ng_generation_replica_id": "replica-2",
            "ng_generation_weight_version": 7,
            "ng_generation_weight_version_end": 8,
            "ng_kv_cache_num_cached_tokens": 2,
        },
    )
    store = NemoGymFileStore(tmp_path) if where == "nemo_gym" else TokenCaptureStore(tmp_path)
    store.put_now(TokenEntry.model_validate(written))
    (read,) = store.freeze_now("3-4").entries
    renamed = {key: value for key, value in written.items() if not key.startswith("ng_generation_")}
    expected = {
        **renamed,
        "replica": "replica-2",
        "start_weight_version": 7,
        "end_weight_version": 8,
    }
    assert GymEntry.model_validate(read.wire_dump()) == GymEntry.model_validate(expected)
    assert set(read.wire_dump()) <= set(expected), "no alias key is kept"
    if where == "nemo_gym":
        line = (tmp_path / "3-4.tokens.jsonl").read_bytes()
        assert line == orjson.dumps(expected, option=orjson.OPT_SORT_KEYS) + b"\n"
