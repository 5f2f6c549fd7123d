"""The run report task: the ledger file and the Prefect UI artifacts of one run."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from prefect import get_run_logger
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from capture_core.run.inbox import Claim
from capture_core.run.run_layout import LedgerLine, RunLayout
from capture_core.run.run_progress import RunTally
from capture_core.run.run_report import RunSummary, markdown_report, summary_table
from capture_core.storage import open_byte_store
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
    RunLayout(open_byte_store(dest, storage_options), run_id).write_ledger(ledger)
    summary = tally.summary(dest, ledger)
    publish_artifacts(summary, ledger, tally.seconds)
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
