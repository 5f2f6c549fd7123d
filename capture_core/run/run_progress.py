"""What a finalize run has done so far: the mask gate, the run's tally, its ledger, and diffs.

This is the pure bookkeeping of a run, kept apart from the tasks that do its side effects:
the flow reports each batch's fate here and writes the ledger this builds.
This module does not import Prefect.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Generic, TypeVar

from pydantic import BaseModel, Field

from capture_core.builder.trace_envelope import MAIN_CHAIN
from capture_core.run.handoff import (
    HandoffReceipt,
    RetireOutcome,
    RolloutOutcome,
    kept_as_evidence,
    marked_retirable,
)
from capture_core.run.run_layout import LedgerLine
from capture_core.run.run_report import reason_category

Item = TypeVar("Item")
Started = TypeVar("Started")


class Lookahead(Generic[Item, Started]):
    """Starts work on items in order, keeping at most `ahead` started and not yet taken.

    A run finalizes the next batches while it hands off the current one, and holds at most
    `ahead` finalized batches in memory; after `stop` nothing more is started.
    """

    def __init__(
        self,
        items: Iterable[Item],
        start: Callable[[Item], Started],
        key: Callable[[Item], Hashable],
        ahead: int,
    ) -> None:
        self.todo, self.start, self.key = deque(items), start, key
        self.ahead = max(1, ahead)
        self.started: dict[Hashable, Started] = {}
        self.refill()

    def refill(self) -> None:
        while self.todo and len(self.started) < self.ahead:
            item = self.todo.popleft()
            self.started[self.key(item)] = self.start(item)

    def take(self, key: Hashable) -> Started:
        """The work started for `key`; call `refill` once it is handled."""
        return self.started.pop(key)

    def stop(self) -> None:
        self.todo.clear()
        self.started.clear()


class MaskGate:
    """Aborts a run whose masked fraction exceeds the limit once enough rollouts were seen."""

    def __init__(self, limit: float | None, min_samples: int) -> None:
        self.limit, self.min_samples = limit, min_samples
        self.seen, self.reasons = 0, Counter[str]()

    def add(self, outcomes: list[RolloutOutcome]) -> None:
        for outcome in outcomes:
            if outcome.emitted:
                self.seen += 1
                if outcome.masked:
                    self.reasons[reason_category(outcome.mask_reason)] += 1

    def exceeded(self) -> str | None:
        """Why the run must stop, or `None` while the masked fraction is within the limit."""
        masked = sum(self.reasons.values())
        if self.limit is None or self.seen < self.min_samples or masked <= self.limit * self.seen:
            return None
        reasons = ", ".join(f"{reason} ({count})" for reason, count in self.reasons.most_common())
        return (
            f"masked fraction {masked}/{self.seen} = {masked / self.seen:.3f} exceeds "
            f"max_mask_fraction {self.limit}; reasons: {reasons}. Nothing masked was retired; "
            "fix the capture and rerun the same run id"
        )


def _handed_off_lines(receipt: HandoffReceipt, retire: RetireOutcome) -> Iterable[LedgerLine]:
    for rollout in receipt.rollouts:
        rid = rollout.rollout_id or ""
        kept = retire.kept.get(rid) or retire.disagreed.get(rid)
        waits = rollout.can_retire and not rollout.masked and rid not in retire.retired
        yield LedgerLine(
            **rollout.figures(),
            finalized=rollout.emitted,
            handed_off=rollout.emitted,
            retired=rid in retire.retired,
            kept=kept is not None and rollout.error is None,
            error=rollout.error or retire.failed.get(rid) or kept,
            awaiting_consumer=retire.waiting_for if waits else None,
        )


def ledger_lines(
    receipts: list[HandoffReceipt],
    retirements: Mapping[str, RetireOutcome],
    failed_batches: Mapping[int, tuple[list[RolloutOutcome], str]],
) -> list[LedgerLine]:
    """The run ledger, in input order: handed-off batches and failed ones."""
    lines: list[LedgerLine] = []
    for receipt in receipts:
        retire = retirements.get(receipt.receipt_key, RetireOutcome(receipt_key=""))
        lines.extend(_handed_off_lines(receipt, retire))
    for outcomes, error in failed_batches.values():
        lines.extend(
            LedgerLine(
                rollout_id=rollout.rollout_id,
                line=rollout.line,
                finalized=rollout.emitted,
                handed_off=False,
                masked=rollout.masked,
                mask_reason=rollout.mask_reason,
                error=rollout.error or error,
            )
            for rollout in outcomes
        )
    return sorted(lines, key=lambda line: line.line)


class RunTally(BaseModel):
    """Each batch's fate in one finalize run, reported in input order, and the mask gate.

    `abort` is set once the gate trips; no batch is handed off after it.
    """

    run_id: str
    earlier: int = 0
    receipts: list[HandoffReceipt] = Field(default_factory=list)
    retirements: dict[str, RetireOutcome] = Field(default_factory=dict)
    failed: dict[int, tuple[list[RolloutOutcome], str]] = Field(default_factory=dict)
    seconds: dict[int, float] = Field(default_factory=dict)
    errors: list[str] = Field(default_factory=list)
    abort: str | None = None
    delivery: str = MAIN_CHAIN

    def batch_failed(self, index: int, outcomes: list[RolloutOutcome], message: str) -> None:
        """A batch that was not handed off: its rollouts go to the ledger with the reason."""
        self.failed[index] = (outcomes, message)
        self.errors.append(message)

    def may_hand_off(self, gate: MaskGate, index: int, outcomes: list[RolloutOutcome]) -> bool:
        """Count a finalized batch at the gate; `False` (and the run aborted) once it trips."""
        gate.add(outcomes)
        self.abort = gate.exceeded()
        if self.abort is not None:
            self.failed[index] = (outcomes, "not handed off: run aborted, " + self.abort)
        return self.abort is None

    def retired(self, receipt: HandoffReceipt, outcome: RetireOutcome) -> None:
        """Record a batch's retirement; a receipt its part refutes is an error of the run."""
        self.receipts.append(receipt)
        self.retirements[receipt.receipt_key] = outcome
        if outcome.disagreed:
            named = "; ".join(f"{k}: {v}" for k, v in sorted(outcome.disagreed.items())[:5])
            self.errors.append(
                f"batch {receipt.batch}: receipt {receipt.receipt_key} disagrees with the part "
                f"it certifies for {len(outcome.disagreed)} rollouts ({named}). Check the "
                "receipt for edits or damage; the part's records are what was handed off"
            )

    def retire_failed(self, receipt: HandoffReceipt, error: str) -> RetireOutcome:
        """A retirement that raised: each retirable rollout of the receipt failed with it."""
        self.errors.append(f"batch {receipt.batch}: retirement failed: {error}")
        return RetireOutcome(
            receipt_key=receipt.receipt_key,
            failed={
                r.rollout_id: f"retirement failed: {error}"
                for r in receipt.rollouts
                if r.rollout_id and r.can_retire
            },
        )

    def ledger(self) -> list[LedgerLine]:
        return ledger_lines(self.receipts, self.retirements, self.failed)

    def all_errors(self) -> list[str]:
        """The run's errors, the abort reason last."""
        return self.errors + ([self.abort] if self.abort else [])


class RetriggerReport(BaseModel):
    """What a re-run changed in a run's ledger, by rollout id (or `line N` without one)."""

    run_id: str
    newly_handed_off: list[str] = Field(default_factory=list)
    newly_retired: list[str] = Field(default_factory=list)
    still_failing: list[str] = Field(default_factory=list)


def ledger_changes(
    run_id: str, before: list[LedgerLine], after: list[LedgerLine]
) -> RetriggerReport:
    """Diff two ledgers of one run: what became handed off or retired, and what still fails."""
    old = {(line.line, line.rollout_id): line for line in before}
    changes = RetriggerReport(run_id=run_id)
    for line in after:
        earlier = old.get((line.line, line.rollout_id))
        name = line.rollout_id or f"line {line.line}"
        if line.handed_off and not (earlier and earlier.handed_off):
            changes.newly_handed_off.append(name)
        if line.retired and not (earlier and earlier.retired):
            changes.newly_retired.append(name)
        if not line.handed_off or line.error:
            changes.still_failing.append(name)
    return changes


def retire_counts(receipts: list[HandoffReceipt], outcomes: list[RetireOutcome]) -> dict[str, int]:
    """What a retire pass did: retired now, retired by an earlier run, kept captures, and
    captures waiting for a row consumer's acknowledgement."""
    pairs = list(zip(receipts, outcomes, strict=True))
    return {
        "receipts": len(receipts),
        "retired": sum(len(o.retired) for o in outcomes if not o.earlier),
        "retired_earlier": sum(len(o.retired) for o in outcomes if o.earlier),
        "kept": sum(len(o.kept) + len(o.disagreed) for o in outcomes)
        + sum(map(kept_as_evidence, receipts)),
        "waiting": sum(marked_retirable(r) for r, o in pairs if o.waiting_for),
    }
