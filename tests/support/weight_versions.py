"""Captures whose calls carry weight versions, and what every delivered position must hold.

`versioned_rollout` stamps a synthetic rollout's calls: each call its own version (start =
end), one call whose generation spans a weight update (per-token versions), one call with
no provenance at all, and a replica per call. `expected_row_versions` is the oracle: the
version each position of a delivered row must carry, computed from the captured entries
and the record's spans by plain Python, independently of the code under test.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

from capture_core.records import TokenEntry
from capture_core.records.provenance import generated_versions
from capture_core.testing.synthetic import RolloutShape, synthetic_rollout

UNVERSIONED_CALL = 2
"""The call (by position) that carries no provenance."""
SPANNING_CALL = 1
"""The call (by position) whose generation spans a weight update."""


def versioned_rollout(
    rollout_id: str, base: int, shape: RolloutShape | None = None, seed: int = 0
) -> list[TokenEntry]:
    """A synthetic rollout's calls, stamped with versions from `base` on (see the module)."""
    entries = synthetic_rollout(rollout_id, shape or RolloutShape(turns=4), seed=seed)
    rng = random.Random(f"{rollout_id}-{seed}")
    return [_stamped(entry, n, base + n, rng) for n, entry in enumerate(entries)]


def _stamped(entry: TokenEntry, n: int, version: int, rng: random.Random) -> TokenEntry:
    if n == UNVERSIONED_CALL:
        return entry
    data = entry.model_dump()
    generated = len(data["generation_token_ids"])
    data.update(start_weight_version=version, end_weight_version=version, replica=f"r{n % 3}")
    if n == SPANNING_CALL and generated > 1:
        switch = rng.randrange(1, generated)
        data["end_weight_version"] = version + 1
        data["generation_weight_versions"] = [version] * switch + [version + 1] * (
            generated - switch
        )
    return TokenEntry.model_validate(data)


def expected_row_versions(
    record: Mapping[str, Any], row: Mapping[str, Any], entries: Sequence[TokenEntry]
) -> list[int]:
    """The `weight_version` list row `row` (a rows-table row as a dict) of `record` must hold:
    the captured version of each generated token, -1 at every other position."""
    by_id = {e.model_call_id: e for e in entries}
    expected = [-1] * len(row["token_ids"])
    for call_id, start in _spans(record, row):
        versions = generated_versions(by_id[call_id]) or []  # none: -1 stays
        expected[start : start + len(versions)] = versions
    return expected


def expected_replicas(
    record: Mapping[str, Any], row: Mapping[str, Any], entries: Sequence[TokenEntry]
) -> list[str]:
    """The distinct replicas of the row's delivered calls, in span order."""
    by_id = {e.model_call_id: e for e in entries}
    replicas = [by_id[call_id].replica for call_id, _ in _spans(record, row)]
    return list(dict.fromkeys(r for r in replicas if r is not None))


def _spans(record: Mapping[str, Any], row: Mapping[str, Any]) -> list[tuple[str, int]]:
    """Each delivered call of the row and where its generation starts in the row."""
    envelope = record.get("training_traces")
    if envelope is not None:
        (trace,) = [t for t in envelope["traces"] if t["trace_id"] == row["trace_id"]]
        return [(s["model_call_id"], s["start"]) for s in trace["sampled_spans"]]
    items = [i for i in record["response"]["output"] if i.get("generation_token_ids")]
    chain = record["token_provenance"]["chain"]
    assert len(chain) == len(items)
    return [(c, len(i["prompt_token_ids"])) for c, i in zip(chain, items, strict=True)]


def rule(
    loss_mask: Sequence[int],
    versions: Sequence[int],
    current: int,
    lag: int,
    unknown_version: str = "mask",
) -> list[int]:
    """The staleness rule, position by position, in plain Python (the oracle): a sampled
    token trains when its version is known (not -1) and at most `lag` behind `current`, or
    when its version is unknown and `unknown_version` is "keep"."""
    return [
        int(bool(m) and (v >= current - lag if v != -1 else unknown_version == "keep"))
        for m, v in zip(loss_mask, versions, strict=True)
    ]
