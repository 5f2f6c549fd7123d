"""Retirement by receipt: drop the captures a verified part permits, each by its snapshot.

The part is re-verified against the receipt first; nothing is dropped unless it still
holds exactly the certified records, and then only what those records permit. Masked and
failed rollouts are never retired; a capture changed since its freeze is kept. Drop
failures are collected in the `RetireOutcome`, not raised, so one bad rollout does not stop
the others. This module does not import Prefect.
"""

from __future__ import annotations

import functools
import logging

from pydantic import BaseModel, Field

from capture_core.errors import is_transient
from capture_core.protocols import DECIDED, DELETED, BatchTokenSource, DropRequest, TokenSource
from capture_core.run.concurrency import store_concurrency
from capture_core.run.crash_points import crash_point
from capture_core.run.receipt import HandoffReceipt
from capture_core.run.retire_verdict import claimed_retirable, retirable
from capture_core.run.verified_read import verify_part
from capture_core.storage import ByteStore
from capture_core.store.base import drop_each

logger = logging.getLogger(__name__)


class RetireOutcome(BaseModel):
    """Which rollouts of a receipt were retired, kept (capture changed), or failed (errors).

    Only an outcome without failures is final; `transient` says whether a retry may fix them.
    `earlier` marks an outcome recorded by an earlier run and reused, not work done now.
    `disagreed` holds rollouts the receipt marks retirable and its verified part does not
    (masked, missing, without tokens): their captures are kept, and the run reports them.
    `waiting_for` names the row consumer whose acknowledgement the batch waits for: nothing
    was retired, and a later run retires it once acknowledged.
    """

    receipt_key: str
    retired: list[str] = Field(default_factory=list)
    kept: dict[str, str] = Field(default_factory=dict)
    failed: dict[str, str] = Field(default_factory=dict)
    disagreed: dict[str, str] = Field(default_factory=dict)
    transient: bool = True
    earlier: bool = False
    waiting_for: str | None = None


DISAGREED = (
    "not retired: the receipt marks it retirable, but its verified part {why}; the capture is kept"
)


KEPT_CHANGED = (
    "not retired: this store holds no capture at its frozen snapshot (it changed "
    "since it was frozen, or this is another store); anything there is kept"
)


async def retire_receipt(
    receipt: HandoffReceipt,
    source: TokenSource,
    dest: ByteStore,
    concurrency: int | None = None,
) -> RetireOutcome:
    """Retire the rollouts a receipt marks retirable and its part permits, each by its snapshot.

    The part is re-verified against the receipt first (`verify_part`); nothing is dropped
    unless it still holds exactly the certified records, and then only what those records
    permit (`retirable`); a rollout they refute is kept and reported in `disagreed`. The
    permitted rollouts are retired together: by the source's `drop_many` when it is a
    `BatchTokenSource` (tokcap's store: every tombstone durable first, then the deletions),
    else one `drop` per rollout; up to `concurrency` (default: `store_concurrency()`) at
    once. Drop failures are collected, not raised, so one bad rollout does not stop the others.
    """
    outcome = RetireOutcome(receipt_key=receipt.receipt_key)
    if not claimed_retirable(receipt):
        return outcome
    rollouts, refuted = retirable(receipt, verify_part(dest, receipt))
    for rollout_id, why in refuted.items():
        outcome.disagreed[rollout_id] = DISAGREED.format(why=why)
        logger.warning("receipt %s, rollout %s: %s", receipt.receipt_key, rollout_id, why)
    drops = [
        DropRequest(r.rollout_id or "", snapshot_id=r.snapshot_id or "", version=r.version or 0)
        for r in rollouts
    ]
    drop_batch = (
        source.drop_many
        if isinstance(source, BatchTokenSource)
        else functools.partial(drop_each, source)
    )
    results = await drop_batch(
        drops, concurrency=concurrency or store_concurrency(), checkpoint=_retire_crash_point
    )
    for rollout, retired in zip(rollouts, results, strict=True):
        _record_drop(outcome, rollout.rollout_id or "", retired)
    return outcome


RETIRE_CRASH_POINTS = {DECIDED: "after-retire-decisions", DELETED: "mid-retire"}


def _retire_crash_point(moment: str) -> None:
    """The crash points of a retirement: every decision durable, then each rollout deleted."""
    crash_point(RETIRE_CRASH_POINTS[moment])


def _record_drop(outcome: RetireOutcome, rollout_id: str, retired: bool | Exception) -> None:
    if isinstance(retired, Exception):
        outcome.failed[rollout_id] = f"{type(retired).__name__}: {retired}"
        outcome.transient = outcome.transient and is_transient(retired)
    elif retired:
        outcome.retired.append(rollout_id)
    else:
        outcome.kept[rollout_id] = KEPT_CHANGED
