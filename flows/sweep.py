"""The tombstone sweep: remove what retired captures leave, once no writer can still need it.

A retired rollout keeps `FROZEN` and `RETIRED` (a NeMo Gym directory: its state and lock
files) so late writers of that attempt fail. The sweep removes them once older than
`older_than` (default `DEFAULT_SWEEP_AGE`, at least an hour); refusals, incomplete
markers and masked captures are never swept. The count is logged and published as an
artifact, `tokcap-sweep`. The shipped `sweep-retired` deployment runs it daily.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact
from pydantic import BaseModel

from capture_core.config import public_storage_options
from capture_core.run.capture_source import SourceSpec
from capture_core.store.retirement import DEFAULT_SWEEP_AGE, sweep_age_seconds
from tokcap.tasks.sweep import sweep_retired

ARTIFACT_KEY = "tokcap-sweep"


class SweepSummary(BaseModel):
    """What one sweep removed."""

    store: str
    older_than: str
    swept: int


@flow(name="sweep-retired", flow_run_name="sweep tombstones older than {older_than} in {store}")
def sweep_retired_captures(
    store: str,
    older_than: str = DEFAULT_SWEEP_AGE,
    storage_options: dict[str, Any] | None = None,
    source_kwargs: dict[str, Any] | None = None,
) -> SweepSummary:
    """Remove the tombstones of rollouts retired more than `older_than` ago (`36h`, `2d`...)."""
    seconds = sweep_age_seconds(older_than)
    options = public_storage_options(storage_options)
    source = SourceSpec(store=store, storage_options=options, source_kwargs=source_kwargs)
    swept = sweep_retired(source, seconds)
    summary = SweepSummary(store=store, older_than=older_than, swept=swept)
    create_table_artifact(
        key=ARTIFACT_KEY,
        table=[{"store": store, "older than": older_than, "tombstones swept": swept}],
        description=f"tokcap sweep of {store}: {swept} retired rollouts' tombstones removed",
    )
    get_run_logger().info(
        "sweep of %s: %d retired rollouts' tombstones older than %s removed",
        store,
        swept,
        older_than,
    )
    return summary
