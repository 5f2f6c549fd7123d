"""What a run's destination shows about it now: its manifest, receipts, ledger and acks.

The receipts are written as each batch is handed off; the ledger when a run ends. A run
with a manifest and no ledger, or whose receipts hand off more than its ledger shows, has
started and not ended: it is still running, or it was interrupted (a killed worker, a
stopped Prefect server, an outage) and `tokcap retrigger` completes it.
Acknowledgements are read as they are now: captures whose part the gating consumer
acknowledged after the run are told apart from those still waiting for it.
This module does not import Prefect.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from capture_core.errors import UnreadableReceiptError
from capture_core.operator.run_report import RunSummary, locate, summarize
from capture_core.rows.row_cursor import (
    ConsumerProgress,
    acknowledged_receipts,
    consumer_names,
    consumer_progress,
    read_stored_receipt,
    receipt_keys,
)
from capture_core.run.receipt import HandoffReceipt
from capture_core.run.run_layout import LedgerLine, RunLayout, RunManifest
from capture_core.storage import ByteStore
from capture_core.storage.io_pool import io_pool

State = Literal["ok", "failed", "started"]


def run_completed(dest: ByteStore, run_id: str) -> bool:
    """Whether the run ended complete: its manifest stands and its ledger reports every
    rollout handed off, and retired or masked, with nothing waiting for a consumer."""
    layout = RunLayout(dest, run_id)
    ledger = layout.read_ledger()
    complete = ledger is not None and summarize(run_id, ledger).complete
    return complete and dest.exists(layout.manifest_key)


class HandoffProgress(BaseModel):
    """What the run's readable receipts hand off, whatever its ledger says."""

    batches: int
    batches_handed_off: int
    rollouts_handed_off: int


class RunStatus(BaseModel):
    """A run as its destination shows it now.

    `state` is `ok` (everything handed off, and retired or waiting for its consumer),
    `failed` (something failed: see `summary`) or `started` (no ledger yet, or one that
    shows less than the receipts: still running or interrupted). `inbox` says whether an
    inbox pass claimed the run (its next pass comes back to a run that is not complete).
    """

    state: State
    manifest: RunManifest
    summary: RunSummary | None
    progress: HandoffProgress
    consumers: list[ConsumerProgress] = Field(default_factory=list)
    unreadable: list[str] = Field(default_factory=list)
    inbox: bool = False


def readable_receipts(layout: RunLayout) -> tuple[list[HandoffReceipt], list[str]]:
    """The run's receipts in batch order, and why each unreadable one cannot be read (read
    on the I/O pool: one request each, and a run can have hundreds)."""

    def read(key: str) -> HandoffReceipt | str:
        try:
            return read_stored_receipt(layout, key)
        except UnreadableReceiptError as exc:
            return str(exc)

    found = list(io_pool().map(read, receipt_keys(layout)))
    receipts = [r for r in found if isinstance(r, HandoffReceipt)]
    return receipts, [r for r in found if isinstance(r, str)]


def run_status(layout: RunLayout, dest: str) -> RunStatus | None:
    """The run's status at `dest` (the location `layout` reads), or `None` without a manifest."""
    manifest = layout.read_manifest()
    if manifest is None:
        return None
    receipts, unreadable = readable_receipts(layout)
    progress = HandoffProgress(
        batches=manifest.batches,
        batches_handed_off=len(receipts),
        rollouts_handed_off=sum(receipt.records for receipt in receipts),
    )
    ledger = layout.read_ledger()
    summary = None if ledger is None else ledger_summary(layout, dest, manifest, ledger)
    consumers = run_consumers(layout, manifest, receipts)
    if summary is not None and manifest.retire_after_consumer is not None:
        acked = acknowledged_receipts(layout, manifest.retire_after_consumer, receipts)
        count_acknowledged(summary, ledger or [], acked)
    return RunStatus(
        state=run_state(summary, progress, unreadable),
        manifest=manifest,
        summary=summary,
        progress=progress,
        consumers=consumers,
        unreadable=unreadable,
        inbox=bool(layout.attempt_numbers()),
    )


def ledger_summary(
    layout: RunLayout, dest: str, manifest: RunManifest, ledger: list[LedgerLine]
) -> RunSummary:
    summary = locate(summarize(layout.run_id, ledger), dest)
    summary.delivery = manifest.delivery
    return summary


def run_state(
    summary: RunSummary | None, progress: HandoffProgress, unreadable: list[str]
) -> State:
    """`started` without a ledger or with receipts beyond it; else `ok` or `failed`."""
    if summary is None or progress.rollouts_handed_off > summary.handed_off:
        return "started"
    return "ok" if summary.ok and not unreadable else "failed"


def run_consumers(
    layout: RunLayout, manifest: RunManifest, receipts: list[HandoffReceipt]
) -> list[ConsumerProgress]:
    """Each row consumer's progress through the run, the gating consumer first."""
    names = consumer_names(layout)
    gate = manifest.retire_after_consumer
    if gate is not None:
        names = [gate, *(name for name in names if name != gate)]
    return consumer_progress(layout, names, receipts) if names else []


def count_acknowledged(
    summary: RunSummary, ledger: list[LedgerLine], acked: list[HandoffReceipt]
) -> None:
    """Split the ledger's captures waiting for the consumer: those whose batch it has
    acknowledged since (`acknowledged_unretired`: the next retire pass retires them) and
    those it has not (`awaiting_consumer`)."""
    acknowledged = {r.rollout_id for receipt in acked for r in receipt.rollouts if r.rollout_id}
    waiting = [line for line in ledger if line.awaiting_consumer and not line.retired]
    ready = sum(1 for line in waiting if line.rollout_id in acknowledged)
    summary.acknowledged_unretired = ready
    summary.awaiting_consumer = len(waiting) - ready
