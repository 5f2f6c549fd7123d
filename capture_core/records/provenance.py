"""Which weights sampled a call: the weight-version provenance a captured call may carry.

A call may record the trainer version whose weights were loaded when the request was
admitted (`start_weight_version`) and when it finished (`end_weight_version`), one version
per generated token when a generation spanned a weight update
(`generation_weight_versions`), the engine's own label (`weight_version_label`) and the
serving instance (`replica`). All are optional: a call without them has no provenance, and
nothing here invents one. Per-token versions are stored and delivered as runs
`[[version, count], ...]`, a handful of numbers for a generation of thousands of tokens.
Other systems' names for the same facts are accepted on input (`canonical_provenance`) and
written under these names only (docs/async.md).
This module imports only `errors`.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

from capture_core.errors import InvalidRecordError

VERSION_FIELDS = ("start_weight_version", "end_weight_version")
PROVENANCE_FIELDS = (
    *VERSION_FIELDS,
    "generation_weight_versions",
    "weight_version_label",
    "replica",
)
"""The optional `TokenEntry` fields of provenance, in their order on the record."""
RUNS_KEY = "generation_weight_versions"
MAX_WEIGHT_VERSION = 2**31 - 1
"""The largest weight version: trainer rows hold versions as int32."""
LABEL_FIELD = "weight_version_label"

INPUT_ALIASES: dict[str, str] = {
    "ng_generation_weight_version": "start_weight_version",
    "generation_weight_version": "start_weight_version",
    "ng_generation_weight_version_end": "end_weight_version",
    "generation_weight_version_end": "end_weight_version",
    "ng_generation_replica_id": "replica",
    "generation_replica_id": "replica",
    "output_versions": RUNS_KEY,
}
"""Input names other systems give provenance fields (NeMo Gym #3419 and NeMo RL #4146 with
and without their `ng_` prefix, AReaL's per-token `output_versions`) -> tokcap's name."""
SERVED_METADATA = "metadata"
"""A served response's (and an entry extra's) metadata dict; its `weight_version` is the
engine's label (SGLang), never a trainer version."""
_INPUT_KEYS = frozenset({*INPUT_ALIASES, SERVED_METADATA})


def version_runs(versions: Sequence[int]) -> list[list[int]]:
    """Per-token versions as runs `[[version, count], ...]`, in order."""
    return [[version, sum(1 for _ in run)] for version, run in itertools.groupby(versions)]


def expand_runs(runs: Sequence[Sequence[int]]) -> list[int]:
    """Runs `[[version, count], ...]` back to one version per token."""
    expanded: list[int] = []
    for version, count in runs:
        expanded.extend(itertools.repeat(version, count))
    return expanded


def canonical_provenance(data: Mapping[str, Any]) -> Mapping[str, Any]:
    """Input fields with other systems' provenance names mapped to tokcap's.

    Returns `data` itself when it holds none of them (one set test: a put's hot path),
    else a copy without the alias keys and with the canonical fields set. An alias whose
    value is `None` says nothing. A `metadata` dict's string `weight_version` becomes
    `weight_version_label`; the `metadata` field itself is kept as it was. An alias that
    disagrees with the canonical field (or with another alias of it) is refused by name.
    """
    if not input_names_to_map(data):
        return data
    found = data.keys() & _INPUT_KEYS
    fields = dict(data)
    given = {name: name for name in PROVENANCE_FIELDS if fields.get(name) is not None}
    for key in sorted(found):
        if key == SERVED_METADATA:
            _set_once(fields, given, LABEL_FIELD, served_label(fields[key]), "metadata")
        elif fields[key] is not None:  # a null alias says nothing and is kept as it was
            _set_once(fields, given, INPUT_ALIASES[key], fields.pop(key), key)
    return fields


def input_names_to_map(data: Mapping[str, Any]) -> bool:
    """Whether `data` holds a name `canonical_provenance` maps (one set intersection)."""
    return not data.keys().isdisjoint(_INPUT_KEYS)


def served_label(metadata: Any) -> str | None:
    """The engine's weight-version label in a served `metadata` dict (SGLang's
    `metadata.weight_version`), or `None`: a label that is not a string is not one."""
    if isinstance(metadata, Mapping):
        label = metadata.get("weight_version")
        if isinstance(label, str):
            return label
    return None


def _set_once(
    fields: dict[str, Any], given: dict[str, str], name: str, value: Any, source: str
) -> None:
    if value is None:
        return
    if name not in given:
        fields[name], given[name] = value, source
        return
    if fields[name] != value or type(fields[name]) is not type(value):
        where = "metadata.weight_version" if source == SERVED_METADATA else source
        first = "metadata.weight_version" if given[name] == SERVED_METADATA else given[name]
        call = fields.get("model_call_id")
        raise InvalidRecordError(
            f"{f'call {call!r}: ' if isinstance(call, str) else ''}{where} is {value!r} but "
            f"{first} is {fields[name]!r}; both name {name} (tokcap docs async), so give one of "
            "them or make them agree"
        )


def generated_versions(entry: Any) -> list[int] | None:
    """The sampling version of each generated token, or `None` when the call has none.

    `generation_weight_versions` when captured; else the start version for every token
    (the oldest weights that may have sampled it: the safe bound for staleness); else the
    end version (what a sink stamps when the request did not say); else `None`.
    """
    per_token = getattr(entry, "generation_weight_versions", None)
    if per_token is not None:
        return list(per_token)
    known = getattr(entry, "start_weight_version", None)
    if known is None:
        known = getattr(entry, "end_weight_version", None)
    if known is None:
        return None
    return [known] * len(entry.generation_token_ids)


def call_provenance(entry: Any) -> dict[str, Any] | None:
    """The call's provenance as records deliver it, or `None` when it carries none: the set
    fields by name, per-token versions as runs."""
    found: dict[str, Any] = {}
    for name in PROVENANCE_FIELDS:
        value = getattr(entry, name, None)
        if value is not None:
            found[name] = version_runs(value) if name == RUNS_KEY else value
    return found or None


def check_provenance(entry: Any) -> None:
    """Refuse provenance that cannot be true, naming the call and the field: a version that
    is not a non-negative integer, an end before the start, a per-token list whose length is
    not the generation's, that decreases, or that leaves [start, end]."""
    call = f"call {entry.model_call_id!r}"
    for name in VERSION_FIELDS:
        _check_version(call, name, getattr(entry, name, None))
    start, end = entry.start_weight_version, entry.end_weight_version
    if start is not None and end is not None and end < start:
        raise InvalidRecordError(
            f"{call}: end_weight_version {end} is before start_weight_version {start}; the "
            "weights a request finished with cannot be older than those it was admitted with"
        )
    per_token = entry.generation_weight_versions
    if per_token is not None:
        _check_per_token(call, per_token, len(entry.generation_token_ids), start, end)


def _check_version(call: str, name: str, value: Any) -> None:
    if value is not None and (type(value) is not int or not 0 <= value <= MAX_WEIGHT_VERSION):
        raise InvalidRecordError(
            f"{call}: {name} is {value!r}; a weight version is the trainer's version number, "
            f"an integer from 0 to {MAX_WEIGHT_VERSION} (trainer rows hold it as int32; put an "
            "engine's own label in weight_version_label)"
        )


def _check_per_token(
    call: str, versions: Any, generated: int, start: int | None, end: int | None
) -> None:
    field = f"{call}: generation_weight_versions"
    if type(versions) is not list or not all(type(v) is int for v in versions):
        raise InvalidRecordError(f"{field} must be a list of integers, one per generated token")
    if len(versions) != generated:
        raise InvalidRecordError(
            f"{field} has {len(versions)} versions for {generated} generated tokens; give one "
            "version per generated token"
        )
    if not versions:
        return
    low, high = versions[0], versions[-1]
    if versions != sorted(versions):
        raise InvalidRecordError(
            f"{field} decreases; a generation's weights only move forward, so versions must "
            "be non-decreasing"
        )
    if high > MAX_WEIGHT_VERSION:
        raise InvalidRecordError(
            f"{field} holds {high}, beyond the largest weight version {MAX_WEIGHT_VERSION} "
            "(trainer rows hold versions as int32)"
        )
    if low < 0 or (start is not None and low < start) or (end is not None and high > end):
        raise InvalidRecordError(
            f"{field} spans {low}..{high}, outside the call's versions "
            f"[{start if start is not None else 0}, {end if end is not None else 'open'}]"
        )
