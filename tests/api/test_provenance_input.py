"""Weight-version provenance on input: other systems' names, served labels, refusals at put.

NeMo Gym #3419 / NeMo RL #4146 names (with and without `ng_`), AReaL's `output_versions` and
SGLang's `metadata.weight_version` are read as tokcap's fields and written under tokcap's
names only (docs/async.md). Provenance that cannot be true is refused at put with one error
naming the call and the field, on every store.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from capture_core.errors import InvalidRecordError
from capture_core.records import TokenEntry, token_entry_from_response
from capture_core.records.provenance import INPUT_ALIASES, canonical_provenance
from capture_core.store import TokenCaptureStore
from capture_core.store.checked_entries import construct_sealed_entry
from capture_core.store.nemo_gym_store import NemoGymFileStore
from tests.support.backends import ALL_BACKENDS, store_location

BASE: dict[str, Any] = {
    "rollout_id": "r1",
    "model_call_id": "c1",
    "prompt_token_ids": [1, 2, 3],
    "generation_token_ids": [4, 5, 6],
    "generation_log_probs": [-0.5, -0.25, -0.125],
}


def fields(**extra: Any) -> dict[str, Any]:
    return {**BASE, **extra}


@pytest.mark.parametrize(
    ("alias", "value"),
    [
        ("ng_generation_weight_version", 7),
        ("generation_weight_version", 7),
        ("ng_generation_weight_version_end", 8),
        ("generation_weight_version_end", 8),
        ("ng_generation_replica_id", "replica-2"),
        ("generation_replica_id", "replica-2"),
        ("output_versions", [7, 7, 8]),
    ],
)
def test_each_input_alias_is_read_as_its_field_and_written_under_tokcaps_name(
    alias: str, value: Any
) -> None:
    entry = TokenEntry.model_validate(fields(**{alias: value}))
    name = INPUT_ALIASES[alias]
    assert getattr(entry, name) == value
    written = entry.wire_dump()
    assert written[name] == value and alias not in written
    assert alias not in (entry.__pydantic_extra__ or {})


def test_nemo_gyms_branch_entry_reads_with_every_field_mapped() -> None:
    """The keys NeMo Gym #3419's branch test sets on a TokenEntry (cache keys stay extras)."""
    branch = fields(
        ng_generation_replica_id="replica-2",
        ng_generation_weight_version=7,
        ng_generation_weight_version_end=8,
        ng_kv_cache_num_cached_tokens=2,
    )
    entry = TokenEntry.model_validate(branch)
    assert (entry.start_weight_version, entry.end_weight_version) == (7, 8)
    assert entry.replica == "replica-2"
    assert entry.wire_dump()["ng_kv_cache_num_cached_tokens"] == 2


@pytest.mark.parametrize(
    ("given", "problem"),
    [
        (
            {"ng_generation_weight_version": 7, "start_weight_version": 6},
            "ng_generation_weight_version is 7 but start_weight_version is 6",
        ),
        (
            {"ng_generation_weight_version_end": 8, "generation_weight_version_end": 9},
            "ng_generation_weight_version_end is 8 but generation_weight_version_end is 9",
        ),
        (
            {"generation_replica_id": "a", "replica": "b"},
            "generation_replica_id is 'a' but replica is 'b'",
        ),
        (
            {"output_versions": [1, 1, 2], "generation_weight_versions": [1, 2, 2]},
            "output_versions is [1, 1, 2] but generation_weight_versions is [1, 2, 2]",
        ),
        (
            {"metadata": {"weight_version": "v2"}, "weight_version_label": "v1"},
            "metadata.weight_version is 'v2' but weight_version_label is 'v1'",
        ),
    ],
)
def test_an_alias_disagreeing_with_its_field_is_refused_naming_both(
    given: dict[str, Any], problem: str
) -> None:
    with pytest.raises(ValidationError, match="call 'c1': " + _escaped(problem)):
        TokenEntry.model_validate(fields(**given))


def _escaped(text: str) -> str:
    import re

    return re.escape(text)


def test_an_alias_agreeing_with_its_field_is_accepted_once() -> None:
    entry = TokenEntry.model_validate(
        fields(ng_generation_weight_version=7, generation_weight_version=7, start_weight_version=7)
    )
    assert entry.start_weight_version == 7
    assert [k for k in entry.wire_dump() if "weight_version" in k] == ["start_weight_version"]


def test_an_alias_holding_none_says_nothing_and_is_written_back_as_it_came() -> None:
    """A NeMo Gym writer that emits its fields as null wrote an entry without provenance:
    read and written back, it is the entry it wrote."""
    nulls = {name: None for name in ("ng_generation_weight_version", "ng_generation_replica_id")}
    entry = TokenEntry.model_validate(fields(**nulls))
    assert entry.start_weight_version is None and "start_weight_version" not in entry.wire_dump()
    assert entry.wire_dump() == {"schema_version": 1, **fields(**nulls)}


def test_an_alias_is_checked_like_the_field_it_names() -> None:
    with pytest.raises(ValidationError, match="(?s)start_weight_version.*valid integer"):
        TokenEntry.model_validate(fields(ng_generation_weight_version=True))
    with pytest.raises(ValidationError, match="generation_weight_versions has 2 versions for 3"):
        TokenEntry.model_validate(fields(output_versions=[1, 2]))


def test_an_entry_without_aliases_is_passed_through_uncopied() -> None:
    plain = fields(start_weight_version=3, created_at=1.0, sampler={"top_p": 1})
    assert canonical_provenance(plain) is plain


def test_a_served_responses_weight_version_label_is_recorded_as_a_label() -> None:
    item = {
        "type": "message",
        "role": "assistant",
        "content": [],
        "prompt_token_ids": [1],
        "generation_token_ids": [2],
        "generation_log_probs": [-0.1],
    }
    served = {"id": "resp_1", "output": [item], "metadata": {"weight_version": "7"}}
    entry = token_entry_from_response("r1", "c1", served)
    assert entry is not None
    assert entry.weight_version_label == "7", "SGLang's label, kept as the engine's string"
    assert entry.start_weight_version is None and entry.end_weight_version is None
    unlabelled = token_entry_from_response(
        "r1", "c1", {**served, "metadata": {"weight_version": 7}}
    )
    assert unlabelled is not None and unlabelled.weight_version_label is None
    assert "weight_version_label" not in unlabelled.wire_dump()


def test_an_entry_extra_metadata_dict_gives_the_label_and_is_kept() -> None:
    entry = TokenEntry.model_validate(fields(metadata={"weight_version": "default", "x": 1}))
    assert entry.weight_version_label == "default"
    assert entry.wire_dump()["metadata"] == {"weight_version": "default", "x": 1}
    again = TokenEntry.model_validate(entry.wire_dump())
    assert again.wire_dump() == entry.wire_dump(), "reading back its own dump is the identity"


def test_a_sealed_read_of_aliased_or_mistyped_provenance_falls_back_to_validation() -> None:
    valid = {**fields(start_weight_version=1, end_weight_version=2), "schema_version": 1}
    built = construct_sealed_entry(valid)
    assert built is not None and built.end_weight_version == 2
    assert construct_sealed_entry({**fields(ng_generation_weight_version=1)}) is None
    for name, value in [
        ("start_weight_version", True),
        ("end_weight_version", 2.0),
        ("generation_weight_versions", (1, 1, 1)),
        ("weight_version_label", 7),
        ("replica", 2),
    ]:
        assert construct_sealed_entry({**valid, name: value}) is None, name
    assert construct_sealed_entry({**valid, "generation_weight_versions": [1, 2, 2]}) is not None
    assert construct_sealed_entry({**valid, "generation_weight_versions": [1, 3, 3]}) is None


# -- refused at put, naming the call and the field -------------------------------------------

BAD_PROVENANCE = [
    ("negative start", {"start_weight_version": -1}, "start_weight_version is -1"),
    ("negative end", {"end_weight_version": -2}, "end_weight_version is -2"),
    ("start beyond int32", {"start_weight_version": 2**31}, f"start_weight_version is {2**31}"),
    (
        "per-token beyond int32",
        {"generation_weight_versions": [2**31 - 1, 2**31 - 1, 2**31]},
        f"holds {2**31}, beyond the largest weight version",
    ),
    ("bool version", {"start_weight_version": True}, "start_weight_version: Input should be"),
    ("float version", {"end_weight_version": 1.5}, "end_weight_version: Input should be"),
    ("string version", {"end_weight_version": "7"}, "end_weight_version: Input should be"),
    (
        "end before start",
        {"start_weight_version": 5, "end_weight_version": 4},
        "end_weight_version 4 is before start_weight_version 5",
    ),
    (
        "per-token list too short",
        {"generation_weight_versions": [1, 1]},
        "generation_weight_versions has 2 versions for 3 generated tokens",
    ),
    (
        "per-token versions decreasing",
        {"generation_weight_versions": [2, 1, 1]},
        "generation_weight_versions decreases",
    ),
    (
        "per-token version below start",
        {"start_weight_version": 2, "generation_weight_versions": [1, 2, 2]},
        "generation_weight_versions spans 1..2, outside",
    ),
    (
        "per-token version after end",
        {"end_weight_version": 2, "generation_weight_versions": [2, 2, 3]},
        "generation_weight_versions spans 2..3, outside",
    ),
    (
        "per-token negative version",
        {"generation_weight_versions": [-1, 0, 0]},
        "generation_weight_versions spans -1..0",
    ),
    (
        "per-token bool version",
        {"generation_weight_versions": [0, True, 1]},
        "generation_weight_versions.1: Input should be",
    ),
]


@pytest.fixture(params=[*ALL_BACKENDS, "nemo_gym"])
def any_store(request: pytest.FixtureRequest, tmp_path) -> Any:
    """A fresh store: tokcap's on each backend, and NeMo Gym's file store (local only)."""
    if request.param == "nemo_gym":
        return NemoGymFileStore(tmp_path)
    return TokenCaptureStore(*store_location(request.param, request, tmp_path))


@pytest.mark.parametrize(
    ("what", "bad", "problem"), BAD_PROVENANCE, ids=[b[0] for b in BAD_PROVENANCE]
)
def test_bad_provenance_is_refused_at_put_naming_call_and_field(
    any_store: Any, what: str, bad: dict[str, Any], problem: str
) -> None:
    with pytest.raises(InvalidRecordError) as raised:
        any_store.put_now(fields(**bad))
    message = str(raised.value)
    assert message.startswith("rollout r1: call 'c1' was refused at put: "), message
    assert problem in message, message
    assert message.count("refused") == 1, "one error, said once"
    snapshot = any_store.freeze_now("r1")
    assert snapshot.incomplete and not snapshot.entries, "the call is reported lost"


def test_provenance_changed_after_the_entry_was_built_is_refused_at_put(store) -> None:
    entry = TokenEntry.model_validate(fields(start_weight_version=3))
    entry.end_weight_version = 2
    with pytest.raises(InvalidRecordError, match="call 'c1' was refused at put: end_weight_versi"):
        store.put_now(entry)
    assert store.freeze_now("r1").incomplete
