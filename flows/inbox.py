"""`finalize_inbox`: finalize every rollout file under an inbox that is not finalized yet.

Completion is judged from the destination (each file's run ledger and manifest), never from
memory, so a scheduled deployment can run it every few minutes. A file re-published under a
name already finalized with other content fails the pass, naming it; it is never skipped.
Files that appear while it runs are picked up next time; a file that keeps failing is
reported and given up after `max_attempts`.
Each file is claimed before it is finalized, so overlapping passes (several workers on one
schedule) finalize it once; a pass that died loses its claim after `claim_lease_seconds`.
"""

from __future__ import annotations

import os
import socket
import uuid
from typing import Any

from prefect import flow, get_run_logger, runtime, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from pydantic import BaseModel, Field

from capture_core.builder.trace_envelope import MAIN_CHAIN
from capture_core.config import public_storage_options
from capture_core.errors import ClaimLostError
from capture_core.run.capture_source import check_separate_locations
from capture_core.run.inbox import (
    Claim,
    ClaimDecision,
    attempts,
    keep_claim,
    release_claim,
    replaced_file,
    run_completed,
    run_id_for_file,
    take_claim,
)
from capture_core.storage import filesystem_for, open_byte_store, url_scheme
from flows.finalize import finalize_run
from tasks.common import TRANSIENT_RETRIES


class InboxReport(BaseModel):
    """What one pass over the inbox did, by file URL."""

    finalized: list[str] = Field(default_factory=list)
    already_done: list[str] = Field(default_factory=list)
    failed: dict[str, str] = Field(default_factory=dict)
    given_up: list[str] = Field(default_factory=list)
    busy: list[str] = Field(default_factory=list)


class InboxFile(BaseModel):
    """A file of the inbox: its run, whether that completed, and why the file was refused."""

    url: str
    run_id: str
    done: bool
    attempts: int
    replaced: str | None = None


@task(name="scan-inbox", cache_policy=NO_CACHE, **TRANSIENT_RETRIES)
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
    dest_store = open_byte_store(dest, storage_options)
    files = []
    for path in paths:
        url = protocol + path if protocol and not path.startswith(protocol) else path
        run_id = run_id_for_file(url)
        replaced = replaced_file(dest_store, run_id, url, storage_options)
        files.append(
            InboxFile(
                url=url,
                run_id=run_id,
                done=replaced is None and run_completed(dest_store, run_id),
                attempts=attempts(dest_store, run_id),
                replaced=replaced,
            )
        )
    return files


@task(name="claim-file", cache_policy=NO_CACHE, **TRANSIENT_RETRIES)
def claim_file(
    dest: str,
    run_id: str,
    owner: str,
    token: str,
    lease_seconds: float,
    max_attempts: int,
    storage_options: dict[str, Any] | None = None,
) -> ClaimDecision:
    """Claim the file's next attempt, unless a live pass holds it or attempts ran out."""
    byte_store = open_byte_store(dest, storage_options)
    return take_claim(byte_store, run_id, owner, token, lease_seconds, max_attempts)


@task(name="release-claim", cache_policy=NO_CACHE, **TRANSIENT_RETRIES)
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
        f"{len(report.busy)} left to another pass that holds them.",
    ]
    if failures:
        lines += ["", "## Not finalized", ""] + [f"- {failure}" for failure in failures]
    return "\n".join(lines) + "\n"


@flow(name="finalize-inbox", flow_run_name="inbox {inbox}")
def finalize_inbox(
    inbox: str,
    store: str,
    dest: str,
    pattern: str = "*.jsonl",
    batch_size: int = 500,
    max_mask_fraction: float | None = None,
    max_attempts: int = 3,
    storage_options: dict[str, Any] | None = None,
    source_kwargs: dict[str, Any] | None = None,
    claim_lease_seconds: float = 300.0,
    delivery: str = MAIN_CHAIN,
    rows: str = "none",
    retire_after_consumer: str | None = None,
) -> InboxReport:
    """Run `finalize_run` for each inbox file whose run has not completed and no pass holds.

    `delivery` is each run's (`main_chain`, or `all_traces` for training_traces envelopes).
    `rows` and `retire_after_consumer` go to each run; with a consumer, a run is complete
    once it acknowledged every batch, and each pass retires what it acknowledged since.
    """
    options = public_storage_options(storage_options)
    check_separate_locations({"inbox": inbox, "store": store, "dest": dest})
    logger = get_run_logger()
    report = InboxReport()
    owner = _owner()
    for item in scan_inbox(inbox, pattern, dest, options):
        if item.done:
            report.already_done.append(item.url)
            continue
        if item.replaced is not None:
            report.failed[item.url] = item.replaced
            logger.error("%s", item.replaced)
            continue
        decision = claim_file(
            dest, item.run_id, owner, uuid.uuid4().hex, claim_lease_seconds, max_attempts, options
        )
        if decision.status == "done":
            report.already_done.append(item.url)
        elif decision.status == "held":
            report.busy.append(item.url)
            logger.info("leaving %s to %s, which holds it", item.url, decision.held_by)
        elif decision.claim is None:
            report.given_up.append(item.url)
            logger.error(
                "giving up on %s after %d failed attempts (run %s); see its ledger",
                item.url,
                decision.attempts,
                item.run_id,
            )
        else:
            settings = {
                "batch_size": batch_size,
                "max_mask_fraction": max_mask_fraction,
                "storage_options": options,
                "source_kwargs": source_kwargs,
                "rows": rows,
                "retire_after_consumer": retire_after_consumer,
                "delivery": delivery,
            }
            _finalize_claimed(item, decision.claim, store, dest, settings, report)
    return _conclude(inbox, report)


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
        "inbox %s: %d finalized, %d already done, %d failed, %d given up",
        inbox,
        len(report.finalized),
        len(report.already_done),
        len(report.failed),
        len(report.given_up),
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
