"""A put stores exactly what a freeze reads: an accepted put never becomes unreadable.

A put maps other systems' names for provenance (NeMo Gym #3419's `ng_generation_weight_version`
and the rest) and converts or refuses a field of the wrong type as a reader's validation does,
before it stamps a version (docs/async.md); then it judges the bytes it is about to store with
the reader's own function. So an entry the reader would refuse (an end before its start, two
names of one field that disagree, a field of the wrong type) is refused at the put, naming
the rollout, the call and the field, and nothing is stored. Each form on tokcap's store on
every backend (local, `memory://`, S3 on moto) and on NeMo Gym's file store; the NeMo Gym sink
path gives entries as mappings and as foreign models with `model_dump()`.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict

from capture_core.errors import InvalidRecordError
from capture_core.records import TokenEntry
from capture_core.records.provenance import INPUT_ALIASES, PROVENANCE_FIELDS
from capture_core.store import TokenCaptureStore
from capture_core.store.nemo_gym_store import NemoGymFileStore
from tests.support.backends import ALL_BACKENDS, store_location
from tests.support.reliability_figures import record_case

SOURCE_VERSION = 5
BASE: dict[str, Any] = {
    "rollout_id": "r1",
    "model_call_id": "c1",
    "prompt_token_ids": [1, 2, 3],
    "generation_token_ids": [4, 5],
    "generation_log_probs": [-0.5, -0.25],
}


class GymEntry(BaseModel):
    """NeMo Gym's `TokenEntry` as its sink hands it over: extras kept, dumped with them."""

    model_config = ConfigDict(extra="allow")
    rollout_id: str
    model_call_id: str
    prompt_token_ids: list[int]
    generation_token_ids: list[int]
    generation_log_probs: list[float]


Opener = Callable[..., Any]


@pytest.fixture(params=[*ALL_BACKENDS, "nemo_gym"])
def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> Opener:
    """Opens a fresh store of the kind (tokcap's on each backend, NeMo Gym's file store),
    stamping from a version source that holds `SOURCE_VERSION` when `source_given`."""
    source = tmp_path / "weight_version"
    source.write_text(f"{SOURCE_VERSION}\n")

    def opened(*, source_given: bool) -> Any:
        version_source = source if source_given else None
        if request.param == "nemo_gym":
            folder = tmp_path / f"gym-{uuid.uuid4().hex[:8]}"
            folder.mkdir()
            return NemoGymFileStore(folder, weight_version_source=version_source)
        root, options = store_location(request.param, request, tmp_path)
        root = root if request.param != "local" else f"{root}-{uuid.uuid4().hex[:8]}"
        return TokenCaptureStore(root, options, weight_version_source=version_source)

    return opened


def assigned(entry: TokenEntry, **extras: Any) -> TokenEntry:
    """`entry` with fields assigned after it was built (extras, or fields of another type)."""
    for name, value in extras.items():
        setattr(entry, name, value)
    return entry


# (form, entry to put, the provenance a freeze must read): aliases an entry of ours carries.
MAPPED: list[tuple[str, Callable[[], Any], dict[str, Any]]] = [
    (
        "start alias assigned after build",
        lambda: assigned(TokenEntry(**BASE), ng_generation_weight_version=9),
        {"start_weight_version": 9},
    ),
    (
        "unprefixed start alias assigned",
        lambda: assigned(TokenEntry(**BASE), generation_weight_version=9),
        {"start_weight_version": 9},
    ),
    (
        "end alias assigned",
        lambda: assigned(TokenEntry(**BASE), ng_generation_weight_version_end=9),
        {"end_weight_version": 9},
    ),
    (
        "per-token alias assigned",
        lambda: assigned(TokenEntry(**BASE), output_versions=[9, 9]),
        {"generation_weight_versions": [9, 9]},
    ),
    (
        "start and end aliases assigned",
        lambda: assigned(
            TokenEntry(**BASE),
            ng_generation_weight_version=9,
            ng_generation_weight_version_end=10,
            ng_generation_replica_id="r-2",
        ),
        {"start_weight_version": 9, "end_weight_version": 10, "replica": "r-2"},
    ),
    (
        "start alias through model_construct",
        lambda: TokenEntry.model_construct(**BASE, ng_generation_weight_version=9),
        {"start_weight_version": 9},
    ),
]


# Forms that read back as given before puts judged what they store (the NeMo Gym sink's).
MAPPED_BEFORE: list[tuple[str, Callable[[], Any], dict[str, Any]]] = [
    (
        "alias agreeing with its field",
        lambda: assigned(
            TokenEntry(**BASE, start_weight_version=9), ng_generation_weight_version=9
        ),
        {"start_weight_version": 9},
    ),
    (
        "start alias in a mapping (NeMo Gym sink)",
        lambda: {**BASE, "ng_generation_weight_version": 9},
        {"start_weight_version": 9},
    ),
    (
        "start alias on a NeMo Gym model (NeMo Gym sink)",
        lambda: GymEntry(**BASE, ng_generation_weight_version=9),
        {"start_weight_version": 9},
    ),
]


@pytest.mark.integrity
@pytest.mark.parametrize(("form", "make", "expected"), MAPPED, ids=[m[0] for m in MAPPED])
def test_a_version_under_another_name_is_mapped_at_put_and_not_stamped(
    open_store: Opener, form: str, make: Callable[[], Any], expected: dict[str, Any]
) -> None:
    """A version given under any name is a version the entry carries: the sink's stamp is
    skipped, as for tokcap's own names, and the entry reads back with it under tokcap's name."""
    _mapped_and_not_stamped(open_store(source_given=True), make(), expected)
    record_case(f"put judges another name for a version unlike the reader: {form}")


@pytest.mark.parametrize(
    ("form", "make", "expected"), MAPPED_BEFORE, ids=[m[0] for m in MAPPED_BEFORE]
)
def test_the_sinks_forms_of_another_name_are_mapped_and_not_stamped(
    open_store: Opener, form: str, make: Callable[[], Any], expected: dict[str, Any]
) -> None:
    _mapped_and_not_stamped(open_store(source_given=True), make(), expected)


def _mapped_and_not_stamped(store: Any, entry: Any, expected: dict[str, Any]) -> None:
    store.put_now(entry)
    snapshot = store.freeze_now("r1")
    assert not snapshot.incomplete, snapshot
    (read,) = snapshot.entries
    assert {name: getattr(read, name) for name in PROVENANCE_FIELDS} == {
        **dict.fromkeys(PROVENANCE_FIELDS),
        **expected,
    }, "mapped, and not stamped"
    assert not set(read.wire_dump()) & set(INPUT_ALIASES), "no alias key is stored"


# (form, entry to put, what the refusal names)
REFUSED: list[tuple[str, Callable[[], Any], str]] = [
    (
        "alias conflicting with its field",
        lambda: assigned(
            TokenEntry(**BASE, start_weight_version=3), ng_generation_weight_version=9
        ),
        "ng_generation_weight_version is 9 but start_weight_version is 3",
    ),
    (
        "two aliases of one field disagreeing",
        lambda: assigned(
            TokenEntry(**BASE), generation_weight_version=8, ng_generation_weight_version=9
        ),
        "ng_generation_weight_version is 9 but generation_weight_version is 8",
    ),
    (
        "start alias after the end",
        lambda: assigned(TokenEntry(**BASE, end_weight_version=5), ng_generation_weight_version=9),
        "end_weight_version 5 is before start_weight_version 9",
    ),
    (
        "per-token alias outside the call's versions",
        lambda: assigned(TokenEntry(**BASE, end_weight_version=5), output_versions=[9, 9]),
        "generation_weight_versions spans 9..9, outside",
    ),
    (
        "per-token alias of the wrong length",
        lambda: assigned(TokenEntry(**BASE), output_versions=[9]),
        "generation_weight_versions has 1 versions for 2 generated tokens",
    ),
    (
        "label assigned as a number",
        lambda: assigned(TokenEntry(**BASE), weight_version_label=3),
        "weight_version_label: Input should be a valid string",
    ),
    (
        "replica assigned as a number",
        lambda: assigned(TokenEntry(**BASE), replica=2),
        "replica: Input should be a valid string",
    ),
    (
        "model assigned as a number",
        lambda: assigned(TokenEntry(**BASE), model=5),
        "model: Input should be a valid string",
    ),
    (
        "an output item that is no dict",
        lambda: assigned(TokenEntry(**BASE), output_items=[1]),
        "output_items.0: Input should be a valid dictionary",
    ),
    (
        "a NaN capture time, which JSON stores as null",
        lambda: TokenEntry(**BASE, created_at=math.nan),
        "what it would store does not read back (created_at: Input should be a valid number)",
    ),
    (
        "an infinite capture time assigned",
        lambda: assigned(TokenEntry(**BASE), created_at=math.inf),
        "what it would store does not read back (created_at: Input should be a valid number)",
    ),
]


SOURCES = pytest.mark.parametrize(("source_given"), [False, True], ids=["no source", "source"])


@pytest.mark.integrity
@SOURCES
@pytest.mark.parametrize(("form", "make", "problem"), REFUSED, ids=[r[0] for r in REFUSED])
def test_an_entry_the_reader_would_refuse_is_refused_at_put(
    open_store: Opener, source_given: bool, form: str, make: Callable[[], Any], problem: str
) -> None:
    _refused_storing_nothing(open_store(source_given=source_given), make(), problem)
    record_case(f"put stores what the reader refuses: {form}")


@SOURCES
def test_aliases_conflicting_on_a_nemo_gym_model_are_refused_at_put(
    open_store: Opener, source_given: bool
) -> None:
    """The NeMo Gym sink's form, refused before the put judged what it stores, and still."""
    entry = GymEntry(**BASE, start_weight_version=3, ng_generation_weight_version=9)
    problem = "ng_generation_weight_version is 9 but start_weight_version is 3"
    _refused_storing_nothing(open_store(source_given=source_given), entry, problem)


def _refused_storing_nothing(store: Any, entry: Any, problem: str) -> None:
    with pytest.raises(InvalidRecordError) as raised:
        store.put_now(entry)
    message = str(raised.value)
    assert message.startswith("rollout r1: call 'c1' was refused at put: "), message
    assert problem in message and "Nothing was stored" in message, message
    snapshot = store.freeze_now("r1")
    assert snapshot.incomplete and not snapshot.entries, "nothing stored, the call is lost"


def test_a_field_the_reader_converts_is_stored_converted(open_store: Opener) -> None:
    """The reader would read `created_at` "7.5" as 7.5 and a response id 5 as none: the put
    stores what it would read, so the read entry is the stored one."""
    store = open_store(source_given=False)
    store.put_now(assigned(TokenEntry(**BASE), created_at="7.5", response_id=5))
    (read,) = store.freeze_now("r1").entries
    assert read.created_at == 7.5 and read.response_id is None
    assert "response_id" not in read.wire_dump() or read.wire_dump()["response_id"] is None


# -- the property: any accepted put freezes readable -----------------------------------------

VERSION = st.integers(min_value=0, max_value=12)
MAYBE = st.one_of(st.none(), VERSION)
NAMES = {
    "start_weight_version": [
        "start_weight_version",
        *sorted(a for a, f in INPUT_ALIASES.items() if f == "start_weight_version"),
    ],
    "end_weight_version": [
        "end_weight_version",
        *sorted(a for a, f in INPUT_ALIASES.items() if f == "end_weight_version"),
    ],
    "generation_weight_versions": ["generation_weight_versions", "output_versions"],
}


@st.composite
def provenance_forms(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any]]:
    """(fields given when the entry is built, fields assigned after): versions under any of
    their names, per-token lists of any shape, each given at build or assigned later."""
    built: dict[str, Any] = {}
    later: dict[str, Any] = {}
    for field, names in NAMES.items():
        for name in draw(st.lists(st.sampled_from(names), max_size=2, unique=True)):
            if field == "generation_weight_versions":
                value: Any = draw(st.one_of(st.none(), st.lists(VERSION, min_size=1, max_size=3)))
            else:
                value = draw(MAYBE)
            target = later if draw(st.booleans()) else built
            target[name] = value
    return built, later


@pytest.mark.integrity
@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(form=provenance_forms(), source_given=st.booleans(), as_mapping=st.booleans())
def test_any_accepted_put_freezes_readable(
    open_store: Opener,
    form: tuple[dict[str, Any], dict[str, Any]],
    source_given: bool,
    as_mapping: bool,
) -> None:
    """Whatever provenance an entry carries under whatever names, a put either refuses it
    (the call reported lost) or stores what a freeze reads back: never an unreadable capture.
    A version given under any name is not stamped; an entry without one is."""
    built, later = form
    store = open_store(source_given=source_given)
    rollout_id = f"r-{uuid.uuid4().hex[:12]}"
    try:
        entry: Any = TokenEntry(**{**BASE, "rollout_id": rollout_id}, **built)
    except ValueError:
        return  # refused when built: nothing reaches the store
    expected = _versions_carried(entry, later)
    entry = {**entry.wire_dump(), **later} if as_mapping else assigned(entry, **later)
    try:
        store.put_now(entry)
    except InvalidRecordError:
        snapshot = store.freeze_now(rollout_id)
        assert snapshot.incomplete and not snapshot.entries
        return
    snapshot = store.freeze_now(rollout_id)
    assert not snapshot.incomplete, snapshot
    (read,) = snapshot.entries
    if not any(value is not None for value in expected.values()) and source_given:
        expected["end_weight_version"] = SOURCE_VERSION  # stamped: it carried no version
    assert {name: getattr(read, name) for name in NAMES} == expected
    mapped = {name for name, value in later.items() if value is not None} & set(INPUT_ALIASES)
    assert not set(read.wire_dump()) & mapped, "stored under tokcap's names only"


def _versions_carried(entry: TokenEntry, later: dict[str, Any]) -> dict[str, Any]:
    """The versions an entry carries once `later` is assigned to it: tokcap's names replace
    the field, another system's name (not `None`) gives it when unset (a disagreeing one is
    refused at put, so its value does not matter here)."""
    carried = {name: getattr(entry, name) for name in NAMES}
    carried.update({name: value for name, value in later.items() if name in NAMES})
    for name, value in later.items():
        field = INPUT_ALIASES.get(name)
        if field in NAMES and value is not None and carried[field] is None:
            carried[field] = value
    return carried
