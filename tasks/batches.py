"""Tasks over one batch of rollouts: plan, finalize, upload (the handoff), retire.

Each task is one retryable side effect; the logic lives in `capture_core.run`
(`batch_finalize`, `part_upload`, `retirement`).
Transient storage failures are retried with backoff; bad input is not.
The upload task's persisted result is the handoff receipt, keyed by the batch it certifies.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import create_table_artifact

from capture_core.builder.trace_envelope import MAIN_CHAIN
from capture_core.errors import RetirementFailedError, TransientStoreError
from capture_core.operator.run_progress import RETIREMENTS_FAILED
from capture_core.operator.run_report import masked_line, plural
from capture_core.run import batch_finalize
from capture_core.run.batch_finalize import FinalizedBatch, input_error
from capture_core.run.capture_source import SourceSpec
from capture_core.run.concurrency import finalize_concurrency
from capture_core.run.crash_points import crash_point
from capture_core.run.finalize import plain_rollout_id
from capture_core.run.inbox import Claim
from capture_core.run.part_upload import handoff_batch
from capture_core.run.receipt import (
    HandoffReceipt,
    RolloutOutcome,
    kept_as_evidence,
    receipt_key,
    retirement_key,
)
from capture_core.run.retirement import RetireOutcome, retire_receipt
from capture_core.run.rollout_io import BatchPlan, RolloutFilePlan, plan_rollout_file, read_batch
from capture_core.storage import open_byte_store
from tokcap.tasks.common import TRANSIENT_RETRIES, ensure_claim, run_async, tokcap_task
from tokcap.tasks.receipts import (
    UnrecordedReceiptError,
    read_receipt,
    result_path,
    set_aside_unrecorded,
)
from tokcap.tasks.store_limit import store_requests

StorageOptions = Mapping[str, Any] | None


def persisted_task(name: str, run_name: Callable[..., str], key: Callable[..., str]) -> Any:
    """A retried task whose JSON result is persisted under `key(context, parameters)`."""
    return task(
        name=name,
        task_run_name=run_name,
        cache_key_fn=key,
        persist_result=True,
        result_serializer="json",
        **TRANSIENT_RETRIES,
    )


@tokcap_task("plan-rollouts", "plan batches of {batch_size} from {rollouts}")
def plan_rollouts(
    rollouts: str,
    batch_size: int,
    storage_options: Mapping[str, Any] | None = None,
    grouping: Mapping[str, Any] | None = None,
) -> RolloutFilePlan:
    """Stream the rollout file into batch byte ranges (`plan_rollout_file`; `grouping` holds
    its `group_by` and `max_group_size`: with `group_by="task"` it reads the file twice, and
    its refusals fail this task before anything runs)."""
    plan = plan_rollout_file(rollouts, batch_size, storage_options, **(grouping or {}))
    get_run_logger().info(
        "planned %s of %s into %s%s",
        plural(plan.rollouts, "rollout"),
        rollouts,
        plural(len(plan.batches), "batch", "batches"),
        " holding whole task groups" if (grouping or {}).get("group_by") else "",
    )
    return plan


def line_span(first: int, last: int) -> str:
    """`lines 1501-2000`, or `line 7` (input line numbers, from 1)."""
    return f"line {first}" if first == last else f"lines {first}-{last}"


def line_range(outcomes: list[RolloutOutcome]) -> str:
    """The input lines of a batch's outcomes (`line_span`)."""
    if not outcomes:
        return "no lines"
    return line_span(outcomes[0].line, outcomes[-1].line)


def batch_name(verb: str, batch: BatchPlan) -> str:
    """`<verb> batch 3 (lines 1501-2000)`: the one style of every batch task run's name."""
    last = batch.last_line or batch.first_line + batch.lines - 1  # a plan without last_line
    return f"{verb} batch {batch.index} ({line_span(batch.first_line, last)})"


def finalize_run_name(parameters: Mapping[str, Any]) -> str:
    return batch_name("finalize", parameters["batch"])


def describe_run_name(parameters: Mapping[str, Any]) -> str:
    return batch_name("describe failed", parameters["batch"])


def upload_run_name(parameters: Mapping[str, Any]) -> str:
    finalized: FinalizedBatch = parameters["finalized"]
    return f"upload batch {finalized.index} ({line_range(finalized.outcomes)})"


def retire_run_name(parameters: Mapping[str, Any]) -> str:
    receipt: HandoffReceipt = parameters["receipt"]
    return f"retire batch {receipt.batch} ({line_range(receipt.rollouts)})"


@tokcap_task("finalize-batch", finalize_run_name)
def finalize_batch(
    run_id: str,
    rollouts: str,
    batch: BatchPlan,
    source: SourceSpec,
    storage_options: Mapping[str, Any] | None = None,
    builder: str = "prefix_merging",
    dest: str | None = None,
    rows: str = "none",
    delivery: str = MAIN_CHAIN,
) -> FinalizedBatch | HandoffReceipt:
    """Freeze and rebuild every rollout of one batch; nothing is written or retired.

    With `dest`, the receipt of this batch that another pass of the run persisted meanwhile
    is returned instead. Captures are retired only after their receipt is persisted, so a
    capture this build found retired by that pass always comes with the receipt: the build,
    masked "already retired", is dropped, never delivered or counted against the mask gate.
    """
    lines = read_batch(rollouts, batch, storage_options)
    store = source.open()
    with store_requests(finalize_concurrency(store)):
        finalized = run_async(
            batch_finalize.finalize_batch(
                run_id, batch, lines, store, builder, delivery=delivery, rows=rows
            )
        )
    meanwhile = None if dest is None else _receipt_meanwhile(dest, run_id, batch, storage_options)
    if meanwhile is not None:
        return meanwhile
    masked = [o for o in finalized.outcomes if o.masked and o.emitted]
    logger = get_run_logger()
    logger.info(
        "batch %d: finalized %s (%d masked)",
        batch.index,
        plural(len(lines), "rollout"),
        len(masked),
    )
    for outcome in masked:
        logger.warning(
            "batch %d: %s",
            batch.index,
            masked_line(outcome.line, outcome.rollout_id, outcome.mask_reason),
        )
    for parsed in lines:
        if parsed.error:
            logger.warning("batch %d: %s; no record for this line", batch.index, parsed.error)
    return finalized


def _receipt_meanwhile(
    dest: str, run_id: str, batch: BatchPlan, storage_options: StorageOptions
) -> HandoffReceipt | None:
    """The receipt of `batch` another pass persisted, if it records a handoff.

    A receipt that records none (empty or torn) is left to the upload, which sets it aside.
    """
    try:
        return read_receipt(dest, run_id, receipt_key(batch), storage_options)
    except UnrecordedReceiptError:
        return None


def _receipt_key(context: Any, parameters: Mapping[str, Any]) -> str:
    return result_path(parameters["run_id"], parameters["finalized"].receipt_key)


@persisted_task("upload-batch", upload_run_name, _receipt_key)
def upload_batch(
    run_id: str,
    finalized: FinalizedBatch,
    dest: str,
    storage_options: StorageOptions = None,
    claim: Claim | None = None,
) -> HandoffReceipt:
    """Write the batch's part durably, verify it, and return the receipt Prefect persists.

    A receipt of this batch that records no handoff is set aside first, with the old part.
    The batch is handed off once the receipt is persisted: the flow logs that, not this task.
    """
    ensure_claim(dest, claim, storage_options)
    evidence = set_aside_unrecorded(dest, run_id, finalized, storage_options)
    if evidence is not None:
        get_run_logger().warning(
            "batch %d: its receipt recorded no handoff and nothing of it was retired; the old "
            "receipt and part are kept in %s and the batch is handed off again",
            finalized.index,
            evidence,
        )
    receipt = handoff_batch(run_id, finalized, open_byte_store(dest, storage_options))
    crash_point("after-upload")
    publish_receipt(receipt)
    return receipt


def _retired_key(context: Any, parameters: Mapping[str, Any]) -> str:
    """A retirement is valid for this receipt against this capture store only.

    Its object is the one earlier runs persisted their retirements as (`SourceSpec.identity`
    digests what `store`, `storage_options` and `source_kwargs` named then), so they are reused.
    """
    receipt = parameters["receipt"]
    name = retirement_key(receipt.receipt_key, parameters["source"].identity())
    return result_path(receipt.run_id, name)


@persisted_task("retire-batch", retire_run_name, _retired_key)
def retire_batch(
    receipt: HandoffReceipt,
    dest: str,
    source: SourceSpec,
    storage_options: Mapping[str, Any] | None = None,
    claim: Claim | None = None,
) -> RetireOutcome:
    """Retire the batch's retirable captures once its receipt is persisted and its part matches."""
    crash_point("after-receipt")
    ensure_claim(dest, claim, storage_options)
    persisted = read_receipt(dest, receipt.run_id, receipt.receipt_key, storage_options)
    if persisted is None or persisted.sha256 != receipt.sha256:
        raise RuntimeError(
            f"batch {receipt.batch}: no persisted receipt {receipt.receipt_key}; nothing "
            "retired. Rerun the run (tokcap retrigger) to persist it, then retire"
        )
    with store_requests():
        outcome = run_async(
            retire_receipt(persisted, source.open(), open_byte_store(dest, storage_options))
        )
    logger = get_run_logger()
    logger.info(
        "batch %d: retired %s; kept %d masked or unfinished as evidence and %d changed since "
        "frozen",
        receipt.batch,
        plural(len(outcome.retired), "capture"),
        kept_as_evidence(persisted),
        len(outcome.kept),
    )
    if outcome.failed:
        error = TransientRetirementIncomplete if outcome.transient else RetirementIncomplete
        raise error(f"batch {receipt.batch}: {retirement_failures(outcome.failed)}", outcome)
    return outcome


class RetirementIncomplete(RetirementFailedError):
    """Some retirements of a batch failed; `outcome` is what the task's last try did (the
    retired ones stay retired), so the run's ledger says which rollouts still wait."""

    def __init__(self, message: str, outcome: RetireOutcome) -> None:
        super().__init__(message)
        self.outcome = outcome

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.outcome))


class TransientRetirementIncomplete(RetirementIncomplete, TransientStoreError):
    """`RetirementIncomplete` from a failure a retry may fix (the task retries it)."""


def retirement_failures(failed: Mapping[str, str]) -> str:
    """Why a batch's retirements failed, in words every batch of one outage shares: the
    distinct errors, not the rollouts (the ledger names each one with its error)."""
    errors = sorted(set(failed.values()))
    more = f" (and {len(errors) - 3} other errors)" if len(errors) > 3 else ""
    return RETIREMENTS_FAILED + "; ".join(errors[:3]) + more


def publish_receipt(receipt: HandoffReceipt) -> None:
    """Show the receipt in the upload task run: part key, sha256, size and record count."""
    create_table_artifact(
        table=[
            {"field": "part key", "value": receipt.part_key},
            {"field": "sha256", "value": receipt.sha256},
            {"field": "bytes", "value": receipt.bytes},
            {"field": "records", "value": receipt.records},
            {"field": "receipt key", "value": receipt.receipt_key},
        ],
        description=receipt_description(receipt),
    )


def receipt_description(receipt: HandoffReceipt) -> str:
    """`receipt of batch 3 (lines 7-8), run r`: each card in the UI names its batch first.

    The UI lists a task run's artifacts in no order; the report, the flow run's own artifact,
    is listed above them all."""
    lines = [rollout.line for rollout in receipt.rollouts]
    span = f" (lines {min(lines)}-{max(lines)})" if lines else ""
    return f"receipt of batch {receipt.batch}{span}, run {receipt.run_id}"


@tokcap_task("describe-failed-batch", describe_run_name)
def describe_batch(
    rollouts: str, batch: BatchPlan, storage_options: Mapping[str, Any] | None = None
) -> list[RolloutOutcome]:
    """Rollout ids and lines of a batch that failed, so the ledger lists each of them."""
    outcomes = []
    for parsed in read_batch(rollouts, batch, storage_options):
        refused = input_error(batch, parsed)
        if refused is None:
            rollout_id = plain_rollout_id(parsed.record or {})
            refused = RolloutOutcome(line=parsed.line, rollout_id=rollout_id)
        outcomes.append(refused)
    return outcomes
