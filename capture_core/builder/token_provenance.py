"""The record key `token_provenance`: which weights sampled every delivered generated token.

A delivered, unmasked record carries it beside `training_traces`, never inside: the envelope
stays version 1 exactly. `calls` holds each delivered call's `call_provenance` (null: the
call carries none). A main chain adds `chain`, the call of each token-bearing item of
`response.output` in order; `all_traces` adds `traces`, per trace its version bounds and
each sampled span's versions as runs `[[version, count], ...]`, in span order. `versions`
sums the delivered generated tokens per version, and counts those of unknown version: a
call without provenance says so, and no version is invented. Pure: no I/O.
This module imports only `records`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from capture_core.records import TokenEntry
from capture_core.records.provenance import (
    RUNS_KEY,
    call_provenance,
    expand_runs,
    generated_versions,
    version_runs,
)

TOKEN_PROVENANCE_KEY = "token_provenance"
SCHEMA_VERSION = 1
"""Version 1: calls, chain (main_chain) or traces (all_traces), versions."""


def chain_provenance(chain: Sequence[TokenEntry]) -> dict[str, Any]:
    """The key of a delivered main chain, given its calls in link order."""
    return {
        "schema_version": SCHEMA_VERSION,
        "calls": _calls(chain),
        "chain": [entry.model_call_id for entry in chain],
        "versions": _versions(chain),
    }


def traces_provenance(envelope: Mapping[str, Any], entries: Iterable[TokenEntry]) -> dict[str, Any]:
    """The key of a delivered `training_traces` envelope, whose spans name `entries`' calls.

    Every span owns exactly one call, whose generation is the span (the envelope check
    verified it), so a span's versions are its call's.
    """
    by_id = {entry.model_call_id: entry for entry in entries}
    owned: list[TokenEntry] = []
    traces: dict[str, Any] = {}
    for trace in envelope["traces"]:
        calls = [by_id[span["model_call_id"]] for span in trace["sampled_spans"]]
        owned.extend(calls)
        per_span = [generated_versions(entry) for entry in calls]
        known = [v for versions in per_span if versions for v in (versions[0], versions[-1])]
        traces[str(trace["trace_id"])] = {
            "min_weight_version": min(known) if known else None,
            "max_weight_version": max(known) if known else None,
            "spans": [version_runs(versions or []) for versions in per_span],
        }
    return {
        "schema_version": SCHEMA_VERSION,
        "calls": _calls(owned),
        "traces": traces,
        "versions": _versions(owned),
    }


def _calls(entries: Iterable[TokenEntry]) -> dict[str, Any]:
    return {entry.model_call_id: call_provenance(entry) for entry in entries}


def _versions(entries: Iterable[TokenEntry]) -> dict[str, Any]:
    """Delivered generated tokens per version (as string keys, ascending) and of unknown one."""
    tokens: dict[int, int] = {}
    unknown = 0
    for entry in entries:
        versions = generated_versions(entry)
        if versions is None:
            unknown += len(entry.generation_token_ids)
            continue
        for version, count in version_runs(versions):
            tokens[version] = tokens.get(version, 0) + count
    return {
        "min": min(tokens) if tokens else None,
        "max": max(tokens) if tokens else None,
        "tokens": {str(v): tokens[v] for v in sorted(tokens)},
        "unknown_tokens": unknown,
    }


def call_runs(call: Mapping[str, Any] | None, generated: int) -> list[list[int]] | None:
    """The versions a key's `calls` entry gives a call of `generated` tokens, as runs, by
    the rule of `records.provenance.generated_versions`; `None` when it gives none."""
    if not call:
        return None
    runs = call.get(RUNS_KEY)
    if runs is not None:
        return [list(run) for run in runs]
    known = call.get("start_weight_version")
    if known is None:
        known = call.get("end_weight_version")
    return None if known is None else [[known, generated]]


def call_versions(call: Mapping[str, Any] | None, generated: int) -> list[int] | None:
    """`call_runs` as one version per token."""
    runs = call_runs(call, generated)
    return None if runs is None else expand_runs(runs)
