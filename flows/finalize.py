"""Finalization flows: finalize a run, and retire what was handed off.

`finalize_run` reads rollout records, finalizes each against the capture store, hands each
batch off durably (its receipt is the upload task's persisted result) and only then retires.
Re-running a run id is safe: batches with a receipt are reported as already handed off and
never finalized again. Flows hold no storage logic of their own: tasks do every side effect,
and `capture_core.run.run_progress` keeps the run's tally, mask gate and ledger diffs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from prefect import Task, flow, get_run_logger
from prefect.futures import PrefectFuture
from prefect.utilities.annotations import quote

from capture_core.builder import BUILDERS
from capture_core.builder.trace_envelope import DELIVERIES, MAIN_CHAIN
from capture_core.config import public_storage_options
from capture_core.errors import CaptureStoreError, ClaimLostError
from capture_core.run.batch_finalize import FinalizedBatch
from capture_core.run.capture_source import SourceSpec, check_separate_locations
from capture_core.run.crash_points import crash_point
from capture_core.run.inbox import Claim
from capture_core.run.receipt import HandoffReceipt, RolloutOutcome, receipt_key
from capture_core.run.retirement import RetireOutcome
from capture_core.run.rollout_io import BatchPlan
from capture_core.run.row_cursor import validate_consumer_name
from capture_core.run.run_layout import ROW_FORMATS, validate_run_id
from capture_core.run.run_progress import (
    Lookahead,
    MaskGate,
    RunTally,
    group_batch_errors,
    retire_counts,
)
from capture_core.run.run_report import RunSummary, plural, tokcap_command
from flows.alerts import alert_on_masks
from flows.progress import RunProgress
from tasks.batches import (
    describe_batch,
    finalize_batch,
    plan_rollouts,
    retire_batch,
    upload_batch,
)
from tasks.consumers import acknowledged
from tasks.receipts import ReceiptStorage, UnrecordedReceiptError, find_receipts, receipt_storage
from tasks.report import publish_report, write_run_report
from tasks.run_state import check_locations, claim_run_id, load_manifest, mark_retired

Options = dict[str, Any] | None
RECEIPT_NOT_STORED = (
    "its part was written and verified, but its receipt could not be stored at the "
    "destination (the flow-run logs have the storage error), so it is not handed off and "
    "nothing of it was retired; the next run of this run id hands it off again"
)


class RunFailedError(RuntimeError):
    """A run failed something: batches, input lines, or it was aborted; its ledger says which.

    `failures` holds one line per failure; `summary` what the run did nonetheless;
    `next_step` the sentence naming the one command that completes the run, if any.
    """

    def __init__(
        self,
        message: str,
        failures: list[str] | None = None,
        summary: Any = None,
        next_step: str = "",
    ) -> None:
        super().__init__(message)
        self.failures = failures or [message]
        self.summary = summary
        self.next_step = next_step

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.failures, self.summary, self.next_step))


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


def check_arguments(
    run_id: str,
    builder: str,
    delivery: str = MAIN_CHAIN,
    rows: str = "none",
    retire_after_consumer: str | None = None,
) -> None:
    """Refuse a bad run id, builder, delivery, rows format or consumer name before any task
    runs."""
    validate_run_id(run_id)
    if builder not in BUILDERS:
        raise ValueError(f"unknown builder {builder!r}; use one of {', '.join(BUILDERS)}")
    if delivery not in DELIVERIES:
        raise ValueError(f"unknown delivery {delivery!r}; use one of {', '.join(DELIVERIES)}")
    if rows not in ROW_FORMATS:
        raise ValueError(f"unknown rows format {rows!r}; use one of {', '.join(ROW_FORMATS)}")
    if retire_after_consumer is not None:
        validate_consumer_name(retire_after_consumer)
        if rows == "none":
            raise ValueError(
                f"retire_after_consumer={retire_after_consumer!r} needs trainer rows for the "
                "consumer to acknowledge; also set rows='parquet' (--rows parquet)"
            )


@flow(name="finalize-run", flow_run_name="finalize {run_id} from {rollouts}", log_prints=False)
def finalize_run(
    rollouts: str,
    store: str,
    dest: str,
    run_id: str,
    builder: str = "prefix_merging",
    batch_size: int = 500,
    max_mask_fraction: float | None = None,
    mask_fraction_min_samples: int = 50,
    storage_options: dict[str, Any] | None = None,
    source_kwargs: dict[str, Any] | None = None,
    finalize_ahead: int = 2,
    claim: Claim | None = None,
    rows: str = "none",
    retire_after_consumer: str | None = None,
    delivery: str = MAIN_CHAIN,
    mask_alert_fraction: float | None = 0.1,
) -> RunSummary:
    """Finalize every rollout of `rollouts` into the run's records at `dest`, then retire.

    `store` is a capture-store path or URL, or a `module.path:ClassName` source built with
    `source_kwargs`. `storage_options` apply to rollouts, store and dest; credentials come
    from the environment. `finalize_ahead` batches finalize on the task runner meanwhile.
    An inbox pass passes its `claim`: each write that decides the run's state (manifest,
    part and receipt, retirement, ledger and report) first checks that it still holds it,
    and the run stops with `ClaimLostError` once it does not. `delivery="all_traces"` adds
    each rollout's `training_traces` envelope and keeps its `response` (docs/traces.md).
    `rows="parquet"` writes each batch's trainer rows beside its part, pinned by the same
    receipt; `retire_after_consumer` then hands off but retires only the batches that row
    consumer acknowledged (a later run, `retire_uploaded` or the inbox retires the rest).
    A run that masked more than `mask_alert_fraction` of its rollouts emits an alert event
    (`flows.alerts`).
    """
    options = public_storage_options(storage_options)
    check_arguments(run_id, builder, delivery, rows, retire_after_consumer)
    check_separate_locations({"store": store, "dest": dest})
    source = SourceSpec(store=store, storage_options=options, source_kwargs=source_kwargs)
    check_locations(source, dest, options)
    plan = plan_rollouts(rollouts, batch_size, options)
    settings = (store, builder, batch_size, max_mask_fraction, mask_fraction_min_samples)
    consumer = {"rows": rows, "retire_after_consumer": retire_after_consumer}
    claim_run_id(dest, run_id, plan, *settings, options, claim, delivery=delivery, **consumer)
    steps = RunSteps(run_id, dest, source, options, rollouts, builder, claim)
    steps.delivery, steps.rows, steps.retire_after_consumer = delivery, rows, retire_after_consumer
    keys = [receipt_key(b) for b in plan.batches]
    earlier = find_receipts(dest, run_id, keys, options, hand_off_unrecorded=True)
    tally = RunTally(
        run_id=run_id,
        earlier=list(earlier),
        errors=list(filter(None, [plan.duplicates_error()])),
        delivery=delivery,
    )
    gate = MaskGate(max_mask_fraction, mask_fraction_min_samples)
    todo = [b for b in plan.batches if receipt_key(b) not in earlier]
    finalizing = Lookahead(todo, steps.finalize, lambda b: b.index, finalize_ahead)
    progress = RunProgress(run_id, plan.batches, earlier)
    for batch in plan.batches:
        steps.run_batch(batch, earlier.get(receipt_key(batch)), finalizing, tally, gate)
        progress.batch_done(masked=sum(gate.reasons.values()))
    steps.storage.result()  # prepared even when no batch needed it: a failure fails the run
    summary = report_run(dest, tally, options, claim, mask_alert_fraction)
    publish_report(summary, tally, progress.artifact)
    alert_on_masks(summary)
    raise_if_failed(summary, tally, steps)
    return summary


def report_run(
    dest: str,
    tally: RunTally,
    options: dict[str, Any],
    claim: Claim | None,
    mask_alert_fraction: float | None,
) -> RunSummary:
    """Write the run's ledger and summary table, and return its summary. A ledger that
    storage cannot take fails the run, with the summary of what it did nonetheless: the next
    run of the run id writes the ledger (`tokcap status` meanwhile reads the receipts)."""
    report = {"claim": claim, "mask_alert_fraction": mask_alert_fraction}
    try:
        return write_run_report(dest, quote(tally), options, **report)  # quote: see upload_receipt
    except (CaptureStoreError, OSError) as exc:  # not a lost claim, nor the API's artifacts
        tally.ledger_failed(f"the ledger could not be written: {exc}")
        get_run_logger().warning("%s", tally.ledger_error)
        summary = tally.summary(dest)
        summary.mask_alert_threshold = mask_alert_fraction
        return summary


def raise_if_failed(summary: RunSummary, tally: RunTally, steps: RunSteps | None = None) -> None:
    """Fail the flow run, naming each failure, unless every rollout completed.

    The message names each distinct failure once and, with `steps`, the command that
    completes the run: `tokcap retrigger` when batches were not handed off, `tokcap retire`
    when only retirements failed (a gated run has the gate's own advice).
    """
    failures = summary.errors + summary.malformed_line_errors
    if failures or not summary.ok:
        grouped = "; ".join(group_batch_errors(tally.errors))
        message = tally.abort or grouped or _malformed_message(summary)
        step = completion(summary, steps, tally) if steps is not None and not tally.abort else ""
        if step:
            message += f". {step}"
        raise RunFailedError(message, failures, summary, step)


def completion(summary: RunSummary, steps: RunSteps, tally: RunTally) -> str:
    """What the run left undone and the one command that completes it (or nothing)."""
    left = []
    if summary.retire_failed:
        left.append(f"{plural(summary.retire_failed, 'handed-off rollout')} left unretired")
    if summary.failed:
        left.append(f"{plural(summary.failed, 'rollout')} not handed off")
    kept = " (their captures are kept)" if left else ""
    if tally.ledger_error:
        left.append("the ledger unwritten")
    if not left:
        return ""
    command = "retrigger" if summary.failed or tally.ledger_error else "retire"
    line = tokcap_command(
        command,
        steps.dest,
        steps.run_id,
        steps.source.store,
        source_kwargs=bool(steps.source.source_kwargs),
        options=bool(steps.options),
    )
    return f"{' and '.join(left)}{kept}; once the cause is fixed, complete the run with: {line}"


def _malformed_message(summary: RunSummary) -> str:
    shown = "; ".join(summary.malformed_line_errors[:3])
    lines = plural(summary.malformed_lines, "malformed input line")
    return f"{lines} ({shown}); see {summary.ledger}"


@flow(name="retire-uploaded", flow_run_name="retire {run_id}")
def retire_uploaded(
    dest: str,
    run_id: str,
    store: str,
    storage_options: dict[str, Any] | None = None,
    source_kwargs: dict[str, Any] | None = None,
) -> dict[str, int]:
    """Retire the rollouts listed as retirable in the run's receipts, and only those.

    A run finalized with `retire_after_consumer` retires only the batches that consumer
    acknowledged. `retired` counts retirements done now; `retired_earlier` those an earlier run did
    against the same store (reused, not repeated).
    """
    options = public_storage_options(storage_options)
    validate_run_id(run_id)
    check_separate_locations({"store": store, "dest": dest})
    manifest = load_manifest(dest, run_id, options)
    receipts = list(find_receipts(dest, run_id, None, options).values())
    source = SourceSpec(store=store, storage_options=options, source_kwargs=source_kwargs)
    steps, tally = RunSteps(run_id, dest, source, options), RunTally(run_id=run_id)
    steps.retire_after_consumer = manifest.retire_after_consumer
    outcomes = [steps.retire(receipt, tally) for receipt in receipts]
    steps.storage.result()  # prepared even when no receipt needed it, as in finalize_run
    mark_retired(dest, run_id, [rid for o in outcomes for rid in o.retired], options)
    counts = retire_counts(receipts, outcomes)
    get_run_logger().info("run %s: %s", run_id, ", ".join(f"{k} {v}" for k, v in counts.items()))
    if tally.errors:
        errors = group_batch_errors(tally.errors)
        raise RunFailedError("; ".join(errors), errors)
    return counts
