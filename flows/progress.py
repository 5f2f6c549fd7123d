"""A finalize run's progress, batch by batch: in the run's logs, on the console, in the UI.

Each batch done is one line (`capture_core.operator.run_pace`), logged at INFO on the flow-run
logger (the run's logs keep it beside the tasks' per-batch lines) and on `tokcap.progress`,
which the CLI shows on its console (`tokcap.flows.cli.progress_line`) whatever Prefect's log level,
and written into the description of the run's progress artifact.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence

from prefect import get_run_logger
from prefect.artifacts import create_progress_artifact, update_progress_artifact

from capture_core.operator.run_pace import BatchProgress, RunPace
from capture_core.run.receipt import receipt_key
from capture_core.run.rollout_io import BatchPlan

PROGRESS_LOGGER = "tokcap.progress"
PROGRESS_FIELD = "tokcap_progress"
"""The log record attribute holding the `BatchProgress` of a `tokcap.progress` line."""


class RunProgress:
    """Reports the batches of one run as they are done; the clock starts at creation."""

    def __init__(self, run_id: str, batches: Sequence[BatchPlan], earlier: Collection[str]):
        self.run_id = run_id
        self.pace = RunPace([(b.lines, receipt_key(b) not in earlier) for b in batches])
        total = sum(b.lines for b in batches)
        self.artifact = create_progress_artifact(
            0.0, description=f"tokcap run {run_id}: 0/{len(batches)} batches, 0/{total} rollouts"
        )

    def batch_done(self, masked: int) -> BatchProgress:
        """Report the next batch done; `masked` counts the rollouts masked so far."""
        progress = self.pace.batch_done(masked)
        get_run_logger().info(progress.text)
        logging.getLogger(PROGRESS_LOGGER).info(progress.text, extra={PROGRESS_FIELD: progress})
        update_progress_artifact(
            self.artifact,
            progress.percent,
            description=f"tokcap run {self.run_id}: {progress.text}",
        )
        return progress
