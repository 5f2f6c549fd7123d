"""Tasks over one batch of rollouts: plan, finalize, upload (the handoff), retire.

Each task is one retryable side effect; the logic lives in `capture_core.handoff`.
Transient storage failures are retried with backoff; bad input is not.
The upload task's persisted result is the handoff receipt, keyed by the batch it certifies.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from capture_core.errors import RetirementFailedError, TransientStoreError
from capture_core.faults import crash_point
from capture_core.handoff import (
    FinalizedBatch,
    HandoffReceipt,
    RetireOutcome,
    RolloutOutcome,
    finalize_batch,
    handoff_batch,
    input_error,
    open_source,
    plain_rollout_id,
    retire_receipt,
    store_identity,
)
from capture_core.rollout_io import BatchPlan, RolloutFilePlan, plan_rollout_file, read_batch
from capture_core.store import open_byte_store
from tasks.common import TRANSIENT_RETRIES, run_async
from tasks.receipts import list_receipt_keys, read_receipt


@task(name="plan-rollouts", cache_policy=NO_CACHE, **TRANSIENT_RETRIES)
def plan_rollouts(
    rollouts: str, batch_size: int, storage_options: Mapping[str, Any] | None = None
) -> RolloutFilePlan:
    """Stream the rollout file once into batch byte ranges."""
    plan = plan_rollout_file(rollouts, batch_size, storage_options)
    get_run_logger().info(
        "planned %d rollouts of %s into %d batches", plan.rollouts, rollouts, len(plan.batches)
    )
    return plan


@task(name="find-receipt", cache_policy=NO_CACHE, **TRANSIENT_RETRIES)
def find_receipt(
    dest: str, run_id: str, key: str, storage_options: Mapping[str, Any] | None = None
) -> HandoffReceipt | None:
    """The receipt of a batch already handed off, if any."""
    return read_receipt(dest, run_id, key, storage_options)


@task(name="finalize-batch", cache_policy=NO_CACHE, **TRANSIENT_RETRIES)
def finalize_rollout_batch(
    run_id: str,
    rollouts: str,
    batch: BatchPlan,
    store: str,
    storage_options: Mapping[str, Any] | None = None,
    source_kwargs: Mapping[str, Any] | None = None,
    builder: str = "prefix_merging",
) -> FinalizedBatch:
    """Freeze and rebuild every rollout of one batch; nothing is written or retired."""
    lines = read_batch(rollouts, batch, storage_options)
    source = open_source(store, storage_options, source_kwargs)
    finalized = run_async(finalize_batch(run_id, batch, lines, source, builder))
    masked = sum(o.masked for o in finalized.outcomes)
    get_run_logger().info(
        "batch %d: finalized %d rollouts (%d masked)", batch.index, len(lines), masked
    )
    return finalized


def _receipt_key(parameters: Mapping[str, Any]) -> str:
    return parameters["finalized"].receipt_key


@task(
    name="upload-batch",
    persist_result=True,
    result_serializer="json",
    cache_key_fn=lambda context, parameters: _receipt_key(parameters),
    **TRANSIENT_RETRIES,
)
def upload_batch(
    run_id: str,
    finalized: FinalizedBatch,
    dest: str,
    storage_options: Mapping[str, Any] | None = None,
) -> HandoffReceipt:
    """Write the batch's part durably, verify it, and return the receipt Prefect persists."""
    receipt = handoff_batch(run_id, finalized, open_byte_store(dest, storage_options))
    crash_point("after-upload")
    get_run_logger().info(
        "batch %d: handed off %d records (%d bytes, sha256 %s) to %s",
        receipt.batch,
        receipt.records,
        receipt.bytes,
        receipt.sha256[:12],
        receipt.part_key,
    )
    return receipt


def _retired_key(parameters: Mapping[str, Any]) -> str:
    """A retirement is valid for this receipt against this capture store only."""
    store = store_identity(
        parameters["store"], parameters.get("storage_options"), parameters.get("source_kwargs")
    )
    return f"{parameters['receipt'].receipt_key}-retired-{store}"


@task(
    name="retire-batch",
    persist_result=True,
    result_serializer="json",
    cache_key_fn=lambda context, parameters: _retired_key(parameters),
    **TRANSIENT_RETRIES,
)
def retire_batch(
    receipt: HandoffReceipt,
    dest: str,
    store: str,
    storage_options: Mapping[str, Any] | None = None,
    source_kwargs: Mapping[str, Any] | None = None,
) -> RetireOutcome:
    """Retire the batch's retirable captures once its receipt is persisted and its part matches."""
    crash_point("after-receipt")
    persisted = read_receipt(dest, receipt.run_id, receipt.receipt_key, storage_options)
    if persisted is None or persisted.sha256 != receipt.sha256:
        raise RuntimeError(
            f"batch {receipt.batch}: no persisted receipt {receipt.receipt_key}; nothing "
            "retired. Rerun the run (tokcap retrigger) to persist it, then retire"
        )
    source = open_source(store, storage_options, source_kwargs)
    outcome = run_async(retire_receipt(persisted, source, open_byte_store(dest, storage_options)))
    logger = get_run_logger()
    logger.info(
        "batch %d: retired %d captures, kept %d",
        receipt.batch,
        len(outcome.retired),
        len(outcome.kept),
    )
    if outcome.failed:
        error = TransientStoreError if outcome.transient else RetirementFailedError
        raise error(
            f"batch {receipt.batch}: {len(outcome.failed)} retirements failed, captures kept: "
            + "; ".join(f"{k}: {v}" for k, v in sorted(outcome.failed.items())[:5])
        )
    return outcome


@task(name="find-receipts", cache_policy=NO_CACHE, **TRANSIENT_RETRIES)
def find_receipts(
    dest: str,
    run_id: str,
    keys: list[str] | None,
    storage_options: Mapping[str, Any] | None = None,
) -> dict[str, HandoffReceipt]:
    """Receipts of these batches (every receipt persisted for the run when `keys` is None)."""
    found = {}
    for key in list_receipt_keys(dest, run_id, storage_options) if keys is None else keys:
        receipt = read_receipt(dest, run_id, key, storage_options)
        if receipt is not None:
            found[key] = receipt
    return found


@task(name="describe-failed-batch", cache_policy=NO_CACHE, **TRANSIENT_RETRIES)
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
