"""What `tokcap` prints: run summaries, and one line per failure of a failed run."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable
from typing import Any

from capture_core.operator.run_outcome import mask_rate_line, outcome_line, reason_lines
from capture_core.operator.run_report import plural, stopped_counts, tokcap_command, trace_counts
from capture_core.operator.run_verdict import EXIT_CODES, fix_input_advice
from capture_core.operator.version_tally import version_lines
from capture_core.run.capture_source import is_class_spec
from tokcap.flows.cli.checks import status_of_run
from tokcap.flows.runners import script

MAX_FAILURE_LINES = 20
EXIT_STARTED = 3
"""The exit status of a command that found the Prefect API unreachable before it ran
anything: the run, if any, waits as it was. Distinct from 0 (complete), 1 (failed) and 2
(unknown run id, bad usage)."""
EXIT_LOST_API = EXIT_CODES["interrupted"]
"""The exit status of a command the Prefect API left mid-run: `interrupted`, as it prints.
A run the CLI started has no deployment and no automation retriggers it: only the person
who runs the printed command completes it."""


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


def print_summary(summary: Any, source: str | None = None) -> None:
    """The outcome line first (then `source`, what the run read), the counts, then the mask
    rate and each reason in words, then the weight versions delivered (when recorded)."""
    print(outcome_line(summary))
    if source:
        print(f"from {source}")
    rows = [
        *trace_counts(summary),
        ("rollouts", summary.rollouts),
        ("handed off", summary.handed_off),
        ("already handed off (earlier run)", summary.already_handed_off),
        ("masked", summary.masked),
        ("retired", summary.retired),
        ("retirement failed", summary.retire_failed),
        ("failed", summary.failed),
        *stopped_counts(summary),
        ("malformed input lines", summary.malformed_lines),
        ("duplicate rollout id lines", summary.duplicate_lines),
    ]
    at = rows.index(("retirement failed", summary.retire_failed)) + 1
    if summary.acknowledged_unretired:
        rows.insert(at, ("acknowledged, not retired yet", summary.acknowledged_unretired))
    if summary.awaiting_consumer:
        rows.insert(at, ("retirement waiting for consumer", summary.awaiting_consumer))
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    print(mask_rate_line(summary))
    if summary.mask_reasons:
        print("masked because:")
        for line in reason_lines(summary):
            print(f"  {line}")
    for line in version_lines(summary.weight_versions):
        print(line)
    if summary.records_prefix:
        ledger = summary.ledger or "not written (the next run of this run id writes it)"
        print(f"records: {summary.records_prefix}\nledger:  {ledger}")


def print_consumers(consumers: list[Any], gate: str | None) -> None:
    """One line per row consumer: parts acknowledged, captures waiting for its ack."""
    for progress in consumers:
        line = (
            f"consumer {progress.name}: {progress.acknowledged} of {progress.parts} rows parts "
            f"acknowledged, {progress.captures_waiting} captures waiting for acknowledgement"
        )
        print(line + (" (retirement waits for it)" if progress.name == gate else ""))


def print_status(
    status: Any, dest: str, options: bool, interrupted: bool = False, verdict: Any = None
) -> None:
    """A run as its destination and the Prefect API show it: the state line first (its
    first word is the state, `capture_core.operator.run_verdict`), the ledger's summary
    when there is one, each consumer, how far a run that has not ended got, then the one
    command that completes it when only a person can. `interrupted`: this command just
    stopped the run (no verdict is read: the API is gone)."""
    if interrupted:
        verdict = interrupted_verdict()
    print_verdict(status.manifest.run_id, verdict)
    manifest = status.manifest
    batches = plural(manifest.batches, "batch", "batches")
    source = f"{manifest.rollouts}, {batches}, delivery {manifest.delivery}"
    if status.summary is not None:
        print_summary(status.summary, source)
    else:
        print(f"run {manifest.run_id} ({source})")
    print_consumers(status.consumers, manifest.retire_after_consumer)
    for problem in status.unreadable:
        print(one_line(problem))
    if interrupted or status.state == "started":
        print(started_line(status, interrupted))
    if verdict.act:
        print(completing_line(status, dest, options, verdict.reason))
    elif status.summary is not None and status.summary.acknowledged_unretired:
        print(acknowledged_line(status, run_command(status, "retire", dest, options)))


def completing_line(status: Any, dest: str, options: bool, reason: str) -> str:
    """What completes a run only a person can: `tokcap retrigger`, except for a run whose
    only shortfall is malformed input lines, which no retrigger fixes (its input must change:
    the wording `tokcap retrigger` itself gives)."""
    summary = status.summary
    if summary is not None and summary.malformed_lines and not summary.failed:
        lines = plural(summary.malformed_lines, "malformed input line")
        return f"its input has {lines}: {fix_input_advice(status.manifest.run_id)}"
    unless = "if nothing runs it, " if "could not tell" in reason else ""
    return f"{unless}complete it with: {run_command(status, 'retrigger', dest, options)}"


def interrupted_verdict() -> Any:
    """The verdict of a run this command just stopped: interrupted, a person completes it."""
    from capture_core.operator.run_verdict import Verdict

    reason = "this command stopped before the run ended"
    return Verdict(state="interrupted", exit_code=1, reason=reason, act=True)


def print_verdict(run_id: str, verdict: Any) -> None:
    """`STATE: run ID: REASON`, the line a poller reads (its first word is the state)."""
    print(f"{verdict.state}: run {run_id}: {one_line(verdict.reason)}")


def run_command(status: Any, name: str, dest: str, options: bool) -> str:
    """`tokcap <name>` for the run, with its recorded store (`tokcap_command`)."""
    manifest = status.manifest
    spec = is_class_spec(manifest.store)
    return tokcap_command(
        name, dest, manifest.run_id, manifest.store, source_kwargs=spec, options=options
    )


def started_line(status: Any, interrupted: bool) -> str:
    """How far a run that has not ended got: its receipts, against its ledger if any."""
    progress = status.progress
    handed = (
        f"{progress.batches_handed_off} of {plural(progress.batches, 'batch', 'batches')} handed "
        f"off ({plural(progress.rollouts_handed_off, 'rollout')})"
    )
    if interrupted:
        ledger = "no ledger yet" if status.summary is None else "the ledger above is older"
        return f"interrupted: {handed}; {ledger}"
    if status.summary is None:
        return f"so far: {handed}, no ledger yet"
    return f"so far: {handed}, more than this ledger shows (a later run has not ended)"


def acknowledged_line(status: Any, retire: str) -> str:
    """Captures whose parts the consumer acknowledged since the run, and what retires them."""
    count = status.summary.acknowledged_unretired
    who = status.manifest.retire_after_consumer
    what = f"{plural(count, 'capture')} no longer wait for consumer {who}: it acknowledged "
    if status.inbox:
        return (
            what + f"their parts. The inbox's next pass retires them; to retire them now: {retire}"
        )
    return what + f"their parts, and nothing retires them until you run: {retire}"


RUN_COMMANDS = ("finalize", "retrigger")
"""The commands whose run `tokcap retrigger` completes when their Prefect API went away."""


def report_lost_api(args: argparse.Namespace, explanation: str) -> None:
    """The Prefect API went away mid-command: one line on stderr naming it and what to do,
    then (finalize, retrigger) what the run handed off and the command that completes it."""
    status = None
    if args.command in RUN_COMMANDS:
        with contextlib.suppress(Exception):  # no manifest, or unreadable: said below anyway
            status = status_of_run(args.dest, args.run_id, args.options)
    if status is not None:
        then = "then complete the run with the command below"
    else:
        then = f"then run the same tokcap {args.command} command again"
    print(f"tokcap {args.command}: {explanation}; {then}", file=sys.stderr)
    if status is not None:
        print_status(status, args.dest, bool(args.options), interrupted=True)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()


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
    if getattr(error, "next_step", ""):
        print(error.next_step[0].upper() + error.next_step[1:], file=out)
    logs = f"{script('prefect')} flow-run logs {failed.flow_run_id}"
    print(f"Full logs and tracebacks: {logs}", file=out)


def one_line(text: str) -> str:
    return " ".join(str(text).split())


PRINTERS: dict[str, Callable[[Any], None]] = {
    "finalize": print_summary,
    "demo": print_summary,
    "retrigger": print_retriggered,
}
