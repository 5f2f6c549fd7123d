"""The run summary, mask-reason grouping and the markdown report of a finalization run.

Reports are derived from receipts, retirement outcomes and the ledger; they hold ids,
counts and reasons, never storage options or credentials.
This module does not import Prefect.
"""

from __future__ import annotations

import statistics
from collections import Counter

from pydantic import BaseModel, Field

from capture_core.handoff import LedgerLine


class RunSummary(BaseModel):
    """What one finalization run did, for the CLI, the UI and `tokcap status`."""

    run_id: str
    rollouts: int = 0
    finalized: int = 0
    masked: int = 0
    mask_reasons: dict[str, int] = Field(default_factory=dict)
    handed_off: int = 0
    already_handed_off: int = 0
    retired: int = 0
    failed: int = 0
    malformed_lines: int = 0
    errors: list[str] = Field(default_factory=list)
    records_prefix: str = ""
    ledger: str = ""
    terminal_methods: dict[str, int] = Field(default_factory=dict)
    terminal_abstentions: dict[str, int] = Field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """No failed rollout, no unreadable input line, no error."""
        return self.failed == 0 and self.malformed_lines == 0 and not self.errors


def reason_category(reason: str | None) -> str:
    """Group mask reasons by their leading phrase (ids and details dropped)."""
    if not reason:
        return "masked"
    head = reason.split(": ", 1)[0].split(" [", 1)[0].strip()
    return head[:80] or "masked"


def _by_count(counts: Counter) -> dict[str, int]:
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


TOP_ABSTENTIONS = 5


def summarize(run_id: str, ledger: list[LedgerLine]) -> RunSummary:
    """Counts and mask reasons of a run, from its ledger.

    Terminal attribution: rollouts per method (`none` when unattributed) and the most
    frequent abstention reasons of the witnesses.
    """
    reasons = Counter(reason_category(line.mask_reason) for line in ledger if line.masked)
    built = [line for line in ledger if line.terminal_method is not None]
    methods = Counter(line.terminal_method or "none" for line in built)
    abstentions = Counter(code for line in built for code in line.terminal_abstentions)
    return RunSummary(
        run_id=run_id,
        rollouts=len(ledger),
        finalized=sum(1 for line in ledger if line.finalized),
        masked=sum(1 for line in ledger if line.masked),
        mask_reasons=dict(sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))),
        handed_off=sum(1 for line in ledger if line.handed_off),
        retired=sum(1 for line in ledger if line.retired),
        failed=sum(1 for line in ledger if line.finalized and not line.handed_off),
        malformed_lines=sum(1 for line in ledger if not line.finalized and line.rollout_id is None),
        terminal_methods=_by_count(methods),
        terminal_abstentions=dict(list(_by_count(abstentions).items())[:TOP_ABSTENTIONS]),
    )


def summary_table(summary: RunSummary) -> list[dict[str, object]]:
    return [
        {"metric": "rollouts", "value": summary.rollouts},
        {"metric": "handed off", "value": summary.handed_off},
        {"metric": "already handed off (earlier run)", "value": summary.already_handed_off},
        {"metric": "masked", "value": summary.masked},
        *({"metric": f"masked: {k}", "value": v} for k, v in summary.mask_reasons.items()),
        {"metric": "retired", "value": summary.retired},
        {"metric": "failed", "value": summary.failed},
        {"metric": "malformed input lines", "value": summary.malformed_lines},
        *(
            {"metric": f"terminal attributed by: {k}", "value": v}
            for k, v in summary.terminal_methods.items()
        ),
        *(
            {"metric": f"terminal abstention: {k}", "value": v}
            for k, v in summary.terminal_abstentions.items()
        ),
    ]


def markdown_report(
    summary: RunSummary, delivered: list[float], batch_seconds: dict[int, float]
) -> str:
    """Mask reasons, delivered-fraction distribution and slowest batches, as markdown."""
    lines = [f"# tokcap run `{summary.run_id}`", ""]
    lines += [
        f"{summary.handed_off}/{summary.rollouts} rollouts handed off, "
        f"{summary.masked} masked, {summary.retired} captures retired, "
        f"{summary.failed} failed.",
        "",
        "## Mask reasons",
        "",
    ]
    if summary.mask_reasons:
        lines += ["| reason | rollouts |", "|---|---|"]
        lines += [f"| {reason} | {count} |" for reason, count in summary.mask_reasons.items()]
    else:
        lines.append("No rollout was masked.")
    lines += ["", "## Terminal attribution", "", *_terminal_lines(summary)]
    lines += ["", "## Delivered fraction (unmasked rollouts)", ""]
    if delivered:
        quantiles = statistics.quantiles(delivered, n=10) if len(delivered) > 1 else delivered * 9
        lines += [
            "| min | p10 | p50 | p90 | max |",
            "|---|---|---|---|---|",
            f"| {min(delivered):.4f} | {quantiles[0]:.4f} | {statistics.median(delivered):.4f}"
            f" | {quantiles[-1]:.4f} | {max(delivered):.4f} |",
        ]
    else:
        lines.append("No unmasked rollout.")
    lines += ["", "## Slowest batches", "", "| batch | seconds |", "|---|---|"]
    for index, seconds in sorted(batch_seconds.items(), key=lambda kv: -kv[1])[:5]:
        lines.append(f"| {index} | {seconds:.2f} |")
    if summary.errors:
        lines += ["", "## Errors", ""] + [f"- {error}" for error in summary.errors]
    return "\n".join(lines) + "\n"


def _terminal_lines(summary: RunSummary) -> list[str]:
    """Rollouts per attribution method and the top abstention reasons, as markdown."""
    if not summary.terminal_methods:
        return ["No build reported terminal attribution."]
    lines = ["| attributed by | rollouts |", "|---|---|"]
    lines += [f"| {method} | {count} |" for method, count in summary.terminal_methods.items()]
    if summary.terminal_abstentions:
        lines += ["", "| top abstention reasons | rollouts |", "|---|---|"]
        lines += [f"| {code} | {n} |" for code, n in summary.terminal_abstentions.items()]
    return lines
