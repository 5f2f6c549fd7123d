"""`finalize_inbox`: finalize every rollout file under an inbox that is not finalized yet.

Completion is judged from the destination (each file's run ledger and manifest), never from
memory, so a scheduled deployment can run it every few minutes. A file re-published under a
name already finalized with other content fails the pass, naming it; it is never skipped.
Files that appear while it runs are picked up next time; a file that keeps failing is
reported and given up after `max_attempts`.
Each file is claimed before it is finalized, so overlapping passes (several workers on one
schedule) finalize it once; a pass that died loses its claim after `claim_lease_seconds`.
`finalize_inbox_file` does the same for one file: the run a `tokcap submit` event starts, and
the child run a pass started with `fan_out` hands each unfinished file to, so the workers of
the pool finalize as many files at once as they have free slots.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from typing import Any

from prefect import State, flow, get_run_logger, runtime
from prefect.artifacts import create_markdown_artifact
from prefect.deployments import run_deployment
from prefect.states import Failed
from pydantic import BaseModel, Field

from capture_core.errors import ClaimLostError
from capture_core.operator.run_status import run_completed
from capture_core.run.inbox import (
    Claim,
    ClaimDecision,
    InboxEntry,
    claim_is_live,
    claim_numbers,
    keep_claim,
    outwait_silent_claim,
    read_claim,
    release_claim,
    replaced_file,
    run_id_for_file,
    take_claim,
)
from capture_core.storage import filesystem_for, open_byte_store, url_scheme
from tokcap.flows.file_settings import FileSettings
from tokcap.flows.finalize import finalize_run
from tokcap.tasks.common import tokcap_task


class InboxReport(BaseModel):
    """What one pass over the inbox did, by file URL."""

    finalized: list[str] = Field(default_factory=list)
    already_done: list[str] = Field(default_factory=list)
    failed: dict[str, str] = Field(default_factory=dict)
    given_up: list[str] = Field(default_factory=list)
    busy: list[str] = Field(default_factory=list)
    dispatched: dict[str, str] = Field(default_factory=dict)


class InboxFile(InboxEntry):
    """A file of the inbox: its run, whether that completed, why the file was refused, and
    which pass holds it now (a live claim)."""

    done: bool
    attempts: int
    replaced: str | None = None
    held_by: str | None = None


@tokcap_task("scan-inbox", "scan inbox {inbox}")
def scan_inbox(
    inbox: str, pattern: str, dest: str, storage_options: dict[str, Any] | None = None
) -> list[InboxFile]:
    """The inbox's rollout files, each with its run id and whether its run completed.

    A file whose content differs from its run's manifest is marked `replaced`, never done.
    """
    fs, root = filesystem_for(inbox, storage_options)
    scheme = url_scheme(inbox)
    protocol = f"{scheme}://" if scheme is not None else ""
    paths = sorted(fs.glob(f"{root.rstrip('/')}/{pattern}"))
    urls = [protocol + p if protocol and not p.startswith(protocol) else p for p in paths]
    return [inspect_file(url, dest, storage_options) for url in urls]


def inspect_file(url: str, dest: str, storage_options: dict[str, Any] | None) -> InboxFile:
    """One inbox file: its run id, whether its run completed, whether it was replaced, and
    who holds it."""
    dest_store = open_byte_store(dest, storage_options)
    run_id = run_id_for_file(url)
    replaced = replaced_file(dest_store, run_id, url, storage_options)
    numbers = claim_numbers(dest_store, run_id)
    last = read_claim(dest_store, run_id, numbers[-1]) if numbers else None
    live = last is not None and claim_is_live(dest_store, last, time.time())
    return InboxFile(
        url=url,
        run_id=run_id,
        done=replaced is None and run_completed(dest_store, run_id),
        attempts=len(numbers),
        replaced=replaced,
        held_by=last.owner if live and last is not None else None,
    )


@tokcap_task("inspect-inbox-file", "inspect inbox file {url}")
def inspect_inbox_file(
    url: str, dest: str, storage_options: dict[str, Any] | None = None
) -> InboxFile:
    """`inspect_file` as a task, for the run of one file."""
    return inspect_file(url, dest, storage_options)


@tokcap_task("claim-file", "claim attempt of run {run_id}")
def claim_file(
    dest: str,
    run_id: str,
    owner: str,
    token: str,
    lease_seconds: float,
    max_attempts: int,
    storage_options: dict[str, Any] | None = None,
) -> ClaimDecision:
    """Claim the file's next attempt, unless a live pass holds it, attempts ran out or the
    run completed meanwhile (the claim is then released as ended)."""
    byte_store = open_byte_store(dest, storage_options)
    decision = take_claim(byte_store, run_id, owner, token, lease_seconds, max_attempts)
    if decision.claim is None or not run_completed(byte_store, run_id):
        return decision
    release_claim(byte_store, decision.claim, ok=True)
    return ClaimDecision(status="done", attempts=decision.attempts)


@tokcap_task("release-claim", "release attempt {claim.number} of run {claim.run_id}")
def end_claim(
    dest: str, claim: Claim, ok: bool, storage_options: dict[str, Any] | None = None
) -> None:
    release_claim(open_byte_store(dest, storage_options), claim, ok)


def _owner() -> str:
    """Who holds a claim: this flow run, host and process, for logs and reports."""
    return f"flow run {runtime.flow_run.id} on {socket.gethostname()} pid {os.getpid()}"


def inbox_markdown(inbox: str, report: InboxReport, failures: list[str]) -> str:
    """The inbox pass as markdown: counts, then each file that was not finalized and why."""
    lines = [
        f"# tokcap inbox `{inbox}`",
        "",
        f"{len(report.finalized)} finalized, {len(report.already_done)} already done, "
        f"{len(report.failed)} failed, {len(report.given_up)} given up, "
        f"{len(report.busy)} left to another pass that holds them, "
        f"{len(report.dispatched)} handed to runs of their own.",
    ]
    if failures:
        lines += ["", "## Not finalized", ""] + [f"- {failure}" for failure in failures]
    return "\n".join(lines) + "\n"


@flow(name="finalize-inbox", flow_run_name="inbox {settings.inbox}")
def finalize_inbox(
    settings: FileSettings, pattern: str = "*.jsonl", fan_out: str | None = None
) -> InboxReport:
    """Finalize each inbox file whose run has not completed and no pass holds.

    Without `fan_out` this run finalizes the files one after the other. With `fan_out`, the
    name of a `finalize-inbox-file` deployment (`flow/deployment`), it starts one run of that
    deployment per file and returns: any worker of the pool takes each, and the file's claim
    still lets exactly one of them hand it off. `settings.delivery` is each run's
    (`main_chain`, or `all_traces` for training_traces envelopes). `settings.rows` and
    `settings.retire_after_consumer` go to each run; with a consumer, a run is complete once
    it acknowledged every batch, and each pass retires what it acknowledged since.
    """
    settings = settings.checked()
    report = InboxReport()
    for item in scan_inbox(settings.inbox, pattern, settings.dest, settings.storage_options):
        if fan_out is None:
            take_file(item, settings, report)
        elif settled(item, settings, report):
            continue
        else:
            report.dispatched[item.url] = dispatch_file(fan_out, item, settings)
    return _conclude(settings.inbox, report)


def settled(item: InboxFile, settings: FileSettings, report: InboxReport) -> bool:
    """Record a file that needs no run (done, refused, held, out of attempts); else False."""
    if item.done:
        report.already_done.append(item.url)
    elif item.replaced is not None:
        report.failed[item.url] = item.replaced
        get_run_logger().error("%s", item.replaced)
    elif item.held_by is not None:
        report.busy.append(item.url)
        get_run_logger().info("leaving %s to %s, which holds it", item.url, item.held_by)
    elif item.attempts >= settings.max_attempts:
        _give_up(item.url, item.run_id, item.attempts, report)
    else:
        return False
    return True


def dispatch_file(deployment: str, item: InboxFile, settings: FileSettings) -> str:
    """Start one run of the file's deployment through the work pool; its flow run id.

    The run is a child of this pass in the UI. The pass does not wait for it: a pass that
    waited would hold a worker slot that the child may need. Passes within one claim lease
    share one run per file attempt (the idempotency key), so a run not started yet is not
    doubled by every pass; one that died before claiming is replaced a lease later.
    """
    parameters = {"rollouts": item.url, "run_id": item.run_id, "settings": settings.model_dump()}
    window = int(time.time() // settings.claim_lease_seconds)
    flow_run = run_deployment(
        deployment,
        parameters=parameters,
        timeout=0,
        idempotency_key=f"{item.run_id}-attempt-{item.attempts}-window-{window}",
    )
    get_run_logger().info("%s: started run %s of %s", item.url, flow_run.id, deployment)
    return str(flow_run.id)


def take_file(item: InboxFile, settings: FileSettings, report: InboxReport) -> None:
    """Claim one file and finalize it here, unless it needs no run."""
    if settled(item, settings, report):
        return
    options = settings.storage_options
    decision = claim_file(
        settings.dest,
        item.run_id,
        _owner(),
        uuid.uuid4().hex,
        settings.claim_lease_seconds,
        settings.max_attempts,
        options,
    )
    if decision.status == "done":
        report.already_done.append(item.url)
    elif decision.status == "held":
        report.busy.append(item.url)
        get_run_logger().info("leaving %s to %s, which holds it", item.url, decision.held_by)
    elif decision.claim is None:
        _give_up(item.url, item.run_id, decision.attempts, report)
    else:
        run_settings = {
            "batch_size": settings.batch_size,
            "max_mask_fraction": settings.max_mask_fraction,
            "storage_options": options,
            "source_kwargs": settings.source_kwargs,
            "delivery": settings.delivery,
            "rows": settings.rows,
            "retire_after_consumer": settings.retire_after_consumer,
            "group_by": settings.group_by,
            "max_group_size": settings.max_group_size,
        }
        _finalize_claimed(item, decision.claim, settings.store, settings.dest, run_settings, report)


def _give_up(url: str, run_id: str, tries: int, report: InboxReport) -> None:
    report.given_up.append(url)
    get_run_logger().error(
        "giving up on %s after %d failed attempts (run %s); see its ledger", url, tries, run_id
    )


REFUSED = "Refused"  # a Failed state the retrigger automation does not expect


@flow(name="finalize-inbox-file", flow_run_name="inbox file {run_id}")
def finalize_inbox_file(rollouts: str, run_id: str, settings: FileSettings) -> InboxReport | State:
    """Finalize one file of the inbox under its claim, as an inbox pass would.

    `run_id` must be the file's own (`run_id_for_file`) and the file must lie in the inbox:
    an event naming anything else is refused, so no event can finalize a file elsewhere.
    A refused run ends in the Failed state `Refused`, with the reason, which the retrigger
    automation does not expect: retrying cannot make the event valid.
    """
    settings = settings.checked()
    try:
        check_inbox_file(rollouts, run_id, settings.inbox)
    except ValueError as exc:
        get_run_logger().error("%s", exc)
        return Failed(name=REFUSED, message=str(exc))
    return finalize_file(rollouts, settings)


def retry_file(
    rollouts: str, run_id: str, settings: FileSettings, outwait: bool = True
) -> InboxReport:
    """Finalize a file again as its failed or crashed run would have: the same settings, the
    same checks, under the file's claim. With `outwait`, a claim a crashed run still holds is
    waited out (one lease at most; a renewal meanwhile leaves the file to its live holder).
    Raises `ValueError` for a file outside the inbox or a run id not the file's own, and
    `InboxFailedError` when the file was not finalized.
    """
    settings = settings.checked()
    check_inbox_file(rollouts, run_id, settings.inbox)
    return finalize_file(rollouts, settings, outwait=outwait)


def finalize_file(rollouts: str, settings: FileSettings, outwait: bool = False) -> InboxReport:
    """Inspect, claim and finalize one checked file of the inbox, then conclude.

    With `outwait`, a claim held by a pass that renews it no more is waited out first.
    """
    dest, options = settings.dest, settings.storage_options
    inspected = inspect_inbox_file(rollouts, dest, options)
    held_by = inspected.held_by
    if outwait and held_by and outwait_claim(dest, inspected.run_id, held_by, options):
        inspected = inspect_inbox_file(rollouts, dest, options)
    report = InboxReport()
    take_file(inspected, settings, report)
    return _conclude(rollouts, report)


@tokcap_task("outwait-claim", "wait out the claim on run {run_id}")
def outwait_claim(
    dest: str, run_id: str, held_by: str, storage_options: dict[str, Any] | None = None
) -> bool:
    """`outwait_silent_claim` as a task: whether the file's claim lapsed or ended."""
    get_run_logger().info("run %s: waiting for %s to renew its claim or lose it", run_id, held_by)
    return outwait_silent_claim(open_byte_store(dest, storage_options), run_id)


def check_inbox_file(rollouts: str, run_id: str, inbox: str) -> None:
    """Refuse a file outside `inbox`, or a run id that is not the file's own."""
    folder = inbox.rstrip("/") + "/"
    if not rollouts.startswith(folder) or "/" in rollouts[len(folder) :]:
        raise ValueError(f"{rollouts} is not a file of the inbox {inbox}; nothing was finalized")
    if run_id != run_id_for_file(rollouts):
        raise ValueError(
            f"run id {run_id!r} is not the run of {rollouts} ({run_id_for_file(rollouts)}); "
            "nothing was finalized"
        )


class InboxFailedError(RuntimeError):
    """Some inbox files were not finalized; `failures` names each file and why."""

    def __init__(self, failures: list[str], report: InboxReport) -> None:
        super().__init__(f"{len(failures)} inbox files not finalized: " + "; ".join(failures))
        self.failures, self.summary = failures, report


def _reason(exc: Exception) -> str:
    lines = getattr(exc, "failures", None) or [str(exc)]
    more = f" (and {len(lines) - 3} more)" if len(lines) > 3 else ""
    return " ".join("; ".join(lines[:3]).split()) + more


def _conclude(inbox: str, report: InboxReport) -> InboxReport:
    """Log and publish the pass; fail the flow run, naming each file, if any file failed."""
    failures = [f"{url}: {reason}" for url, reason in report.failed.items()]
    failures += [
        f"{url}: given up after repeated failures; see its ledger" for url in report.given_up
    ]
    get_run_logger().info(
        "inbox %s: %d finalized, %d already done, %d failed, %d given up, %d started as runs",
        inbox,
        len(report.finalized),
        len(report.already_done),
        len(report.failed),
        len(report.given_up),
        len(report.dispatched),
    )
    create_markdown_artifact(markdown=inbox_markdown(inbox, report, failures))
    if failures:
        raise InboxFailedError(failures, report)
    return report


def _finalize_claimed(
    item: InboxFile,
    claim: Claim,
    store: str,
    dest: str,
    settings: dict[str, Any],
    report: InboxReport,
) -> None:
    """Finalize one claimed file while renewing its claim; release the claim afterwards.

    A pass that lost its claim (paused past its lease, and another pass took the file over)
    stopped before writing anything more; the file is left to the pass that holds it.
    """
    options = settings["storage_options"]
    try:
        with keep_claim(dest, claim, options):
            summary = finalize_run(item.url, store, dest, item.run_id, claim=claim, **settings)
    except ClaimLostError as exc:
        end_claim(dest, claim, False, options)
        report.busy.append(item.url)
        get_run_logger().warning("leaving %s: %s", item.url, exc)
        return
    except Exception as exc:
        end_claim(dest, claim, False, options)
        report.failed[item.url] = _reason(exc)
        get_run_logger().warning(
            "finalizing %s failed (attempt %d): %s", item.url, claim.number + 1, exc
        )
        return
    end_claim(dest, claim, summary.ok, options)
    if summary.ok:
        report.finalized.append(item.url)
    else:
        report.failed[item.url] = (
            f"{summary.malformed_lines} unreadable lines; see {summary.ledger}"
        )
