"""`retrigger_failed`: re-run what did not complete in a run, with that run's own settings.

The shipped automation starts it for a finalize run that failed or crashed, naming that flow
run (`failed_run`). The retrigger reads the parameters the run was started with from the
Prefect API and re-runs the same flow with them: an inbox file's run under the file's claim
(a claim a crashed run still holds is not waited out here: the retrigger is scheduled at its
lapse, see `retrigger_deferral`), a `finalize_run` as it was called.
Started by hand (no `failed_run`), it re-runs the run from the manifest the run recorded.
Settings it cannot recover are never replaced by defaults: the run is left to a person.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from prefect import State, flow, get_run_logger
from prefect.states import Failed
from pydantic import ValidationError

from capture_core.config import public_storage_options
from capture_core.operator.run_progress import RetriggerReport, ledger_changes
from capture_core.operator.run_report import only_malformed_left
from capture_core.operator.run_verdict import fix_input_advice
from capture_core.run.capture_source import check_separate_locations
from capture_core.run.run_layout import LedgerLine
from tokcap.flows.finalize import RunFailedError, finalize_run
from tokcap.flows.inbox import FileSettings, check_inbox_file, retry_file
from tokcap.flows.retrigger_deferral import claim_plan, defer_retrigger, find_held_claim
from tokcap.tasks.flow_runs import RETRIGGER_FLOW, RetriedRun, read_retried_run
from tokcap.tasks.run_state import load_ledger, load_manifest

Options = dict[str, Any] | None

NEEDS_ATTENTION = "NeedsAttention"  # a Failed state no shipped automation retriggers
INBOX_FILE_FLOW, FINALIZE_FLOW = "finalize-inbox-file", "finalize-run"


class RetriggerRefusedError(RuntimeError):
    """The run cannot be re-run as it first ran (its settings are unknown, or its input was
    refused); the message names the run and what a person can do."""


@dataclass
class Rerun:
    """One re-run: the run's input, the destination and options of its ledger, and the call
    that re-runs it with its own settings."""

    rollouts: str | None
    dest: str
    options: dict[str, Any]
    call: Callable[..., Any]
    claimed: bool = False  # an inbox file's run: the re-run takes the file's claim


@flow(name="retrigger-failed", flow_run_name="retrigger {run_id}", validate_parameters=False)
def retrigger_failed(
    dest: str,
    run_id: str,
    store: str,
    storage_options: Options = None,
    source_kwargs: Options = None,
    rollouts: str | None = None,
    failed_run: str | None = None,
    retrigger: int = 0,
    max_retriggers: int = 3,
    waited_on: str | None = None,
) -> RetriggerReport | State:
    """Re-run only what did not complete in a run (finalize, upload or retire) and report it.

    `failed_run` is the flow run that failed or crashed (the automation passes it): the run is
    re-run with that flow run's parameters, and `dest`, `store`, `storage_options` and
    `source_kwargs` are not used. Without it the run is re-run from its manifest at `dest`.
    `rollouts`, when given, must be the run's input. A run whose settings cannot be recovered
    (no manifest, an unknown flow run) ends at once in the Failed state `NeedsAttention`,
    naming why. `retrigger` counts the automation's retriggers of this run in a row (0:
    started by a person); the `max_retriggers`-th one that still fails ends `NeedsAttention`
    too, with its reason. The automation expects neither: the run is left to a person.
    A `max_retriggers` below 1 means no automatic retrigger: an automatic one (count 1 or
    more) ends `NeedsAttention` at once, and one a person started ends `NeedsAttention` when
    it fails. Parameters are checked in the body, never by Prefect before it, and a count
    past the limit, or one that is no whole number, ends `NeedsAttention` before anything
    runs: a retrigger that failed or crashed before it could count (bad parameters, a killed
    worker) still ends the chain. A retrigger of an inbox file whose claim a dead run still
    holds is scheduled again at the claim's lapse and ends at once (`waited_on` names the
    claim the scheduled one waited for). A run whose only unfinished lines are malformed
    cannot complete by re-running: that ends `NeedsAttention` too, naming the file, the line
    and what to do; with good lines still unfinished the retrigger fails as any other.
    """
    count, limit = _whole(retrigger), _whole(max_retriggers)
    refused = chain_ended(retrigger, max_retriggers, run_id, count, limit)
    if refused is not None:
        get_run_logger().error("%s", refused)
        return Failed(name=NEEDS_ATTENTION, message=refused)
    assert count is not None and limit is not None  # chain_ended refuses either missing
    run_id = str(run_id)
    options = public_storage_options(storage_options)
    check_separate_locations({"store": store, "dest": dest})
    located = Rerun(rollouts, dest, options, lambda: None)
    error: RunFailedError | None = None
    before: list[Any] = []
    try:
        by_hand = partial(manifest_rerun, dest, run_id, store, options, source_kwargs)
        located = planned_rerun(run_id, failed_run, by_hand)
        check_input(run_id, rollouts, located)
        deferred = claim_first(located, run_id, waited_on)
        if deferred is not None:
            return deferred
        before = load_ledger(located.dest, run_id, located.options)
        located.call()
    except RetriggerRefusedError as exc:
        get_run_logger().error("%s", exc)
        return Failed(name=NEEDS_ATTENTION, message=str(exc))
    except RunFailedError as exc:
        error = exc
    except Exception as exc:
        error = RunFailedError(str(exc))
    after = _ledger_after(located, run_id, before)
    report = ledger_changes(run_id, before, after)
    get_run_logger().info("retrigger %s: %s", run_id, report.describe())
    if error is None:
        return report
    unfixable = input_to_change(run_id, located.rollouts, after, report)
    if unfixable is not None:
        get_run_logger().error("%s", unfixable)
        return Failed(name=NEEDS_ATTENTION, message=unfixable)
    message = f"retrigger of {run_id} did not complete: {error}"
    if limit < 1:
        return Failed(
            name=NEEDS_ATTENTION,
            message=f"{message}; left for a person (max_retriggers {limit}: no automatic "
            "retrigger)",
        )
    if limit <= count:
        return Failed(
            name=NEEDS_ATTENTION,
            message=f"{message}; left for a person after {count} automatic retriggers",
        )
    raise RunFailedError(message, error.failures, report, error.next_step)


def chain_ended(
    retrigger: Any, max_retriggers: Any, run_id: Any, count: int | None, limit: int | None
) -> str | None:
    """Why this retrigger must run nothing and end the automation's chain, or `None`.

    A count or limit that is no whole number cannot bound the chain, so it ends it; an
    automatic retrigger (count 1 or more) ends it when the limit is below 1 or passed.
    """
    if count is not None and limit is not None and count >= 1 and limit < 1:
        return (
            f"run {run_id!r} failed, and max_retriggers is {max_retriggers!r}: no automatic "
            "retrigger; left for a person: tokcap status, then tokcap retrigger"
        )
    if count is None or limit is None or (count >= 1 and limit < count):
        return (
            f"retrigger {retrigger!r} of run {run_id!r} is past max_retriggers "
            f"{max_retriggers!r} (earlier retriggers failed or crashed before they could "
            "count themselves); left for a person: tokcap status, then tokcap retrigger"
        )
    return None


def _whole(value: Any) -> int | None:
    """A count given as an integer or its text (a rendered template); `None` otherwise."""
    if isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _ledger_after(located: Rerun, run_id: str, before: list[Any]) -> list[Any]:
    """The run's ledger after the re-run; the one before when it cannot be read, so the
    report claims nothing new it cannot show."""
    try:
        return load_ledger(located.dest, run_id, located.options)
    except Exception as exc:
        get_run_logger().warning("the ledger of run %s could not be read: %s", run_id, exc)
        return before


def planned_rerun(run_id: str, failed_run: str | None, by_hand: Callable[[], Rerun]) -> Rerun:
    """How to re-run the run: as the flow run `failed_run` ran, else `by_hand` (a person
    started the retrigger: the run's manifest at the locations they gave)."""
    if failed_run is None:
        return by_hand()
    try:
        retried = read_retried_run(failed_run)
    except LookupError as exc:
        raise RetriggerRefusedError(
            f"run {run_id} cannot be retriggered: {exc}, so the settings it ran with are "
            "unknown. Retry it from the UI, or finalize its input again with its settings"
        ) from None
    found = retried.parameters.get("run_id")
    if found != run_id:
        raise RetriggerRefusedError(
            f"flow run {retried.flow_run_id} finalized run {found!r}, not {run_id!r}; nothing "
            "was retriggered"
        )
    if retried.flow == INBOX_FILE_FLOW:
        return inbox_rerun(retried)
    if retried.flow == FINALIZE_FLOW and not retried.parameters.get("claim"):
        called = retried.parameters
        where = public_storage_options(called.get("storage_options"))
        call = partial(finalize_run, **called)
        return Rerun(called["rollouts"], called["dest"], where, call)
    if retried.flow == RETRIGGER_FLOW:  # started by hand: the run's manifest
        called = retried.parameters
        where = public_storage_options(called.get("storage_options"))
        kwargs = called.get("source_kwargs")
        return manifest_rerun(called["dest"], run_id, called["store"], where, kwargs)
    raise RetriggerRefusedError(
        f"flow run {retried.flow_run_id} of {retried.flow} is not one the retrigger re-runs "
        f"(an inbox file's run, a finalize-run deployment's run or a retrigger); retry it "
        "from the UI"
    )


def inbox_rerun(retried: RetriedRun) -> Rerun:
    """An inbox file's run again: its file, run id and inbox settings, under the claim."""
    called = retried.parameters
    try:
        settings = FileSettings.model_validate(called["settings"])
    except ValidationError as exc:  # settings an older release accepted (a lease of inf)
        why = "; ".join(str(error["msg"]) for error in exc.errors())
        raise RetriggerRefusedError(
            f"run {called.get('run_id')!r} ran with inbox settings tokcap no longer accepts "
            f"({why}), so no retrigger can re-run it as it ran: deploy the inbox again with "
            "settings it accepts (tokcap deploy names a bad one), then finalize the file again"
        ) from None
    settings = settings.checked()
    try:
        check_inbox_file(called["rollouts"], called["run_id"], settings.inbox)
    except ValueError as exc:
        raise RetriggerRefusedError(str(exc)) from None
    call = partial(retry_file, called["rollouts"], called["run_id"], settings)
    return Rerun(called["rollouts"], settings.dest, settings.storage_options or {}, call, True)


def claim_first(rerun: Rerun, run_id: str, waited_on: str | None) -> State | None:
    """Settle the file's claim before an inbox re-run: a claim a dead run still holds defers
    the retrigger to its lapse (the Completed state saying when), else `None` and the re-run
    waits for it only when the claim seen at scheduling time has not lapsed yet."""
    if not rerun.claimed:
        return None
    held = find_held_claim(rerun.dest, run_id, rerun.options or None)
    plan = claim_plan(held, waited_on)
    if plan == "defer" and held is not None:
        deferred = defer_retrigger(run_id, held)
        if deferred is not None:
            return deferred
        plan = "outwait"  # not from a deployment: this process waits, no worker does
    rerun.call = partial(rerun.call, outwait=plan == "outwait")
    return None


def input_to_change(
    run_id: str, rollouts: str | None, ledger: list[LedgerLine], report: RetriggerReport
) -> str | None:
    """Why re-running cannot complete the run: its ledger's only unfinished lines are
    malformed, and the run is bound to that input; `None` otherwise (a line that is not
    handed off or retired yet may still be, so the retrigger fails as any other)."""
    bad = only_malformed_left(ledger)
    if not bad:
        return None
    where = rollouts or "its input"
    named = "; ".join(f"line {line.line}: {line.error or 'unreadable'}" for line in bad[:3])
    more = f" (and {len(bad) - 3} more)" if len(bad) > 3 else ""
    return (
        f"run {run_id} cannot complete until its input changes: {where} has "
        f"{len(bad)} malformed line(s) ({named}{more}). A retrigger reads the same input, so "
        f"it fails the same way ({report.describe()}). {fix_input_advice(run_id)}"
    )


def manifest_rerun(
    dest: str, run_id: str, store: str, options: dict[str, Any], source_kwargs: Options
) -> Rerun:
    """The run again with the settings of its manifest; refused when it recorded none."""
    try:
        manifest = load_manifest(dest, run_id, options)
    except ValueError as exc:  # no manifest, or an unreadable one
        raise RetriggerRefusedError(
            f"run {run_id} cannot be retriggered from its manifest: {exc}. Without it the "
            "settings it ran with are unknown; retry its flow run from the UI, or finalize "
            "its input again with its settings"
        ) from None
    settings = {
        "rollouts": manifest.rollouts,
        "builder": manifest.builder,
        "batch_size": manifest.batch_size,
        "max_mask_fraction": manifest.max_mask_fraction,
        "mask_fraction_min_samples": manifest.mask_fraction_min_samples,
        "storage_options": options,
        "source_kwargs": source_kwargs,
        "delivery": manifest.delivery,
        "rows": manifest.rows,
        "retire_after_consumer": manifest.retire_after_consumer,
        "group_by": manifest.group_by,
        "max_group_size": manifest.max_group_size,
    }
    call = partial(finalize_run, store=store, dest=dest, run_id=run_id, **settings)
    return Rerun(manifest.rollouts, dest, options, call)


def check_input(run_id: str, rollouts: str | None, rerun: Rerun) -> None:
    """Refuse a `rollouts` that is not the input of the run being re-run."""
    if rollouts and rerun.rollouts != rollouts:
        raise RetriggerRefusedError(
            f"run {run_id} finalizes {rerun.rollouts}, not {rollouts}; nothing was retriggered"
        )
