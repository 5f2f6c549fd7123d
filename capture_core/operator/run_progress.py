"""What a finalize run has done so far: the mask gate, the run's tally, its ledger, and diffs.

This is the pure bookkeeping of a run, kept apart from the tasks that do its side effects:
the flow reports each batch's fate here and writes the ledger this builds.
This module does not import Prefect.
"""

from __future__ import annotations

import math
import re
from collections import Counter, deque
from collections.abc import Callable, Hashable, Iterable, Mapping
from fractions import Fraction
from typing import Generic, TypeVar

from pydantic import BaseModel, Field

from capture_core.builder.trace_envelope import MAIN_CHAIN
from capture_core.operator.mask_reasons import (
    ReasonKind,
    infrastructure_counts,
    kind_counts,
    kinds_of,
)
from capture_core.operator.run_report import RunSummary, locate, reason_category, spans, summarize
from capture_core.run.receipt import (
    HandoffReceipt,
    RolloutOutcome,
    kept_as_evidence,
    marked_retirable,
)
from capture_core.run.retirement import RetireOutcome
from capture_core.run.run_layout import LedgerLine

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


def _exact(fraction: float | None) -> Fraction:
    """A limit as its decimal (0.29 is 29/100), so a fraction at the limit passes."""
    return Fraction(repr(fraction))


class MaskGate:
    """Aborts a run whose masked fraction exceeds the limit once enough rollouts were seen,
    and one whose rollouts mask for an infrastructure reason (version skew, an unreadable
    store) beyond the alert threshold `alert`, from the first batch on: those rollouts are
    not at fault, so their batches are held back for a retrigger once the cause is fixed."""

    def __init__(self, limit: float | None, min_samples: int, alert: float | None = None) -> None:
        self.limit, self.min_samples, self.alert = limit, min_samples, alert
        self.seen, self.reasons = 0, Counter[str]()

    def add(self, outcomes: list[RolloutOutcome]) -> None:
        for outcome in outcomes:
            if outcome.emitted:
                self.seen += 1
                if outcome.masked:
                    self.reasons[reason_category(outcome.mask_reason)] += 1

    def infrastructure(self, batch: int | None = None) -> str | None:
        """Why the run must stop for infrastructure masks, or `None` while they are within
        the alert threshold (no threshold: never)."""
        counts = infrastructure_counts(self.reasons)
        masked = sum(count for _, count in counts)
        if self.alert is None or not masked or Fraction(masked, self.seen) <= _exact(self.alert):
            return None
        return infrastructure_stop(counts, self.seen, self.alert, batch)

    def within(self, masked: int) -> bool:
        """Whether `masked` of the rollouts seen is at most the limit, compared exactly: the
        limit as its decimal (0.29 is 29/100), so the advised threshold always passes."""
        return self.seen == 0 or Fraction(masked, self.seen) <= _exact(self.limit)

    def exceeded(self, batch: int | None = None) -> str | None:
        """Why the run must stop at `batch`, or `None` while the masked fraction is within
        the limit.

        The fraction is judged after every batch, over the rollouts seen so far, so a later
        batch can raise it again: the advice names the limit that passes this batch only, and
        the one that gets the whole file through whatever later batches mask (1).
        """
        infrastructure = self.infrastructure(batch)
        if infrastructure is not None:
            return infrastructure
        masked = sum(self.reasons.values())
        if self.limit is None or self.seen < self.min_samples or self.within(masked):
            return None
        passes = math.ceil(1000 * masked / self.seen) / 1000
        here = "this batch" if batch is None else f"batch {batch}"
        at = "" if batch is None else f" at {here}"
        fewer = " ".join(f"{k.title.capitalize()}: {k.action}." for k, _ in kinds_of(self.reasons))
        return (
            f"masked fraction {masked}/{self.seen} = {masked / self.seen:.3f} exceeds "
            f"max_mask_fraction {self.limit}{at}; reasons: {kind_counts(self.reasons)}. "
            f"Nothing finalized from {here} on was "
            "handed off or retired. The fraction is judged after every batch, over the rollouts "
            f"finalized so far, so a later batch can raise it again: --max-mask-fraction "
            f"{passes:g} gets this run past {here} only. To get the whole file through, "
            "finalize again with the same run id and --max-mask-fraction 1: every rollout is "
            "handed off, the masked ones marked mask_sample: true, which trainers skip "
            f"(tokcap retrigger keeps the recorded limit). To mask fewer: {fewer}"
        )


def infrastructure_stop(
    counts: list[tuple[ReasonKind, int]], seen: int, alert: float, batch: int | None
) -> str:
    """Why a run stops for rollouts masked for infrastructure reasons, and what to do."""
    masked = sum(count for _, count in counts)
    here = "this batch" if batch is None else f"batch {batch}"
    causes = " ".join(f"{k.title.capitalize()}: {k.meaning}; {k.action}." for k, _ in counts)
    titles = kind_counts({kind.title: count for kind, count in counts})
    return (
        f"{masked} of {seen} rollouts finalized so far masked for {titles}, above the alert "
        "threshold "
        f"(mask_alert_fraction {alert}): the store or this tokcap is at fault, not the "
        f"rollouts. Nothing finalized from {here} on was handed off or retired, and their "
        f"captures are kept. {causes}"
    )


def _handed_off_lines(
    receipt: HandoffReceipt, retire: RetireOutcome, earlier: bool
) -> Iterable[LedgerLine]:
    for rollout in receipt.rollouts:
        rid = rollout.rollout_id or ""
        kept = retire.kept.get(rid) or retire.disagreed.get(rid)
        retired = rid in retire.retired
        waits = rollout.can_retire and not rollout.masked and not retired
        yield LedgerLine(
            **rollout.figures(),
            finalized=rollout.emitted,
            handed_off=rollout.emitted,
            retired=retired,
            retired_earlier=retired and retire.earlier,
            kept=kept is not None and rollout.error is None,
            error=rollout.error or retire.failed.get(rid) or kept,
            awaiting_consumer=retire.waiting_for if waits else None,
            earlier=earlier and rollout.emitted,
        )


GATED = "not handed off: the mask gate stopped the run at this batch"
NOT_STARTED = "not started: the run stopped before this batch"


def ledger_lines(
    receipts: list[HandoffReceipt],
    retirements: Mapping[str, RetireOutcome],
    failed_batches: Mapping[int, tuple[list[RolloutOutcome], str]],
    earlier: Iterable[str] = (),
    unstarted: Iterable[tuple[int, int]] = (),
) -> list[LedgerLine]:
    """The run ledger, in input order: handed-off, failed, gated and unstarted batches.

    `earlier` names the receipts an earlier run (or pass) of the run id persisted;
    `unstarted` holds the first line and line count of each batch the run never started.
    A gated batch's lines carry `GATED`: the gate's reason is the run's error, once.
    """
    lines: list[LedgerLine] = []
    before = set(earlier)
    for receipt in receipts:
        retire = retirements.get(receipt.receipt_key, RetireOutcome(receipt_key=""))
        lines.extend(_handed_off_lines(receipt, retire, receipt.receipt_key in before))
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
                gated=error == GATED and rollout.emitted,
            )
            for rollout in outcomes
        )
    for first, count in unstarted:
        lines.extend(
            LedgerLine(
                rollout_id=None,
                line=n,
                finalized=False,
                handed_off=False,
                masked=False,
                error=NOT_STARTED,
                not_started=True,
            )
            for n in range(first, first + count)
        )
    return sorted(lines, key=lambda line: line.line)


class RunTally(BaseModel):
    """Each batch's fate in one finalize run, reported in input order, and the mask gate.

    `abort` is set once the gate trips; no batch is handed off after it. `earlier` holds the
    receipt keys of batches an earlier run (or another pass) handed off.
    """

    run_id: str
    earlier: list[str] = Field(default_factory=list)
    unstarted: list[tuple[int, int]] = Field(default_factory=list)
    """First line and line count of each batch the run never started (it stopped first)."""
    receipts: list[HandoffReceipt] = Field(default_factory=list)
    retirements: dict[str, RetireOutcome] = Field(default_factory=dict)
    failed: dict[int, tuple[list[RolloutOutcome], str]] = Field(default_factory=dict)
    seconds: dict[int, float] = Field(default_factory=dict)
    errors: list[str] = Field(default_factory=list)
    abort: str | None = None
    delivery: str = MAIN_CHAIN
    ledger_error: str | None = None
    """Why the run's ledger could not be written (the next run of the run id writes it)."""

    def batch_failed(self, index: int, outcomes: list[RolloutOutcome], message: str) -> None:
        """A batch that was not handed off: its rollouts go to the ledger with the reason."""
        self.failed[index] = (outcomes, message)
        self.errors.append(message)

    def may_hand_off(self, gate: MaskGate, index: int, outcomes: list[RolloutOutcome]) -> bool:
        """Count a finalized batch at the gate; `False` (and the run aborted) once it trips."""
        gate.add(outcomes)
        self.abort = gate.exceeded(index)
        if self.abort is not None:
            self.failed[index] = (outcomes, GATED)
        return self.abort is None

    def not_started(self, first_line: int, lines: int) -> None:
        """A batch the run never finalized: its lines go to the ledger as not started."""
        self.unstarted.append((first_line, lines))

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

    def retire_failed(
        self, receipt: HandoffReceipt, error: str, partial: RetireOutcome | None = None
    ) -> RetireOutcome:
        """A retirement that raised: each retirable rollout of the receipt failed with it, or,
        given what the retirement did (`partial`), exactly the rollouts that it failed."""
        inner = _without_batch(error)
        cause = inner.removeprefix(RETIREMENTS_FAILED)
        self.errors.append(
            f"batch {receipt.batch}: {inner if cause != inner else RETIREMENT_FAILED + cause}"
        )
        reason = RETIREMENT_FAILED + cause  # the same words for every rollout of an outage
        if partial is not None:
            return partial.model_copy(update={"failed": dict.fromkeys(partial.failed, reason)})
        return RetireOutcome(
            receipt_key=receipt.receipt_key,
            failed={
                r.rollout_id: reason for r in receipt.rollouts if r.rollout_id and r.can_retire
            },
        )

    def ledger(self) -> list[LedgerLine]:
        return ledger_lines(
            self.receipts, self.retirements, self.failed, self.earlier, self.unstarted
        )

    def ledger_failed(self, error: str) -> None:
        """The ledger could not be written: an error of the run; its summary still stands."""
        self.ledger_error = (
            f"{error}. This summary is not recorded; the next run of this run id writes the "
            "ledger, and `tokcap status` meanwhile counts the receipts"
        )

    def summary(self, dest: str, ledger: list[LedgerLine] | None = None) -> RunSummary:
        """What the run did, from its ledger lines (`ledger`, when built already), with its
        errors; located at `dest` (without a ledger location when it could not be written)."""
        lines = self.ledger() if ledger is None else ledger
        summary = locate(summarize(self.run_id, lines), dest)
        summary.delivery = self.delivery
        summary.errors = self.all_errors()
        if self.ledger_error is not None:
            summary.ledger = ""
        return summary

    def all_errors(self) -> list[str]:
        """The run's errors, each once (batches failing alike are one line), then a ledger
        that could not be written, the abort last."""
        ledger = [self.ledger_error] if self.ledger_error else []
        return group_batch_errors(self.errors) + ledger + ([self.abort] if self.abort else [])


BATCH_PREFIX = re.compile(r"^batch (\d+): ")
RETIREMENTS_FAILED = "retirements failed, captures kept: "
"""How a retire task's error begins; the distinct causes follow (no rollout ids)."""
RETIREMENT_FAILED = "retirement failed: "


def _without_batch(error: str) -> str:
    return BATCH_PREFIX.sub("", error, count=1)


def group_batch_errors(errors: list[str]) -> list[str]:
    """One line per distinct error: `batches 0-2, 5: <error>` for batches that failed alike
    (a store outage fails every batch the same way), in order of first appearance."""
    grouped: dict[str, list[int]] = {}
    for error in errors:
        found = BATCH_PREFIX.match(error)
        key = _without_batch(error) if found else error
        grouped.setdefault(key, []).extend([int(found.group(1))] if found else [])
    return [
        f"{_batches(indexes)}: {text}" if indexes else text for text, indexes in grouped.items()
    ]


def _batches(indexes: list[int]) -> str:
    """`batch 3`, `batches 0-2, 5`."""
    return ("batch " if len(indexes) == 1 else "batches ") + spans(indexes, most=len(indexes))


class RetriggerReport(BaseModel):
    """What a re-run did to a run, by rollout id (or `line N` without one).

    `newly_*` is what this re-run itself handed off or retired; `handed_off_earlier` and
    `retired_earlier` count what earlier runs of the run id did, recorded in a ledger or
    not (a run interrupted before its ledger leaves only receipts and retirements).
    """

    run_id: str
    newly_handed_off: list[str] = Field(default_factory=list)
    newly_retired: list[str] = Field(default_factory=list)
    still_failing: list[str] = Field(default_factory=list)
    handed_off_earlier: int = 0
    retired_earlier: int = 0

    def describe(self) -> str:
        """`2 newly handed off (4 by an earlier run), 2 newly retired, 0 still failing`."""
        return (
            f"{len(self.newly_handed_off)} newly handed off{_by_earlier(self.handed_off_earlier)}, "
            f"{len(self.newly_retired)} newly retired{_by_earlier(self.retired_earlier)}, "
            f"{len(self.still_failing)} still failing"
        )


def _by_earlier(count: int) -> str:
    return f" ({count} by an earlier run)" if count else ""


def ledger_changes(
    run_id: str, before: list[LedgerLine], after: list[LedgerLine]
) -> RetriggerReport:
    """What a re-run changed, from the ledgers before and after it: what it handed off or
    retired itself (not what its ledger marks `earlier` or `retired_earlier`, nor what the
    ledger before already showed), and what still fails."""
    old = {(line.line, line.rollout_id): line for line in before}
    changes = RetriggerReport(run_id=run_id)
    for line in after:
        known = old.get((line.line, line.rollout_id))
        name = line.rollout_id or f"line {line.line}"
        if line.handed_off:
            earlier = line.earlier or (known is not None and known.handed_off)
            changes.handed_off_earlier += earlier
            if not earlier:
                changes.newly_handed_off.append(name)
        if line.retired:
            earlier = line.retired_earlier or (known is not None and known.retired)
            changes.retired_earlier += earlier
            if not earlier:
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
