"""The runs of a destination, newest first, read from small files only.

Whenever a run's ledger is written, its counts go beside it in `summary.json`
(`LedgerSummary`: the summary, when it was written, and the finalize pass's batch seconds).
`list_runs` reads each run's manifest and that summary, never its ledger, except for a run
written before summaries existed. A run with a manifest but no ledger either stopped before
its report (interrupted: its receipts say how many batches were handed off) or is running
now; without Prefect the two cannot be told apart, and both are listed as such.
`RunRow.cells` is the one text form, shared by `tokcap runs` and the runs artifact.
This module does not import Prefect.
"""

from __future__ import annotations

import difflib
import time
from collections.abc import Sequence
from typing import Annotated, Any

import orjson
from pydantic import BaseModel, Field, ValidationError

from capture_core.errors import InvalidInputError, UnreadableManifestError
from capture_core.operator.mask_reasons import kinds_of
from capture_core.operator.run_outcome import mask_rate
from capture_core.operator.run_report import RunSummary, plural, summarize
from capture_core.operator.run_verdict import DestState, Verdict
from capture_core.run.receipt import RECEIPT_KEY, RETIREMENT_KEY
from capture_core.run.run_layout import MANIFEST, SUMMARY, RunLayout, RunManifest, validate_run_id
from capture_core.storage import ByteStore

TOP_REASONS = 3
LEFT_OUT = {"errors", "malformed_line_errors", "records_prefix", "ledger"}
"""Summary fields not kept in `summary.json`: lists of texts (the ledger and the run's logs
have them) and locations (derived from the destination)."""

COMPLETE, WAITING, INCOMPLETE = "complete", "complete", "failed"
INTERRUPTED, NOT_FINISHED, UNREADABLE = "interrupted", "interrupted", "failed"
"""The states the destination alone gives (`run_verdict.RunState` words): a run whose
captures wait for its consumer is complete (its details say how many wait); an unreadable
manifest is a failure a person must look at."""
DEST_STATES: dict[str, DestState] = {"failed": "failed", "interrupted": "started"}


class LedgerSummary(BaseModel):
    """What `summary.json` holds: the ledger's counts, when they were written, and the
    batch seconds and fresh rollouts of the finalize pass that last ran (for its rate)."""

    summary: RunSummary
    written_at: float
    seconds: float | None = None
    finalized_now: int | None = None


def record_summary(
    layout: RunLayout,
    summary: RunSummary,
    seconds: float | None = None,
    now: float | None = None,
) -> LedgerSummary:
    """Write `summary.json` for the ledger just written.

    `seconds`: the batch seconds of the finalize pass that wrote it; `None` (a retirement
    outside a run) keeps the last pass's figures.
    """
    finalized_now: int | None = summary.finalized - summary.already_handed_off
    if seconds is None:
        earlier = read_summary(layout)
        seconds, finalized_now = (
            (earlier.seconds, earlier.finalized_now) if earlier else (None, None)
        )
    body = {
        "summary": summary.model_dump(exclude=LEFT_OUT),
        "written_at": time.time() if now is None else now,
        "seconds": seconds,
        "finalized_now": finalized_now,
    }
    layout.dest.replace(layout.summary_key, orjson.dumps(body, option=orjson.OPT_SORT_KEYS))
    return LedgerSummary.model_validate(body)


def refresh_summary(layout: RunLayout) -> LedgerSummary | None:
    """Rewrite `summary.json` from the run's ledger (after retirements outside a run)."""
    ledger = layout.read_ledger()
    if ledger is None:
        return None
    earlier = read_summary(layout)
    summary = summarize(layout.run_id, ledger)
    if earlier is not None:
        summary.delivery = earlier.summary.delivery
    return record_summary(layout, summary)


def read_summary(layout: RunLayout) -> LedgerSummary | None:
    """The run's `summary.json`, or `None` when it has none or it cannot be read."""
    return _parse_summary(layout.dest.get(layout.summary_key))


def _parse_summary(data: bytes | None) -> LedgerSummary | None:
    if data is None:
        return None
    try:
        return LedgerSummary.model_validate(orjson.loads(data))
    except (orjson.JSONDecodeError, ValidationError):
        return None  # derived: the run's ledger is what counts


Count = Annotated[int | None, Field(default=None)]
"""A count a run row shows, `None` where the run has not recorded it."""


class RunRow(BaseModel):
    """One run of a destination as `tokcap runs` and the runs artifact show it."""

    run_id: str
    state: str
    complete: bool = False
    updated_at: float | None = None
    """When its summary was written, else when the run id was first claimed."""
    delivery: str | None = None
    rollouts: Count
    """The run's input rollouts; `None` until its ledger was written."""
    handed_off: Count
    masked: Count
    mask_rate: float | None = None
    mask_reasons: dict[str, int] = Field(default_factory=dict)
    """The most frequent kinds of mask reason by title (`lost call`, as `tokcap status`
    says; `tokcap docs mask-reasons`), most frequent first; the ledger has each reason."""
    retired: Count
    awaiting_consumer: Count
    """Handed-off rollouts whose retirement waits for the row consumer's acknowledgement."""
    rollouts_per_second: float | None = None
    batches: Count
    batches_handed_off: Count
    batches_retired: Count
    """Counted from the receipts of a run without a ledger only, to show how far it got;
    once the ledger is written its rollout counts (`handed_off`, `retired`) say it, and the
    receipts are not listed (`None`), which keeps the listing to small files."""
    note: str = ""

    def cells(self) -> dict[str, str]:
        """The row in words, by column, in column order."""
        masked = "-"
        if self.masked is not None:
            masked = f"{self.masked} ({100 * (self.mask_rate or 0):.1f}%)"
        reasons = ", ".join(f"{reason} ({n})" for reason, n in self.mask_reasons.items())
        return {
            "run id": self.run_id,
            "updated (UTC)": _when(self.updated_at),
            "state": self.state,
            "rollouts": _number(self.rollouts),
            "masked": masked,
            "retired": _number(self.retired),
            "waiting": _number(self.awaiting_consumer),
            "rollouts/s": "-"
            if self.rollouts_per_second is None
            else f"{self.rollouts_per_second:.1f}",
            "details": "; ".join(filter(None, [reasons, self.note])),
        }


def _number(value: int | None) -> str:
    return "-" if value is None else str(value)


def _when(at: float | None) -> str:
    return "-" if at is None else time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(at))


def row_from_summary(manifest: RunManifest, found: LedgerSummary) -> RunRow:
    """A run whose ledger was written: its counts, state and rate."""
    summary = found.summary
    state = COMPLETE if summary.complete else WAITING if summary.ok else INCOMPLETE
    rate = None
    if found.seconds and found.finalized_now:
        rate = found.finalized_now / found.seconds
    return _row_of(
        manifest,
        state,
        found.written_at,
        complete=summary.complete,
        rollouts=summary.rollouts,
        handed_off=summary.handed_off,
        masked=summary.masked,
        mask_rate=mask_rate(summary),
        mask_reasons=top_reasons(summary.mask_reasons),
        retired=summary.retired,
        awaiting_consumer=summary.awaiting_consumer,
        rollouts_per_second=rate,
        note=_incomplete_note(summary),
    )


def _row_of(manifest: RunManifest, state: str, updated_at: float | None, **shown: Any) -> RunRow:
    """A row of the manifest's run (its id, delivery and batches) in `state`, with `shown`."""
    return RunRow(
        run_id=manifest.run_id,
        state=state,
        updated_at=updated_at,
        delivery=manifest.delivery,
        batches=manifest.batches,
        **shown,
    )


def top_reasons(reasons: dict[str, int]) -> dict[str, int]:
    """The `TOP_REASONS` most frequent kinds of mask reason, in the plain words `tokcap
    status` and the report use (`mask_reasons.kinds_of`), most frequent first."""
    return {kind.title: count for kind, count in kinds_of(reasons)[:TOP_REASONS]}


def _incomplete_note(summary: RunSummary) -> str:
    counts = [
        (summary.failed, "rollout", "not handed off"),
        (summary.gated, "rollout", "stopped by the mask gate"),
        (summary.not_started, "line", "not started"),
        (summary.retire_failed, "retirement", "failed"),
        (summary.malformed_lines, "malformed line", ""),
        (summary.duplicate_lines, "duplicate id line", ""),
        (summary.awaiting_consumer, "capture", "waiting for the consumer"),
    ]
    return ", ".join(f"{plural(n, noun)} {what}".strip() for n, noun, what in counts if n)


def row_without_ledger(layout: RunLayout, manifest: RunManifest) -> RunRow:
    """A run with a manifest and no ledger: its batches from the listing of its receipts."""
    names = [key.rsplit("/", 1)[-1] for key in layout.dest.list_prefix(layout.receipts_prefix)]
    handed = sum(1 for name in names if RECEIPT_KEY.fullmatch(name))
    retired = {m.group(1) for m in map(RETIREMENT_KEY.fullmatch, names) if m}
    state = INTERRUPTED if handed else NOT_FINISHED
    return _row_of(
        manifest,
        state,
        manifest.started_at,
        batches_handed_off=handed,
        batches_retired=len(retired),
        note=(
            f"{handed}/{plural(manifest.batches, 'batch', 'batches')} handed off, "
            f"{len(retired)} retired; no ledger yet"
        ),
    )


class RunListing(BaseModel):
    """The runs shown, newest first, and how many runs the destination holds in all."""

    runs: list[RunRow]
    total: int


def list_runs(dest: ByteStore, limit: int | None = None) -> RunListing:
    """The destination's runs, newest first (then by run id); at most `limit` of them.

    Reads every run's manifest and summary (concurrently where the store has latency), then,
    for the runs shown that have no summary, their receipts' listing or, for a run written
    before summaries, its ledger. A folder without a manifest is not a run.
    """
    names = [name for name in dest.list_children("") if _is_run_id(name)]
    keys = [f"{name}/{item}" for name in names for item in (MANIFEST, SUMMARY)]
    found = dest.get_many(keys)
    rows: list[tuple[RunRow, RunManifest | None, LedgerSummary | None]] = []
    for name in names:
        row = _first_look(dest, name, found[f"{name}/{MANIFEST}"], found[f"{name}/{SUMMARY}"])
        if row is not None:
            rows.append(row)
    rows.sort(key=lambda item: (-(item[0].updated_at or 0.0), item[0].run_id))
    shown = rows if not limit else rows[:limit]
    return RunListing(runs=[_complete_row(dest, *item) for item in shown], total=len(rows))


def read_row(dest: ByteStore, run_id: str) -> RunRow | None:
    """One run's row, read afresh; `None` without a manifest."""
    found = dest.get_many([f"{run_id}/{MANIFEST}", f"{run_id}/{SUMMARY}"])
    first = _first_look(dest, run_id, found[f"{run_id}/{MANIFEST}"], found[f"{run_id}/{SUMMARY}"])
    return None if first is None else _complete_row(dest, *first)


def closest_run_id(dest: ByteStore, run_id: str) -> str | None:
    """The run id at `dest` that `run_id` most likely meant (a typo), or `None`: a hint for
    the message that names an unknown run id, so a listing that fails gives none."""
    try:
        names = [name for name in dest.list_children("") if _is_run_id(name)]
    except Exception:  # the hint is optional; the caller names the run id either way
        return None
    found = difflib.get_close_matches(run_id, [n for n in names if n != run_id], n=1)
    return found[0] if found else None


def _is_run_id(name: str) -> bool:
    try:
        validate_run_id(name)
    except InvalidInputError:
        return False
    return True


def _first_look(
    dest: ByteStore, run_id: str, manifest_bytes: bytes | None, summary_bytes: bytes | None
) -> tuple[RunRow, RunManifest | None, LedgerSummary | None] | None:
    """The row as the two small files tell it; `None` for a folder without a manifest."""
    if manifest_bytes is None:
        return None
    layout = RunLayout(dest, run_id)
    try:
        manifest = RunManifest.model_validate(orjson.loads(manifest_bytes))
    except ValueError:
        try:
            layout.read_manifest()  # its message names the manifest and what to do
        except UnreadableManifestError as exc:
            return RunRow(run_id=run_id, state=UNREADABLE, note=str(exc)), None, None
        return None  # removed meanwhile
    found = _parse_summary(summary_bytes)
    if found is not None:
        return row_from_summary(manifest, found), manifest, found
    return RunRow(run_id=run_id, state=NOT_FINISHED, updated_at=manifest.started_at), manifest, None


def _complete_row(
    dest: ByteStore, row: RunRow, manifest: RunManifest | None, found: LedgerSummary | None
) -> RunRow:
    """The row of a run shown: a run without a summary is read further (see `list_runs`)."""
    if manifest is None or found is not None:
        return row
    layout = RunLayout(dest, row.run_id)
    ledger = layout.read_ledger()
    if ledger is None:
        return row_without_ledger(layout, manifest)
    summary = summarize(row.run_id, ledger)
    return row_from_summary(manifest, LedgerSummary(summary=summary, written_at=0.0)).model_copy(
        update={"updated_at": manifest.started_at}
    )


def dest_state(row: RunRow) -> DestState:
    """What the destination alone says of the row's run, as `run_verdict.decide` takes it."""
    return DEST_STATES.get(row.state, "ok")


def with_verdict(row: RunRow, verdict: Verdict) -> RunRow:
    """The row in the state `verdict` gives it; its reason leads the details when the run
    is not complete."""
    note = (
        row.note
        if verdict.state == COMPLETE
        else "; ".join(filter(None, [verdict.reason, row.note]))
    )
    return row.model_copy(update={"state": verdict.state, "note": note})


def table(rows: Sequence[RunRow]) -> list[dict[str, str]]:
    """The rows in words (`RunRow.cells`), for a table artifact."""
    return [row.cells() for row in rows]
