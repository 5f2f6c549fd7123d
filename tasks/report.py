"""The run report task: the ledger file and the Prefect UI artifacts of one run, and the
destination's runs table (`tokcap-runs`), updated at the end of every run."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from prefect import get_run_logger
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from capture_core.run.inbox import Claim
from capture_core.run.run_index import list_runs, record_summary, table
from capture_core.run.run_layout import LedgerLine, RunLayout
from capture_core.run.run_progress import RunTally
from capture_core.run.run_report import (
    RunSummary,
    locate,
    markdown_report,
    summarize,
    summary_table,
)
from capture_core.storage import ByteStore, open_byte_store
from tasks.common import ensure_claim, tokcap_task


def artifact_key(run_id: str, kind: str) -> str:
    """Artifact keys allow lowercase letters, digits and dashes only."""
    return f"tokcap-{kind}-" + re.sub(r"[^a-z0-9-]+", "-", run_id.lower()).strip("-")


@tokcap_task("write-run-report", "write report of run {tally.run_id}")
def write_run_report(
    dest: str,
    tally: RunTally,
    storage_options: Mapping[str, Any] | None = None,
    claim: Claim | None = None,
) -> RunSummary:
    """Write the tallied run's ledger, publish the table and markdown artifacts."""
    run_id = tally.run_id
    ensure_claim(dest, claim, storage_options)
    ledger = tally.ledger()
    layout = RunLayout(open_byte_store(dest, storage_options), run_id)
    layout.write_ledger(ledger)
    summary = summarize(run_id, ledger)
    summary.delivery = tally.delivery
    summary.errors = tally.all_errors()
    record_summary(layout, summary, seconds=sum(tally.seconds.values()))
    locate(summary, dest)
    publish_artifacts(summary, ledger, tally.seconds)
    publish_runs_table(layout.dest, dest)
    get_run_logger().info(
        "run %s: %d handed off, %d masked, %d retired, %d retirements failed, %d failed, "
        "%d malformed input lines",
        run_id,
        summary.handed_off,
        summary.masked,
        summary.retired,
        summary.retire_failed,
        summary.failed,
        summary.malformed_lines,
    )
    if summary.terminal_methods:
        get_run_logger().info(
            "run %s: terminal attributed by %s; top abstentions %s",
            run_id,
            summary.terminal_methods,
            summary.terminal_abstentions,
        )
    return summary


def publish_artifacts(
    summary: RunSummary, ledger: list[LedgerLine], batch_seconds: dict[int, float]
) -> None:
    delivered = [
        line.delivered_fraction
        for line in ledger
        if not line.masked and line.delivered_fraction is not None
    ]
    create_table_artifact(
        key=artifact_key(summary.run_id, "summary"),
        table=summary_table(summary),
        description=f"tokcap finalization run {summary.run_id}",
    )
    create_markdown_artifact(
        key=artifact_key(summary.run_id, "report"),
        markdown=markdown_report(summary, ledger, delivered, batch_seconds),
        description=f"tokcap report for run {summary.run_id}",
    )


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
