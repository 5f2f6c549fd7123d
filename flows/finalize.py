"""Finalization flows: finalize a run, and retire what was handed off.

`finalize_run` reads rollout records, finalizes each against the capture store, hands each
batch off durably (its receipt is the upload task's persisted result) and only then retires.
Re-running a run id is safe: batches with a receipt are reported as already handed off and
never finalized again. Flows hold no storage logic of their own: tasks do every side effect,
and `capture_core.operator.run_progress` keeps the run's tally, mask gate and ledger diffs.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger
from prefect.utilities.annotations import quote

from capture_core.builder import BUILDERS
from capture_core.builder.trace_envelope import DELIVERIES, MAIN_CHAIN
from capture_core.config import public_storage_options
from capture_core.errors import CaptureStoreError
from capture_core.operator.mask_reasons import infrastructure_counts
from capture_core.operator.run_outcome import mask_alert_due
from capture_core.operator.run_progress import (
    Lookahead,
    MaskGate,
    RunTally,
    group_batch_errors,
    retire_counts,
)
from capture_core.operator.run_report import RunSummary, plural, tokcap_command
from capture_core.rows.row_cursor import validate_consumer_name
from capture_core.run.capture_source import SourceSpec, check_separate_locations
from capture_core.run.inbox import Claim
from capture_core.run.receipt import receipt_key
from capture_core.run.rollout_io import COLLECT_CUT, REPAIR
from capture_core.run.run_layout import ROW_FORMATS, validate_run_id
from capture_core.run.task_groups import (
    DEFAULT_MAX_GROUP_SIZE,
    check_max_group_size,
    group_by_setting,
)
from tokcap.flows.alerts import alert_automation, alert_on_masks
from tokcap.flows.progress import RunProgress
from tokcap.flows.run_steps import RunSteps
from tokcap.tasks.batches import (
    plan_rollouts,
)
from tokcap.tasks.receipts import (
    find_receipts,
)
from tokcap.tasks.report import publish_report, write_run_report
from tokcap.tasks.run_state import (
    check_locations,
    check_store_captures,
    claim_run_id,
    load_manifest,
    mark_retired,
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
                "consumer to acknowledge; also set rows='parquet' (--rows parquet) or 'arrow'"
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
    group_by: str | None = None,
    max_group_size: int = DEFAULT_MAX_GROUP_SIZE,
) -> RunSummary:
    """Finalize every rollout of `rollouts` into the run's records at `dest`, then retire.

    `store` is a capture-store path or URL, or a `module.path:ClassName` source built with
    `source_kwargs`. `storage_options` apply to rollouts, store and dest; credentials come
    from the environment. `finalize_ahead` batches finalize on the task runner meanwhile.
    An inbox pass passes its `claim`: each write that decides the run's state (manifest,
    part and receipt, retirement, ledger and report) first checks that it still holds it,
    and the run stops with `ClaimLostError` once it does not. `delivery="all_traces"` adds
    each rollout's `training_traces` envelope and keeps its `response` (docs/traces.md).
    `rows="parquet"` (or `"arrow"`) writes each batch's trainer rows beside its part, pinned
    by the same receipt; `retire_after_consumer` then hands off but retires only the batches
    that row consumer acknowledged (a later run, `retire_uploaded` or the inbox retires the
    rest).
    A run that masked more than `mask_alert_fraction` of its rollouts emits an alert event
    (`tokcap.flows.alerts`); one whose rollouts mask for an infrastructure reason (version
    skew, an unreadable store) beyond it stops before handing that batch off and fails,
    saying what to fix and that `tokcap retrigger` then completes it. `group_by="task"`
    keeps each task's rollouts in one batch, a batch growing past `batch_size` to hold them;
    a task with more than `max_group_size` rollouts, or spread too far through the file, is
    refused before anything runs.
    """
    options = public_storage_options(storage_options)
    check_arguments(run_id, builder, delivery, rows, retire_after_consumer)
    group_by = group_by_setting(group_by)
    check_max_group_size(max_group_size)
    check_separate_locations({"store": store, "dest": dest})
    source = SourceSpec(store=store, storage_options=options, source_kwargs=source_kwargs)
    check_locations(source, dest, options)
    check_store_captures(rollouts, source, dest, run_id, options)
    grouping = {"group_by": group_by, "max_group_size": max_group_size}
    plan = plan_rollouts(rollouts, batch_size, options, grouping)
    settings = {
        "store": store,
        "builder": builder,
        "batch_size": batch_size,
        "max_mask_fraction": max_mask_fraction,
        "mask_fraction_min_samples": mask_fraction_min_samples,
        "rows": rows,
        "retire_after_consumer": retire_after_consumer,
        "delivery": delivery,
        "group_by": group_by,
        "max_group_size": max_group_size,
    }
    claim_run_id(dest, run_id, plan, settings, options, claim)
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
    gate = MaskGate(max_mask_fraction, mask_fraction_min_samples, mask_alert_fraction)
    todo = [b for b in plan.batches if receipt_key(b) not in earlier]
    finalizing = Lookahead(todo, steps.finalize, lambda b: b.index, finalize_ahead)
    progress = RunProgress(run_id, plan.batches, earlier)
    for batch in plan.batches:
        steps.run_batch(batch, earlier.get(receipt_key(batch)), finalizing, tally, gate)
        progress.batch_done(masked=sum(gate.reasons.values()))
    steps.storage.result()  # prepared even when no batch needed it: a failure fails the run
    summary = report_run(dest, tally, options, claim, mask_alert_fraction)
    if mask_alert_due(summary):
        summary.mask_alert_automation = alert_automation()
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
        if steps is not None and tally.abort and infrastructure_counts(summary.mask_reasons):
            step = f"once the cause is fixed, complete the run with: {_command('retrigger', steps)}"
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
    line = _command(command, steps)
    return f"{' and '.join(left)}{kept}; once the cause is fixed, complete the run with: {line}"


def _command(command: str, steps: RunSteps) -> str:
    """The `tokcap` command line that completes the run (`tokcap_command`)."""
    return tokcap_command(
        command,
        steps.dest,
        steps.run_id,
        steps.source.store,
        source_kwargs=bool(steps.source.source_kwargs),
        options=bool(steps.options),
    )


def _malformed_message(summary: RunSummary) -> str:
    """The first malformed lines (file, line, what is wrong), then what to do, said once."""
    errors, advice = summary.malformed_line_errors[:3], []
    for action in (REPAIR, COLLECT_CUT):
        if any(error.endswith(f"; {action}") for error in errors):
            advice.append(action)
            errors = [error.removesuffix(f"; {action}") for error in errors]
    lines = plural(summary.malformed_lines, "malformed input line")
    return f"{lines} ({'; '.join(errors)}); {'; '.join([*advice, f'see {summary.ledger}'])}"


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
