"""Trainer rows' weight versions: which weights sampled each position, from `token_provenance`.

A row's `weight_version` holds one int32 per position: the sampling version of each
generated token as the record's `token_provenance` key delivers it, and `NO_WEIGHT_VERSION`
(-1) at prompt positions and at generated positions of unknown version (a call without
provenance, a record without the key). Nothing is guessed: a key that does not describe the
record's spans exactly refuses the row. `replicas` lists the row's serving instances,
distinct, in order of first appearance. Vectorized per span (numpy), never per token.
This module imports no run module.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from capture_core.builder.token_provenance import TOKEN_PROVENANCE_KEY, call_runs
from capture_core.errors import InvalidRecordError

NO_WEIGHT_VERSION = -1
INT32_MAX = 2**31 - 1
"""The `weight_version` of a prompt position, or of a generated one whose version is unknown."""

Span = tuple[int, int, "list[list[int]] | None", "str | None"]
"""A generated span of a row: start, end, its versions as runs (None: unknown), its replica."""


@dataclass(frozen=True)
class RowVersions:
    """One row's per-position versions and its replicas."""

    weight_version: np.ndarray
    replicas: tuple[str, ...]

    @classmethod
    def unknown(cls, length: int) -> RowVersions:
        """A row of `length` positions whose versions are all unknown."""
        return cls(np.full(length, NO_WEIGHT_VERSION, dtype=np.int32), ())

    def bounds(self) -> tuple[int | None, int | None]:
        """The least and greatest known version of the row, or `(None, None)`."""
        known = self.weight_version[self.weight_version != NO_WEIGHT_VERSION]
        if not len(known):
            return None, None
        return int(known.min()), int(known.max())


def provenance_key(record: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The record's `token_provenance`, or `None` when it has none."""
    key = record.get(TOKEN_PROVENANCE_KEY)
    return key if isinstance(key, Mapping) else None


def chain_calls(
    rollout_id: str, key: Mapping[str, Any] | None, items: Sequence[Mapping[str, Any]]
) -> list[Mapping[str, Any] | None]:
    """Each token-bearing item's call provenance (None: unknown), by the key's `chain`."""
    if key is None or "chain" not in key:
        return [None] * len(items)
    chain, calls = key["chain"], key.get("calls") or {}
    if len(chain) != len(items):
        raise InvalidRecordError(
            f"rollout {rollout_id}: token_provenance names {len(chain)} calls for "
            f"{len(items)} token-bearing items of response.output; the record was edited "
            "after finalize, so its versions cannot be placed and no row is written"
        )
    return [calls.get(call_id) for call_id in chain]


def chain_spans(
    items: Iterable[Mapping[str, Any]], calls: Iterable[Mapping[str, Any] | None]
) -> list[Span]:
    """The generated spans of a main-chain row's items, with their calls' versions."""
    spans: list[Span] = []
    for item, call in zip(items, calls, strict=True):
        start = len(item.get("prompt_token_ids") or [])
        generated = len(item["generation_token_ids"])
        replica = call.get("replica") if call else None
        spans.append((start, start + generated, _checked_runs(call_runs(call, generated)), replica))
    return spans


def trace_spans(
    rollout_id: str, key: Mapping[str, Any] | None, trace: Mapping[str, Any]
) -> list[Span]:
    """The sampled spans of an envelope trace, with the versions the key gives each; none
    without a key (every position unknown)."""
    if key is None:
        return []
    trace_id = str(trace["trace_id"])
    traces = key.get("traces")
    runs = traces.get(trace_id) if isinstance(traces, Mapping) else None
    sampled = trace["sampled_spans"]
    if runs is not None and len(runs["spans"]) != len(sampled):
        raise InvalidRecordError(
            f"rollout {rollout_id}: token_provenance gives {len(runs['spans'])} spans for "
            f"trace {trace_id}'s {len(sampled)}; the record was edited after finalize, so "
            "its versions cannot be placed and no row is written"
        )
    calls = key.get("calls") or {}
    spans: list[Span] = []
    for n, span in enumerate(sampled):
        versions = _checked_runs(runs["spans"][n]) if runs is not None else None
        call = calls.get(span["model_call_id"])
        replica = call.get("replica") if call else None
        spans.append((span["start"], span["end"], versions, replica))
    return spans


def _checked_runs(runs: Any) -> list[list[int]] | None:
    """Runs `[[version, count], ...]` (`None` for none or `[]`), checked: pairs of integers
    0 or more, versions within int32. Anything else was edited after finalize, and no
    version is guessed."""
    if not runs:
        return None
    ok = isinstance(runs, list) and all(
        isinstance(run, list | tuple)
        and len(run) == 2
        and all(type(n) is int and n >= 0 for n in run)
        and run[0] <= INT32_MAX
        for run in runs
    )
    if not ok:
        raise InvalidRecordError(
            f"token_provenance holds the runs {runs!r}, not [[version, count], ...] of "
            "integers 0 or more; the record was edited after finalize, so no row is written"
        )
    return runs


def row_versions(rollout_id: str, trace_id: str, length: int, spans: Sequence[Span]) -> RowVersions:
    """A row of `length` positions: each span's versions at its place, -1 elsewhere.

    A span holds a few runs, so each is one slice fill (C speed), never a loop per token.
    """
    versions = np.full(length, NO_WEIGHT_VERSION, dtype=np.int32)
    replicas: dict[str, None] = {}
    for start, end, runs, replica in spans:
        if replica is not None:
            replicas[str(replica)] = None
        if runs is None:
            continue
        counted = sum(count for _, count in runs)
        if counted != end - start or end > length:
            raise InvalidRecordError(
                f"rollout {rollout_id}: row {trace_id} has {counted} versions for the "
                f"span {start}..{end} of a {length}-token row; token_provenance does not "
                "describe the delivered tokens, so no row is written"
            )
        for version, count in runs:
            versions[start : start + count] = version
            start += count
    return RowVersions(versions, tuple(replicas))


def version_columns(versions: Sequence[RowVersions], offsets: pa.Array) -> dict[str, pa.Array]:
    """The rows' version columns: `weight_version` (one per position, on the rows' list
    `offsets`), `min_weight_version`, `max_weight_version` and `replicas`."""
    values = (
        np.concatenate([v.weight_version for v in versions])
        if versions
        else np.zeros(0, dtype=np.int32)
    )
    per_position = pa.ListArray.from_arrays(
        offsets, pa.array(values, pa.int32()), pa.list_(pa.field("element", pa.int32(), False))
    )
    bounds = [v.bounds() for v in versions]
    names = pa.list_(pa.field("element", pa.string(), nullable=False))
    return {
        "weight_version": per_position,
        "min_weight_version": pa.array([low for low, _ in bounds], pa.int32()),
        "max_weight_version": pa.array([high for _, high in bounds], pa.int32()),
        "replicas": pa.array([list(v.replicas) for v in versions], names),
    }
