"""A run's outcome in plain words: the first line of every report, its mask rate, its reasons.

The CLI, the markdown report and the demo print these lines, so they say the same thing.
The mask alert is decided here too, so a report says whether the run raised it.
This module does not import Prefect.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from capture_core.operator.mask_reasons import DOCS, infrastructure_counts, kinds_of


class RunSummary(Protocol):
    """The counts these lines read (`capture_core.operator.run_report.RunSummary` has them)."""

    run_id: str
    rollouts: int
    handed_off: int
    masked: int
    retired: int
    failed: int
    gated: int
    not_started: int
    retire_failed: int
    awaiting_consumer: int
    malformed_lines: int
    duplicate_lines: int
    errors: list[str]
    mask_reasons: Mapping[str, int]
    mask_alert_threshold: float | None
    mask_alert_automation: str | None


MASK_ALERT_EVENT = "tokcap.run.mask-fraction.exceeded"
"""The event a run emits when its mask rate is above its alert threshold."""
MASK_ALERT_AUTOMATION = "tokcap-mask-fraction-alert"


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun if count == 1 else noun + 's'}"


def verdict(summary: RunSummary) -> str:
    """How the run ended, in a few words; a stopped run whose rollouts masked for an
    infrastructure reason names it (the run stopped for it, or for the mask gate)."""
    if summary.gated or summary.not_started:
        causes = infrastructure_counts(summary.mask_reasons)
        if causes:
            return f"stopped: rollouts masked for {' and '.join(k.title for k, _ in causes)}"
        return "stopped by the mask gate"
    if summary.failed or summary.malformed_lines or summary.duplicate_lines or summary.errors:
        return "failed"
    if summary.retire_failed:
        return "handed off, retirement failed"
    if summary.awaiting_consumer:
        return "handed off, retirement waits for the row consumer"
    return "complete"


def _facts(summary: RunSummary) -> list[str]:
    p = _plural
    counts = [
        (summary.masked, f"{summary.masked} masked (trainers skip masked records)"),
        (summary.retired, f"{p(summary.retired, 'capture')} retired"),
        (summary.failed, f"{summary.failed} not handed off (their batch failed)"),
        (summary.gated, f"{summary.gated} held back by the mask gate"),
        (summary.not_started, f"{summary.not_started} never started"),
        (
            summary.retire_failed,
            f"{p(summary.retire_failed, 'retirement')} failed (captures kept)",
        ),
        (
            summary.awaiting_consumer,
            f"{p(summary.awaiting_consumer, 'capture')} waiting for the consumer's ack",
        ),
        (summary.malformed_lines, p(summary.malformed_lines, "malformed input line")),
        (summary.duplicate_lines, f"{p(summary.duplicate_lines, 'line')} repeating a rollout id"),
    ]
    handed = f"{summary.handed_off} of {p(summary.rollouts, 'rollout')} handed off"
    return [handed, *(text for count, text in counts if count)]


def outcome_line(summary: RunSummary) -> str:
    """`run ID: complete: 7 of 7 rollouts handed off, 1 masked (...), 6 captures retired`."""
    return f"run {summary.run_id}: {verdict(summary)}: {', '.join(_facts(summary))}"


def mask_rate(summary: RunSummary) -> float:
    """The fraction of the run's rollouts that were masked (0 for an empty run)."""
    return summary.masked / summary.rollouts if summary.rollouts else 0.0


def mask_alert_due(summary: RunSummary) -> bool:
    """Whether the mask rate is above the run's alert threshold (never without one)."""
    threshold = summary.mask_alert_threshold
    return threshold is not None and mask_rate(summary) > threshold


def _percent(value: float) -> str:
    return f"{100 * value:.1f}%".replace(".0%", "%")


def mask_rate_line(summary: RunSummary) -> str:
    """The mask rate against the alert threshold, and whether the run raised the alert: the
    automation is named only when the run's Prefect API has it (a temporary server has none),
    else the line says what crossed the threshold and which event the run emitted."""
    rate = f"mask rate {_percent(mask_rate(summary))} ({summary.masked} of {summary.rollouts})"
    threshold = summary.mask_alert_threshold
    if threshold is None:
        return rate
    if mask_alert_due(summary):
        above = f"{rate}, above the alert threshold of {_percent(threshold)}"
        automation = summary.mask_alert_automation
        if automation:
            return (
                f"{above}: the mask alert fired (event {MASK_ALERT_EVENT}; automation {automation})"
            )
        return f"{above}: the mask rate crossed it, so the run emitted event {MASK_ALERT_EVENT}"
    return f"{rate}, within the alert threshold of {_percent(threshold)}: no alert"


def reason_lines(summary: RunSummary) -> list[str]:
    """One line per kind of mask reason: count, plain words, what to do, docs section."""
    return [f"{count} {kind.line()}" for kind, count in kinds_of(summary.mask_reasons)]


def reasons_footer() -> str:
    return f"Every reason, what it means and what to do: {DOCS}"
