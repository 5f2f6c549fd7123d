"""The markdown report of a finalization run, as the run's Prefect artifact shows it.

The outcome comes first, then counts, mask rate and reasons in plain words, the masked and
failed rollouts, terminal attribution, the delivered fraction and the slowest batches. It
is derived from the run's summary and ledger (`run_report`) and holds ids, counts and
reasons, never storage options or credentials. This module does not import Prefect.
"""

from __future__ import annotations

import statistics

from capture_core.builder.trace_envelope import MAIN_CHAIN
from capture_core.operator import version_tally as versions
from capture_core.operator.mask_reasons import abstention_words, reason_kind
from capture_core.operator.run_outcome import (
    mask_rate_line,
    outcome_line,
    reason_lines,
    reasons_footer,
    verdict,
)
from capture_core.operator.run_report import (
    MAX_LISTED,
    RunSummary,
    plural,
    retirement_failed,
    spans,
    stopped_counts,
    trace_counts,
)
from capture_core.run.run_layout import LedgerLine


def markdown_report(
    summary: RunSummary,
    ledger: list[LedgerLine],
    delivered: list[float],
    batch_seconds: dict[int, float],
) -> str:
    """The outcome first; counts, mask rate and reasons in plain words, masked and failed
    rollouts, terminal attribution, delivered fraction, slowest batches."""
    title = f"# tokcap run `{summary.run_id}`: {verdict(summary)}"
    lines = [title, "", outcome_line(summary), ""]
    lines += [
        f"{summary.handed_off}/{plural(summary.rollouts, 'rollout')} handed off, "
        f"{summary.masked} masked, {plural(summary.retired, 'capture')} retired, "
        f"{plural(summary.retire_failed, 'retirement')} failed, "
        f"{summary.failed} failed, {plural(summary.malformed_lines, 'malformed input line')}"
        + "".join(f", {value} {name}" for name, value in stopped_counts(summary))
        + ".",
        "",
        "## Mask reasons",
        "",
        mask_rate_line(summary) + ".",
        "",
    ]
    if summary.mask_reasons:
        lines += [f"- {reason}" for reason in reason_lines(summary)]
        lines += ["", reasons_footer() + "."]
    else:
        lines.append("No rollout was masked.")
    masked = [
        (line, line.mask_reason or "masked") for line in ledger if line.masked and line.finalized
    ]
    failed = [
        (line, line.error or "failed")
        for line in ledger
        if not line.handed_off and not line.not_started
    ]
    lines += _masked_list(masked)
    lines += _reason_table("Failed rollouts and malformed lines", failed)
    unretired = [(line, line.error or "") for line in ledger if retirement_failed(line)]
    lines += _reason_table("Handed off, retirement failed (captures kept)", unretired)
    lines += ["", "## Terminal attribution", "", *_terminal_lines(summary)]
    lines += _traces(summary, ledger) if summary.delivery != MAIN_CHAIN else _delivered(delivered)
    lines += versions.version_section(summary.weight_versions)
    lines += ["", "## Slowest batches", "", "| batch | seconds |", "|---|---|"]
    for index, seconds in sorted(batch_seconds.items(), key=lambda kv: -kv[1])[:5]:
        lines.append(f"| {index} | {seconds:.2f} |")
    if summary.errors:
        lines += ["", "## Errors", ""] + [f"- {error}" for error in summary.errors]
    return "\n".join(lines) + "\n"


def _masked_list(rows: list[tuple[LedgerLine, str]]) -> list[str]:
    """The first `MAX_LISTED` masked rollouts, one list item each (a list wraps where a table
    cell would be cut off): id, line, the kind in plain words, then the reason as stored."""
    if not rows:
        return []
    out = ["", f"## Masked rollouts ({len(rows)})", ""]
    for line, reason in rows[:MAX_LISTED]:
        title = reason_kind(reason).title
        out.append(f"- {line.rollout_id or '-'} (line {line.line}): {title}: `{_flat(reason)}`")
    if len(rows) > MAX_LISTED:
        out += ["", f"... and {len(rows) - MAX_LISTED} more; the run ledger lists every one."]
    return out


def _flat(text: str) -> str:
    return " ".join(text.split()).replace("`", "'")


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _reason_table(title: str, rows: list[tuple[LedgerLine, str]]) -> list[str]:
    """A section with one row per distinct reason: how many rollouts, their lines, the reason.

    A failed batch (a store outage, say) gives its reason once, not once per rollout; the
    run ledger names every rollout.
    """
    if not rows:
        return []
    grouped: dict[str, list[int]] = {}
    for line, reason in rows:
        grouped.setdefault(_cell(reason), []).append(line.line)
    out = ["", f"## {title} ({len(rows)})", "", "| rollouts | lines | reason |", "|---|---|---|"]
    for reason, numbers in list(grouped.items())[:MAX_LISTED]:
        out.append(f"| {len(numbers)} | {spans(numbers)} | {reason} |")
    if len(grouped) > MAX_LISTED:
        out += ["", f"... and {len(grouped) - MAX_LISTED} more reasons; see the run ledger."]
    return out


DELIVERED_MEANING = (
    "Of the tokens each unmasked rollout generated, the share its handed-off record carries: "
    "calls off the scored conversation (auxiliary calls, abandoned tries, other branches) are "
    "left out. p10 means a tenth of the unmasked rollouts delivered less than that; p50, half."
)


def _delivered(delivered: list[float]) -> list[str]:
    lines = ["", "## Delivered fraction (unmasked rollouts)", ""]
    if not delivered:
        return [*lines, "No unmasked rollout."]
    quantiles = percentiles(delivered)
    return [
        *lines,
        "| min | p10 | p50 | p90 | max |",
        "|---|---|---|---|---|",
        f"| {min(delivered):.4f} | {quantiles[0]:.4f} | {statistics.median(delivered):.4f}"
        f" | {quantiles[-1]:.4f} | {max(delivered):.4f} |",
        "",
        DELIVERED_MEANING,
    ]


def percentiles(sample: list[float]) -> list[float]:
    """The nine deciles of `sample`, interpolated inside it: never below its min or above its
    max (the default method extrapolates on small samples)."""
    if len(sample) < 2:
        return sample * 9
    return statistics.quantiles(sample, n=10, method="inclusive")


def _traces(summary: RunSummary, ledger: list[LedgerLine]) -> list[str]:
    """The envelopes handed off: totals, then traces, owned calls and tokens per rollout."""
    lines = ["", "## Training traces", "", "| | |", "|---|---|"]
    lines += [f"| {name} | {value} |" for name, value in trace_counts(summary)]
    rows = [line for line in ledger if line.handed_off and line.traces is not None]
    if not rows:
        return [*lines, "", "No rollout was handed off with training traces."]
    lines += ["", "| rollout | traces | calls owned | tokens trained |", "|---|---|---|---|"]
    for line in rows[:MAX_LISTED]:
        lines.append(
            f"| {line.rollout_id or '-'} | {line.traces} | {line.owned_calls} | "
            f"{line.tokens_trained} |"
        )
    if len(rows) > MAX_LISTED:
        lines += ["", f"... and {len(rows) - MAX_LISTED} more; the run ledger lists every one."]
    return lines


TERMINAL_MEANING = (
    "Which captured call produced the response the verifier scored, by the witness that "
    "named it (`explicit`: the record's call id, `declared`: its response id, `response_id`: "
    "the scored response's id, `content`: its text); `none`: no witness could tell, and the "
    "single-conversation rule decided. A witness that could not tell while another named the "
    "call changes nothing."
)


def _terminal_lines(summary: RunSummary) -> list[str]:
    """Rollouts per attribution method and the top abstention reasons, as markdown."""
    if not summary.terminal_methods:
        return ["No build reported terminal attribution."]
    lines = [TERMINAL_MEANING, "", "| attributed by | rollouts |", "|---|---|"]
    lines += [f"| {method} | {count} |" for method, count in summary.terminal_methods.items()]
    if summary.terminal_abstentions:
        lines += ["", "| why a witness could not tell (most frequent) | rollouts |", "|---|---|"]
        lines += [
            f"| {abstention_words(code)} (`{code}`) | {n} |"
            for code, n in summary.terminal_abstentions.items()
        ]
    return lines
