"""What `tokcap` prints: run summaries, and one line per failure of a failed run."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable
from typing import Any

from capture_core.run.run_report import plural, stopped_counts, trace_counts
from flows.runners import script

MAX_FAILURE_LINES = 20


def print_retired(run_id: str, counts: dict[str, int]) -> None:
    total = counts["retired"] + counts["retired_earlier"]
    print(
        f"run {run_id}: {plural(total, 'capture')} retired from "
        f"{plural(counts['receipts'], 'receipt')} "
        f"({counts['retired']} now, {counts['retired_earlier']} by an earlier run against this "
        f"store; {counts['kept']} kept as evidence)"
        + (f"; {counts['waiting']} waiting for the consumer's ack" if counts.get("waiting") else "")
    )


def print_retriggered(report: Any) -> None:
    print(f"run {report.run_id}: {report.describe()}")


def print_summary(summary: Any) -> None:
    rows = [
        *trace_counts(summary),
        ("rollouts", summary.rollouts),
        ("handed off", summary.handed_off),
        ("already handed off (earlier run)", summary.already_handed_off),
        ("masked", summary.masked),
        *((f"  masked: {reason}", count) for reason, count in summary.mask_reasons.items()),
        ("retired", summary.retired),
        ("retirement failed", summary.retire_failed),
        ("failed", summary.failed),
        *stopped_counts(summary),
        ("malformed input lines", summary.malformed_lines),
        ("duplicate rollout id lines", summary.duplicate_lines),
    ]
    if summary.awaiting_consumer:
        at = rows.index(("retirement failed", summary.retire_failed)) + 1
        rows.insert(at, ("retirement waiting for consumer", summary.awaiting_consumer))
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    if summary.records_prefix:
        print(f"records: {summary.records_prefix}\nledger:  {summary.ledger}")


def print_consumers(consumers: list[Any], gate: str | None) -> None:
    """One line per row consumer: parts acknowledged, captures waiting for its ack."""
    for progress in consumers:
        line = (
            f"consumer {progress.name}: {progress.acknowledged} of {progress.parts} rows parts "
            f"acknowledged, {progress.captures_waiting} captures waiting for acknowledgement"
        )
        print(line + (" (retirement waits for it)" if progress.name == gate else ""))


def print_notes(notes: list[str]) -> None:
    """Print the notes to stderr after the command's result (stdout flushed first, also
    when it is a buffered file)."""
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.flush()
    for note in notes:
        print(note, file=sys.stderr)


def may_show_progress(args: argparse.Namespace, error: BaseException) -> bool:
    """A failed finalize shows its run's ledger, unless the run id belongs to another run."""
    from capture_core.errors import RunIdInUseError

    if args.command != "finalize" or getattr(error, "summary", None) is not None:
        return False
    return not isinstance(error, RunIdInUseError)


def report_failure(args: argparse.Namespace, failed: Any, partial: Any = None) -> None:
    """The run's summary when it wrote one, then one line per failure and where the traces are."""
    error = failed.error
    partial = getattr(error, "summary", None) or partial
    if partial is not None:
        PRINTERS.get(args.command, lambda _result: None)(partial)
    failures = list(getattr(error, "failures", None) or [f"{type(error).__name__}: {error}"])
    out = sys.stderr
    print(f"tokcap {args.command} failed:", file=out)
    for line in failures[:MAX_FAILURE_LINES]:
        print(f"  {one_line(line)}", file=out)
    if len(failures) > MAX_FAILURE_LINES:
        print(f"  ... and {len(failures) - MAX_FAILURE_LINES} more (see the ledger)", file=out)
    logs = f"{script('prefect')} flow-run logs {failed.flow_run_id}"
    print(f"Full logs and tracebacks: {logs}", file=out)


def one_line(text: str) -> str:
    return " ".join(str(text).split())


PRINTERS: dict[str, Callable[[Any], None]] = {
    "finalize": print_summary,
    "demo": print_summary,
    "retrigger": print_retriggered,
}
