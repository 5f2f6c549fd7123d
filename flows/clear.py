"""The dispatch-time clear: before rollouts are dispatched, delete their stale captures.

Rollout ids are deterministic, so the next attempt reuses them; a stale capture would mix
two attempts. Exactly the given rollouts are cleared; malformed ids are reported together.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger
from pydantic import BaseModel

from capture_core.config import public_storage_options
from capture_core.consumer import rollout_ids_of
from capture_core.run.capture_source import SourceSpec
from tokcap.tasks.clear import clear_captures, read_rollout_ids


class ClearSummary(BaseModel):
    """Counts of one dispatch-time clear."""

    cleared: int
    without_id: int
    malformed: int


def _describe(rollouts: str | list[dict[str, Any]]) -> str:
    return rollouts if isinstance(rollouts, str) else f"{len(rollouts)} records"


@flow(name="dispatch-clear", flow_run_name="clear captures for {rollouts}")
def dispatch_clear(
    rollouts: str | list[dict[str, Any]],
    store: str,
    storage_options: dict[str, Any] | None = None,
    source_kwargs: dict[str, Any] | None = None,
) -> ClearSummary:
    """Delete the captures of exactly these rollouts (a records file URL or a list of records).

    Every valid id is cleared; malformed ids then fail the run in one error listing them all.
    """
    options = public_storage_options(storage_options)
    if isinstance(rollouts, str):
        ids, malformed, without_id = read_rollout_ids(rollouts, options)
    else:
        ids, malformed, without_id = rollout_ids_of(rollouts)
    source = SourceSpec(store=store, storage_options=options, source_kwargs=source_kwargs)
    cleared = clear_captures(ids, source)
    summary = ClearSummary(cleared=cleared, without_id=without_id, malformed=len(malformed))
    get_run_logger().info(
        "dispatch clear of %s: captures of %d rollout ids cleared, %d records without an id, "
        "%d malformed ids",
        _describe(rollouts),
        cleared,
        without_id,
        len(malformed),
    )
    if malformed:
        raise ValueError(
            f"{len(malformed)} rollout record(s) have malformed ids and were not cleared "
            f"({cleared} others were): " + "; ".join(malformed[:20])
        )
    return summary
