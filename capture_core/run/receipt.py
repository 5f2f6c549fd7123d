"""What a batch's handoff records: each rollout's outcome, the receipt, and their keys.

`RolloutOutcome` is what finalization did with one input line; `HandoffReceipt` is the proof
that a batch's records part (and its rows part, `RowsPart`) is durably stored, naming each
part's key, size and sha256 and each rollout's snapshot. A receipt's key says what it
certifies (this batch index of this exact input); a retirement is persisted beside it under
`retirement_key`. A receipt's own marks are a claim: `retire_verdict` checks them against
the verified part before anything is retired. This module does not import Prefect.
"""

from __future__ import annotations

import re

from pydantic import BaseModel

from capture_core.run.rollout_io import BatchPlan
from capture_core.run.run_layout import RolloutFigures


class RolloutOutcome(RolloutFigures):
    """What finalization did with one input line: its figures, whether its capture may be
    retired and at which snapshot, and why the line was refused as input (`error`)."""

    can_retire: bool = False
    snapshot_id: str | None = None
    version: int | None = None
    error: str | None = None

    @property
    def emitted(self) -> bool:
        """Whether a finalized record was produced (malformed input lines produce none)."""
        return self.error is None


class RowsPart(BaseModel):
    """The trainer-rows part a receipt pins beside the records part: key, size, sha256, rows."""

    key: str
    sha256: str
    bytes: int
    rows: int


class HandoffReceipt(BaseModel):
    """Proof that a batch's records are durably stored at the destination."""

    run_id: str
    batch: int
    receipt_key: str
    part_key: str
    sha256: str
    bytes: int
    records: int
    rollouts: list[RolloutOutcome]
    rows: RowsPart | None = None
    handed_off_at: float | None = None
    """When both parts were verified (seconds since the epoch, the handing-off process's
    clock): the handoff order a `RowStream` yields parts in. `None` on older receipts."""


RECEIPT_KEY = re.compile(r"batch-[0-9]{5,}-[0-9a-f]{16}")
RETIRED_INFIX = "-retired-"
RETIREMENT_KEY = re.compile(rf"({RECEIPT_KEY.pattern}){RETIRED_INFIX}[0-9a-f]+")
"""A batch's persisted retirement beside its receipt; group 1 is the receipt's key."""


def retirement_key(receipt: str, store_identity: str) -> str:
    """The name the retirement of receipt `receipt` against one store is persisted under."""
    return f"{receipt}{RETIRED_INFIX}{store_identity}"


def receipt_key(batch: BatchPlan) -> str:
    """A key that says what the receipt certifies: this batch index of this exact input."""
    return f"batch-{batch.index:05d}-{batch.sha256[:16]}"


def kept_as_evidence(receipt: HandoffReceipt) -> int:
    """Captures a receipt never retires: those of masked or unfinished rollouts."""
    return sum(1 for r in receipt.rollouts if r.rollout_id and not r.can_retire)


def marked_retirable(receipt: HandoffReceipt) -> int:
    """Captures a receipt marks retirable: those of rebuilt or redundant rollouts."""
    return sum(1 for r in receipt.rollouts if r.rollout_id and r.can_retire)
