"""Finalization flows: finalize a run, retire what was handed off, retrigger what failed.

`finalize_run` reads rollout records, finalizes each against the capture store, hands each
batch off durably (its receipt is the upload task's persisted result) and only then retires.
Re-running a run id is safe: batches with a receipt are reported as already handed off and
never finalized again. Flows hold no storage logic of their own; tasks do the work.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Mapping
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.futures import PrefectFuture
from pydantic import BaseModel, Field

from capture_core.builder import BUILDERS
from capture_core.config import public_storage_options
from capture_core.handoff import HandoffReceipt, RetireOutcome, RolloutOutcome, receipt_key
from capture_core.run_manifest import validate_run_id
from capture_core.run_report import RunSummary, reason_category
from capture_core.testing.faults import crash_point
from tasks.batches import (
    describe_batch,
    finalize_rollout_batch,
    find_receipts,
    kept_as_evidence,
    plan_rollouts,
    retire_batch,
    upload_batch,
)
from tasks.receipts import receipt_storage
from tasks.report import write_run_report
from tasks.run_state import check_locations, claim_run_id, load_ledger, load_manifest, mark_retired


class RunFailedError(RuntimeError):
    """A run failed something: batches, input lines, or it was aborted; its ledger says which.

    `failures` holds one line per failure; `summary` what the run did nonetheless.
    """

    def __init__(
        self, message: str, failures: list[str] | None = None, summary: Any = None
    ) -> None:
        super().__init__(message)
        self.failures = failures or [message]
        self.summary = summary


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
        masked = sum(self.reasons.values())
        if self.limit is None or self.seen < self.min_samples or masked <= self.limit * self.seen:
            return None
        reasons = ", ".join(f"{reason} ({count})" for reason, count in self.reasons.most_common())
        return (
            f"masked fraction {masked}/{self.seen} = {masked / self.seen:.3f} exceeds "
            f"max_mask_fraction {self.limit}; reasons: {reasons}. Nothing masked was retired; "
            "fix the capture and rerun the same run id"
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
) -> RunSummary:
    """Finalize every rollout of `rollouts` into `<dest>/<run_id>/records/`, then retire.

    `store` is a capture-store path or URL, or a `module.path:ClassName` source built with
    `source_kwargs`. `storage_options` (endpoint, region) apply to rollouts, store and dest;
    credentials come from the environment, never from parameters.
    """
    options = public_storage_options(storage_options)
    validate_run_id(run_id)
    if builder not in BUILDERS:
        raise ValueError(f"unknown builder {builder!r}; use one of {', '.join(BUILDERS)}")
    check_locations(store, dest, options, source_kwargs)
    plan = plan_rollouts(rollouts, batch_size, options)
    claim_run_id(
        dest,
        run_id,
        plan,
        store,
        builder,
        batch_size,
        max_mask_fraction,
        mask_fraction_min_samples,
        options,
    )
    storage = receipt_storage(dest, run_id, options)
    upload = upload_batch.with_options(result_storage=storage)
    retire = retire_batch.with_options(result_storage=storage)
    earlier = find_receipts(dest, run_id, [receipt_key(b) for b in plan.batches], options)
    progress = create_progress_artifact(0.0, description=f"tokcap run {run_id}: batches done")
    logger = get_run_logger()

    gate = MaskGate(max_mask_fraction, mask_fraction_min_samples)
    receipts: list[HandoffReceipt] = []
    retirements: dict[str, RetireOutcome] = {}
    failed: dict[int, tuple[list[RolloutOutcome], str]] = {}
    seconds: dict[int, float] = {}
    errors: list[str] = [plan.duplicates_error()] if plan.duplicates else []
    todo = deque(b for b in plan.batches if receipt_key(b) not in earlier)
    in_flight: dict[int, PrefectFuture[Any]] = {}

    def submit_ahead() -> None:
        while todo and len(in_flight) < max(1, finalize_ahead):
            batch = todo.popleft()
            in_flight[batch.index] = finalize_rollout_batch.submit(
                run_id, rollouts, batch, store, options, source_kwargs, builder
            )

    submit_ahead()
    abort: str | None = None
    for done, batch in enumerate(plan.batches, start=1):
        started = time.perf_counter()
        key = receipt_key(batch)
        if key in earlier:
            receipt: HandoffReceipt | None = earlier[key]
            logger.info(
                "batch %d was handed off by an earlier run; not finalized again", batch.index
            )
        else:
            receipt = None
            if abort is None:
                receipt, abort = _finalize_and_upload(
                    in_flight.pop(batch.index),
                    batch,
                    run_id,
                    rollouts,
                    dest,
                    options,
                    upload,
                    gate,
                    failed,
                    errors,
                )
                submit_ahead()
            else:
                in_flight.pop(batch.index, None)
        if receipt is not None:
            receipts.append(receipt)
            if key in earlier:
                gate.add(receipt.rollouts)
            retirements[key] = _retire(retire, receipt, dest, store, options, source_kwargs, errors)
        seconds[batch.index] = time.perf_counter() - started
        update_progress_artifact(progress, 100.0 * done / max(1, len(plan.batches)))

    summary = write_run_report(
        run_id,
        dest,
        receipts,
        retirements,
        failed,
        seconds,
        len(earlier),
        errors + ([abort] if abort else []),
        options,
    )
    failures = summary.errors + summary.malformed_line_errors
    if failures or not summary.ok:
        message = abort or "; ".join(errors) or _malformed_message(summary)
        raise RunFailedError(message, failures, summary)
    return summary


def _malformed_message(summary: RunSummary) -> str:
    shown = "; ".join(summary.malformed_line_errors[:3])
    return f"{summary.malformed_lines} malformed input lines ({shown}); see {summary.ledger}"


def _finalize_and_upload(
    future: PrefectFuture[Any],
    batch: Any,
    run_id: str,
    rollouts: str,
    dest: str,
    options: Mapping[str, Any],
    upload: Any,
    gate: MaskGate,
    failed: dict[int, tuple[list[RolloutOutcome], str]],
    errors: list[str],
) -> tuple[HandoffReceipt | None, str | None]:
    """Wait for a batch's finalize, gate on the mask fraction, then hand it off."""
    try:
        finalized = future.result()
    except Exception as exc:
        message = f"batch {batch.index}: finalize failed: {exc}"
        failed[batch.index] = (describe_batch(rollouts, batch, options), message)
        errors.append(message)
        return None, None
    crash_point("after-finalize")
    gate.add(finalized.outcomes)
    abort = gate.exceeded()
    if abort is not None:
        failed[batch.index] = (finalized.outcomes, "not handed off: run aborted, " + abort)
        return None, abort
    try:
        return upload(run_id, finalized, dest, options), None
    except Exception as exc:
        message = f"batch {batch.index}: upload failed: {exc}"
        failed[batch.index] = (finalized.outcomes, message)
        errors.append(message)
        return None, None


def _retire(
    retire: Any,
    receipt: HandoffReceipt,
    dest: str,
    store: str,
    options: Mapping[str, Any],
    source_kwargs: Mapping[str, Any] | None,
    errors: list[str],
) -> RetireOutcome:
    try:
        state = retire(receipt, dest, store, options, source_kwargs, return_state=True)
        outcome: RetireOutcome = state.result()
    except Exception as exc:
        errors.append(f"batch {receipt.batch}: retirement failed: {exc}")
        return RetireOutcome(
            receipt_key=receipt.receipt_key,
            failed={
                r.rollout_id: f"retirement failed: {exc}"
                for r in receipt.rollouts
                if r.rollout_id and r.can_retire
            },
        )
    outcome.earlier = state.name == "Cached"
    return outcome


@flow(name="retire-uploaded", flow_run_name="retire {run_id}")
def retire_uploaded(
    dest: str,
    run_id: str,
    store: str,
    storage_options: dict[str, Any] | None = None,
    source_kwargs: dict[str, Any] | None = None,
) -> dict[str, int]:
    """Retire the rollouts listed as retirable in the run's receipts, and only those.

    `retired` counts retirements done now; `retired_earlier` those an earlier run did
    against the same store (reused, not repeated).
    """
    options = public_storage_options(storage_options)
    validate_run_id(run_id)
    load_manifest(dest, run_id, options)
    receipts = find_receipts(dest, run_id, None, options)
    retire = retire_batch.with_options(result_storage=receipt_storage(dest, run_id, options))
    errors: list[str] = []
    outcomes = [
        _retire(retire, receipt, dest, store, options, source_kwargs, errors)
        for receipt in receipts.values()
    ]
    mark_retired(dest, run_id, [rid for o in outcomes for rid in o.retired], options)
    counts = {
        "receipts": len(receipts),
        "retired": sum(len(o.retired) for o in outcomes if not o.earlier),
        "retired_earlier": sum(len(o.retired) for o in outcomes if o.earlier),
        "kept": sum(len(o.kept) for o in outcomes) + sum(map(kept_as_evidence, receipts.values())),
    }
    get_run_logger().info("run %s: %s", run_id, counts)
    if errors:
        raise RunFailedError("; ".join(errors), errors)
    return counts


class RetriggerReport(BaseModel):
    """What a retrigger changed in a run's ledger."""

    run_id: str
    newly_handed_off: list[str] = Field(default_factory=list)
    newly_retired: list[str] = Field(default_factory=list)
    still_failing: list[str] = Field(default_factory=list)


@flow(name="retrigger-failed", flow_run_name="retrigger {run_id}")
def retrigger_failed(
    dest: str,
    run_id: str,
    store: str,
    storage_options: dict[str, Any] | None = None,
    source_kwargs: dict[str, Any] | None = None,
) -> RetriggerReport:
    """Re-run only what did not complete in a run (finalize, upload or retire) and report it."""
    options = public_storage_options(storage_options)
    manifest = load_manifest(dest, run_id, options)
    before = {(line.line, line.rollout_id): line for line in load_ledger(dest, run_id, options)}
    error: RunFailedError | None = None
    try:
        finalize_run(
            manifest.rollouts,
            store,
            dest,
            run_id,
            manifest.builder,
            manifest.batch_size,
            manifest.max_mask_fraction,
            manifest.mask_fraction_min_samples,
            options,
            source_kwargs,
        )
    except RunFailedError as exc:
        error = exc
    except Exception as exc:
        error = RunFailedError(str(exc))
    after = load_ledger(dest, run_id, options)
    report = RetriggerReport(run_id=run_id)
    for line in after:
        old = before.get((line.line, line.rollout_id))
        name = line.rollout_id or f"line {line.line}"
        if line.handed_off and not (old and old.handed_off):
            report.newly_handed_off.append(name)
        if line.retired and not (old and old.retired):
            report.newly_retired.append(name)
        if not line.handed_off or line.error:
            report.still_failing.append(name)
    get_run_logger().info(
        "retrigger %s: %d newly handed off, %d newly retired, %d still failing",
        run_id,
        len(report.newly_handed_off),
        len(report.newly_retired),
        len(report.still_failing),
    )
    if error:
        raise RunFailedError(
            f"retrigger of {run_id} did not complete: {error}", error.failures, report
        )
    return report
