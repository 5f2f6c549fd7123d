"""The dispatch-time clear as a task: delete the captures of rollouts about to be dispatched."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prefect import get_run_logger

from capture_core.consumer import rollout_ids_of
from capture_core.operator.run_report import plural
from capture_core.run import capture_source
from capture_core.run.rollout_io import read_records
from tokcap.tasks.common import tokcap_task


def clear_run_name(parameters: Mapping[str, Any]) -> str:
    count = len(parameters["rollout_ids"])
    return f"clear captures of {plural(count, 'rollout')} in {parameters['source'].store}"


@tokcap_task("clear-captures", clear_run_name)
def clear_captures(rollout_ids: list[str], source: capture_source.SourceSpec) -> int:
    """Delete each rollout's capture, tombstone included; safe to repeat. Returns the count."""
    cleared = capture_source.clear_captures(source.open(), rollout_ids, source.store)
    get_run_logger().info("cleared captures of %d rollouts in %s", cleared, source.store)
    return cleared


@tokcap_task("read-rollout-ids", "read rollout ids of {rollouts}")
def read_rollout_ids(
    rollouts: str, storage_options: Mapping[str, Any] | None = None
) -> tuple[list[str], list[str], int]:
    """Distinct rollout ids of a records file, descriptions of bad lines, and id-less count."""
    records, problems = [], []
    for parsed in read_records(rollouts, storage_options):
        if parsed.record is None:
            problems.append(parsed.error or f"line {parsed.line}: unreadable")
        else:
            records.append(parsed.record)
    ids, malformed, without_id = rollout_ids_of(records)
    return ids, problems + malformed, without_id
