"""The tombstone sweep as a task: remove the captures of rollouts retired long enough ago."""

from __future__ import annotations

from prefect import get_run_logger

from capture_core.run.capture_source import SourceSpec
from tokcap.tasks.common import tokcap_task


@tokcap_task(
    "sweep-retired", "sweep tombstones older than {older_than_seconds:.0f} s from {source.store}"
)
def sweep_retired(source: SourceSpec, older_than_seconds: float) -> int:
    """Run the store's own `sweep_retired` (a NeMo Gym directory: its lock protocol); safe to
    repeat. Returns how many rollouts' tombstones were removed."""
    sweep = getattr(source.open(), "sweep_retired", None)
    if sweep is None:
        raise ValueError(
            f"source {source.store} has no sweep_retired(older_than_seconds); it cannot be swept"
        )
    swept = int(sweep(older_than_seconds))
    get_run_logger().info(
        "swept %d retired rollouts' tombstones older than %ds from %s",
        swept,
        older_than_seconds,
        source.store,
    )
    return swept
