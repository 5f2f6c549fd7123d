"""The run report: the ledger file and the Prefect UI artifacts of one run, and the
destination's runs table (`tokcap-runs`), updated at the end of every run."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from uuid import UUID

from prefect import get_client, get_run_logger
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from capture_core.operator.run_index import list_runs, record_summary, table
from capture_core.operator.run_markdown import markdown_report
from capture_core.operator.run_outcome import outcome_line, verdict
from capture_core.operator.run_progress import RunTally
from capture_core.operator.run_report import RunSummary, summary_table, terminal_words
from capture_core.operator.version_tally import version_lines
from capture_core.run.inbox import Claim
from capture_core.run.run_layout import RunLayout
from capture_core.storage import ByteStore, open_byte_store
from tokcap.tasks.common import ensure_claim, tokcap_task


def artifact_key(run_id: str, kind: str) -> str:
    """Artifact keys allow lowercase letters, digits and dashes only."""
    return f"tokcap-{kind}-" + re.sub(r"[^a-z0-9-]+", "-", run_id.lower()).strip("-")


@tokcap_task("write-run-report", "write report of run {tally.run_id}")
def write_run_report(
    dest: str,
    tally: RunTally,
    storage_options: Mapping[str, Any] | None = None,
    claim: Claim | None = None,
    mask_alert_fraction: float | None = None,
) -> RunSummary:
    """Write the tallied run's ledger and publish its summary table.

    The flow publishes the markdown report itself (`publish_report`): the UI lists a flow
    run's own artifacts above its task runs', so the report comes before the receipts.
    """
    run_id = tally.run_id
    ensure_claim(dest, claim, storage_options)
    ledger = tally.ledger()
    layout = RunLayout(open_byte_store(dest, storage_options), run_id)
    layout.write_ledger(ledger)
    summary = tally.summary(dest, ledger)
    summary.mask_alert_threshold = mask_alert_fraction
    record_summary(layout, summary, seconds=sum(tally.seconds.values()))
    create_table_artifact(
        key=artifact_key(summary.run_id, "summary"),
        table=summary_table(summary),
        description=f"tokcap run {summary.run_id}: counts (the report has them in words)",
    )
    publish_runs_table(layout.dest, dest)
    logger = get_run_logger()
    logger.info("%s", outcome_line(summary))
    if summary.terminal_methods:
        logger.info("run %s: %s", run_id, terminal_words(summary))
    for line in version_lines(summary.weight_versions):
        logger.info("run %s: %s", run_id, line)
    return summary


def publish_report(summary: RunSummary, tally: RunTally, progress: UUID | None = None) -> None:
    """Publish the markdown report as the flow run's own artifact; call it from the flow.

    The progress artifact (`progress`), done once the report exists, is deleted, so the
    report is the run's only artifact above the task runs' receipts (a failed deletion is a
    warning: the report stands).
    """
    ledger = tally.ledger()
    delivered = [
        line.delivered_fraction
        for line in ledger
        if not line.masked and line.delivered_fraction is not None
    ]
    create_markdown_artifact(
        key=artifact_key(summary.run_id, "report"),
        markdown=markdown_report(summary, ledger, delivered, tally.seconds),
        description=f"tokcap report of run {summary.run_id}: {verdict(summary)}",
    )
    if progress is None:
        return
    try:
        with get_client(sync_client=True) as client:
            client.delete_artifact(progress)
    except Exception as exc:  # a progress bar left at 100% must not fail a finished run
        get_run_logger().warning("the run's progress artifact stays: %s", exc)


RUNS_ARTIFACT = "tokcap-runs"
RUNS_SHOWN = 50


def publish_runs_table(dest_store: ByteStore, dest: str) -> None:
    """Update the `tokcap-runs` table: the destination's newest runs, one row each.

    The key is fixed, so the UI shows the latest table and its earlier versions. A table
    that cannot be made is a warning: the run's own report is already written.
    """
    try:
        listing = list_runs(dest_store, limit=RUNS_SHOWN)
        create_table_artifact(
            key=RUNS_ARTIFACT,
            table=table(listing.runs),
            description=f"tokcap runs at {dest}, newest first ({len(listing.runs)} of "
            f"{listing.total}; tokcap runs --dest {dest})",
        )
    except Exception as exc:
        get_run_logger().warning("the runs table of %s was not updated: %s", dest, exc)
