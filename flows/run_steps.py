"""The tasks of one run, bound to its locations: finalize ahead, hand off, retire.

`RunSteps` is what `finalize_run` and `retire_uploaded` drive batch by batch: each step
reports its batch's fate to the run's tally, and a batch is retired only after its receipt
was stored (and, with `retire_after_consumer`, once that consumer acknowledged its part).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from prefect import Task, get_run_logger
from prefect.futures import PrefectFuture
from prefect.utilities.annotations import quote

from capture_core.builder.trace_envelope import MAIN_CHAIN
from capture_core.errors import ClaimLostError
from capture_core.operator.run_progress import (
    Lookahead,
    MaskGate,
    RunTally,
)
from capture_core.run.batch_finalize import FinalizedBatch
from capture_core.run.capture_source import SourceSpec
from capture_core.run.crash_points import crash_point
from capture_core.run.inbox import Claim
from capture_core.run.receipt import HandoffReceipt, RolloutOutcome
from capture_core.run.retirement import RetireOutcome
from capture_core.run.rollout_io import BatchPlan
from tokcap.tasks.batches import (
    describe_batch,
    finalize_batch,
    retire_batch,
    upload_batch,
)
from tokcap.tasks.consumers import acknowledged
from tokcap.tasks.receipts import (
    ReceiptStorage,
    UnrecordedReceiptError,
    receipt_storage,
)

RECEIPT_NOT_STORED = (
    "its part was written and verified, but its receipt could not be stored at the "
    "destination (the flow-run logs have the storage error), so it is not handed off and "
    "nothing of it was retired; the next run of this run id hands it off again"
)


@dataclass
class RunSteps:
    """The tasks of one run, bound to its locations; each reports its batch's fate to a tally.

    With `retire_after_consumer`, a batch is retired only once that consumer acknowledged
    its rows part; until then its receipt is tallied with nothing retired. The receipt
    storage block is prepared on the task runner while the first batches finalize (an API
    call, and a save when the destination's block is missing or was edited). The first
    upload or retire waits for it; a failure fails the run there, before any receipt.
    """

    run_id: str
    dest: str
    source: SourceSpec
    options: dict[str, Any]
    rollouts: str = ""
    builder: str = "prefix_merging"
    claim: Claim | None = None
    rows: str = "none"
    retire_after_consumer: str | None = None
    delivery: str = MAIN_CHAIN
    storage: PrefectFuture[ReceiptStorage] = field(init=False)

    def __post_init__(self) -> None:
        self.storage = receipt_storage.submit(self.dest, self.options)

    @cached_property
    def run_storage(self) -> ReceiptStorage:
        """The destination's block, waited for, resolving bare result keys under this run."""
        return self.storage.result().for_run(self.run_id)

    @cached_property
    def upload(self) -> Task[..., HandoffReceipt]:
        return upload_batch.with_options(result_storage=self.run_storage)

    @cached_property
    def retire_task(self) -> Task[..., RetireOutcome]:
        return retire_batch.with_options(result_storage=self.run_storage)

    def finalize(self, batch: BatchPlan) -> PrefectFuture[FinalizedBatch | HandoffReceipt]:
        args = (self.run_id, self.rollouts, batch, self.source, self.options)
        return finalize_batch.submit(
            *args, self.builder, self.dest, rows=self.rows, delivery=self.delivery
        )

    def run_batch(
        self,
        batch: BatchPlan,
        earlier: HandoffReceipt | None,
        finalizing: Lookahead[BatchPlan, PrefectFuture[FinalizedBatch | HandoffReceipt]],
        tally: RunTally,
        gate: MaskGate,
    ) -> None:
        """Hand a batch off (unless an earlier run did, or the run aborted), then retire it."""
        started, receipt = time.perf_counter(), earlier
        if receipt is not None:
            get_run_logger().info(
                "batch %d was handed off by an earlier run; not finalized again", batch.index
            )
            gate.add(receipt.rollouts)
        elif tally.abort is None:
            receipt = self.hand_off(batch, finalizing.take(batch.index), tally, gate)
            if tally.abort is None:
                finalizing.refill()
            else:
                finalizing.stop()
        else:
            tally.not_started(batch.first_line, batch.lines)
        if receipt is not None:
            self.retire(receipt, tally)
        tally.seconds[batch.index] = time.perf_counter() - started

    def hand_off(
        self,
        batch: BatchPlan,
        finalizing: PrefectFuture[FinalizedBatch | HandoffReceipt],
        tally: RunTally,
        gate: MaskGate,
    ) -> HandoffReceipt | None:
        """Wait for the batch's finalize, pass the mask gate, then upload; `None` if not.

        A receipt that another pass persisted meanwhile stands instead of this pass's build.
        """
        try:
            finalized = finalizing.result()
        except Exception as exc:
            outcomes = describe_batch(self.rollouts, batch, self.options)
            self.batch_failed(tally, batch.index, outcomes, f"finalize failed: {exc}")
            return None
        if isinstance(finalized, HandoffReceipt):
            return self.handed_off_meanwhile(finalized, tally, gate)
        crash_point("after-finalize")
        if not tally.may_hand_off(gate, batch.index, finalized.outcomes):
            return None
        return self.upload_receipt(finalized, tally)

    def upload_receipt(self, finalized: FinalizedBatch, tally: RunTally) -> HandoffReceipt | None:
        """Upload the batch; its receipt once Prefect persisted it, else `None` (the batch
        failed, with why: the upload failed, or its receipt could not be stored).

        Prefect logs a failed commit of a task's result and still completes the task; a
        receipt that was not stored hands nothing off, so its batch fails here instead.
        """
        upload = self.upload  # outside the try: unprepared receipt storage fails the run
        try:
            # quote: Prefect would otherwise walk every outcome and the part looking for
            # futures, twice per task; a finished batch holds none.
            args = (self.run_id, quote(finalized), self.dest, self.options)
            state = upload(*args, claim=self.claim, return_state=True)
            receipt = state.result()
        except (ClaimLostError, UnrecordedReceiptError):
            raise  # a lost claim writes nothing more; an unrecorded receipt may be retired
        except Exception as exc:
            self.batch_failed(tally, finalized.index, finalized.outcomes, f"upload failed: {exc}")
            return None
        if not getattr(state.data, "is_persisted", True):
            self.batch_failed(tally, finalized.index, finalized.outcomes, RECEIPT_NOT_STORED)
            return None
        get_run_logger().info(
            "batch %d: handed off %d records (%d bytes, sha256 %s) to %s",
            receipt.batch,
            receipt.records,
            receipt.bytes,
            receipt.sha256[:12],
            receipt.part_key,
        )
        return receipt

    def batch_failed(
        self, tally: RunTally, index: int, outcomes: list[RolloutOutcome], what: str
    ) -> None:
        """A batch that was not handed off: one line now, and its rollouts in the ledger."""
        message = f"batch {index}: {what}"
        get_run_logger().warning("%s", message)
        tally.batch_failed(index, outcomes, message)

    def handed_off_meanwhile(
        self, receipt: HandoffReceipt, tally: RunTally, gate: MaskGate
    ) -> HandoffReceipt:
        """Another pass handed the batch off while this one finalized it: its receipt stands.

        This pass's build is dropped: its captures may be retired by now, and rebuilding
        them would mask rollouts whose records are already handed off.
        """
        get_run_logger().info(
            "batch %d was handed off by another pass meanwhile; its receipt stands", receipt.batch
        )
        tally.earlier.append(receipt.receipt_key)
        gate.add(receipt.rollouts)
        return receipt

    def retire(self, receipt: HandoffReceipt, tally: RunTally) -> RetireOutcome:
        """Retire a handed-off batch and record the outcome (cached: an earlier run's).

        An acknowledgement that cannot be trusted (unreadable, or naming other bytes) fails
        the batch's retirement like any other retire error: nothing of it is retired.
        """
        args = (quote(receipt), self.dest, self.source, self.options)
        retire = self.retire_task  # outside the try: unprepared receipt storage fails the run
        try:
            if self.retire_after_consumer is not None and not self.consumed(receipt):
                waiting = self.retire_after_consumer
                outcome = RetireOutcome(receipt_key=receipt.receipt_key, waiting_for=waiting)
            else:
                state = retire(*args, claim=self.claim, return_state=True)
                outcome = state.result()
                outcome.earlier = state.name == "Cached"
        except ClaimLostError:
            raise
        except Exception as exc:
            outcome = tally.retire_failed(receipt, str(exc), getattr(exc, "outcome", None))
            get_run_logger().warning("%s", tally.errors[-1])
        tally.retired(receipt, outcome)
        return outcome

    def consumed(self, receipt: HandoffReceipt) -> bool:
        """Whether the gating consumer acknowledged the batch; logged when it has not."""
        consumer = self.retire_after_consumer or ""
        if acknowledged(self.dest, quote(receipt), consumer, self.options):
            return True
        get_run_logger().info(
            "batch %d: not retired yet, waiting for consumer %s to acknowledge its rows",
            receipt.batch,
            consumer,
        )
        return False
