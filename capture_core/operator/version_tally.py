"""Weight versions a run delivered: the run's tally in words, from its ledger lines' figures
(`capture_core.run.ledger_versions` writes them).

The run's tally (min, max, rollouts spanning more than one version, tokens per version)
is derived from the ledger alone, so `tokcap status` and the run's report agree.
This module does not import Prefect.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from pydantic import BaseModel

from capture_core.run.run_layout import LedgerLine

VERSIONS_SHOWN = 20
NO_PROVENANCE = "no delivered call held weight-version provenance"


class VersionTally(BaseModel):
    """The weight versions of a run's delivered rollouts that carry provenance figures.

    `min` and `max` are `None` when no delivered generated token's version is known.
    `spanning` counts the rollouts whose tokens come from more than one version; `tokens`
    the delivered generated tokens per version (ascending), `unknown_tokens` the others.
    """

    rollouts: int
    min: int | None = None
    max: int | None = None
    spanning: int = 0
    tokens: dict[str, int]
    unknown_tokens: int = 0


def tally_versions(ledger: Sequence[LedgerLine]) -> VersionTally | None:
    """The tally of the handed-off, unmasked lines with version figures (`None`: no such line)."""
    lines = [
        line
        for line in ledger
        if line.handed_off and not line.masked and line.weight_version_tokens is not None
    ]
    if not lines:
        return None
    known = [line.weight_versions for line in lines if line.weight_versions]
    tokens: Counter[int] = Counter()
    for line in lines:
        tokens.update({int(v): n for v, n in (line.weight_version_tokens or {}).items()})
    return VersionTally(
        rollouts=len(lines),
        min=min(low for low, _ in known) if known else None,
        max=max(high for _, high in known) if known else None,
        spanning=sum(1 for low, high in known if low != high),
        tokens={str(v): tokens[v] for v in sorted(tokens)},
        unknown_tokens=sum(line.unknown_version_tokens or 0 for line in lines),
    )


def _rollouts(count: int) -> str:
    return f"{count} rollout" + ("" if count == 1 else "s")


def version_lines(tally: VersionTally | None) -> list[str]:
    """The tally in words: one line when no version is known, else the range, the rollouts
    spanning versions and the tokens per version (the first `VERSIONS_SHOWN` of them)."""
    if tally is None:
        return []
    unknown = f"{tally.unknown_tokens} generated tokens of unknown version"
    if tally.min is None:
        return [f"weight versions: {NO_PROVENANCE} ({_rollouts(tally.rollouts)}, {unknown})"]
    shown = list(tally.tokens.items())[:VERSIONS_SHOWN]
    more = ", ..." if len(tally.tokens) > VERSIONS_SHOWN else ""
    lines = [
        f"weight versions delivered: {tally.min} to {tally.max}; {tally.spanning} of "
        f"{_rollouts(tally.rollouts)} span more than one version",
        "tokens per weight version: " + ", ".join(f"{v}: {n}" for v, n in shown) + more,
    ]
    return lines + ([unknown] if tally.unknown_tokens else [])


def version_table(tally: VersionTally | None) -> list[dict[str, object]]:
    """The tally as rows of the run's summary table (UI artifact)."""
    if tally is None:
        return []
    if tally.min is None:
        return [{"metric": "weight versions", "value": NO_PROVENANCE}]
    rows: list[dict[str, object]] = [
        {"metric": "weight version min", "value": tally.min},
        {"metric": "weight version max", "value": tally.max},
        {"metric": "rollouts spanning weight versions", "value": tally.spanning},
    ]
    rows += [
        {"metric": f"tokens of weight version {v}", "value": n} for v, n in tally.tokens.items()
    ]
    if tally.unknown_tokens:
        rows.append({"metric": "tokens of unknown weight version", "value": tally.unknown_tokens})
    return rows


def version_section(tally: VersionTally | None) -> list[str]:
    """The report's "Weight versions" section (none when no line carries version figures)."""
    if tally is None:
        return []
    lines = ["", "## Weight versions", "", *version_lines(tally)]
    if tally.min is None:
        return lines
    lines += ["", "| weight version | tokens |", "|---|---|"]
    lines += [f"| {v} | {n} |" for v, n in tally.tokens.items()]
    return lines + ([f"| unknown | {tally.unknown_tokens} |"] if tally.unknown_tokens else [])
