"""Turn a rollout's frozen token capture into trajectories, and clear captures before dispatch.

Gym rollout collection and trainer finalization both use this consumer.
Every path freezes first, then passes the snapshot through `builder.snapshot.build_from_snapshot`.
A build is a typed `BuildResult` until a seed function returns it as NeMo Gym's dict.
The caller supplies the rollout id; this module does not import rollout-record modules.
Capture locations are local paths or fsspec URLs, opened by `store.open_capture_store`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from capture_core.builder.build_result import BuildResult
from capture_core.builder.snapshot import assemble, build_from_snapshot, warn_masked
from capture_core.builder.terminal import TerminalInputs
from capture_core.config import TokenIdCaptureConfig
from capture_core.errors import InvalidRecordError, error_text
from capture_core.ids import maybe_rollout_id_from_run_body, validate_rollout_id
from capture_core.protocols import TokenSource
from capture_core.run.capture_source import clear_captures
from capture_core.store import open_capture_store

logger = logging.getLogger(__name__)


def _failed_build(rollout_id: str, builder: str, error: str, n_calls: int = 0) -> dict:
    """A build that produced nothing to deliver, as NeMo Gym's dict: masked, with its error."""
    return BuildResult.failed(rollout_id, builder, error, n_calls=n_calls).to_dict()


def _assemble(
    rollout_id: str,
    entries: list,
    builder: str,
    model: str,
    *,
    terminal: TerminalInputs | None = None,
) -> dict:
    """Build and project one rollout's entries as NeMo Gym's dict; a failure is a failed build.

    It never raises. Unlike the seed functions it has no snapshot, so the dict carries no
    `_capture_snapshot` and cannot retire anything.
    """
    return assemble(rollout_id, entries, builder, model, terminal).to_dict()


def _freeze_failed(rollout_id: str, builder: str, exc: Exception) -> dict:
    error = f"freeze failed: {error_text(exc)}"
    built = BuildResult.failed(rollout_id, builder, error)
    warn_masked(built)
    return built.to_dict()


def _seed_build(snapshot: Any, builder: str, model: str, record: Mapping[str, Any] | None) -> dict:
    """A seed function's build of a frozen snapshot, anchored by the finished `record`; a
    masked build is one warning."""
    built = build_from_snapshot(snapshot, builder, model, TerminalInputs.from_record(record))
    warn_masked(built)
    return built.to_dict()


async def trajectories_from_source(
    rollout_id: str,
    source: TokenSource,
    builder: str = "prefix_merging",
    model: str = "",
    *,
    record: Mapping[str, Any] | None = None,
) -> dict | None:
    """Build trajectories from a frozen `TokenSource` snapshot.

    `record`, the finished rollout record, lets terminal attribution anchor the build.

    Missing records are unsafe and return a masked result.
    An incomplete snapshot is unsafe and returns a masked result.
    A freeze error is a failed build. `None` only when there is no source.
    """
    if source is None:
        return None
    try:
        snapshot = await source.freeze(rollout_id)
    except Exception as exc:
        return _freeze_failed(rollout_id, builder, exc)
    return _seed_build(snapshot, builder, model, record)


def trajectories_for_rollout(
    rollout_id: str,
    token_capture_dirs: Sequence[str | os.PathLike[str]],
    builder: str = "prefix_merging",
    model: str = "",
    *,
    record: Mapping[str, Any] | None = None,
) -> dict | None:
    """Build trajectories from a frozen snapshot of the configured store location.

    `record`, the finished rollout record, lets terminal attribution anchor the build.

    Return `None` only when no capture location is configured (the first one is used).
    Missing records are unsafe and return a masked result.
    An incomplete snapshot is unsafe and returns a masked result.
    S3 locations take credentials and endpoint from the standard AWS environment.
    """
    if not token_capture_dirs:
        return None
    try:
        snapshot = open_capture_store(token_capture_dirs[0]).freeze_now(rollout_id)
    except Exception as exc:
        return _freeze_failed(rollout_id, builder, exc)
    return _seed_build(snapshot, builder, model, record)


def clear_token_captures_for_rollouts(
    records: Iterable[Any], token_capture_dirs: Sequence[str | os.PathLike[str]]
) -> None:
    """Remove stale token records for rollouts about to be dispatched.

    Rollout ids are deterministic, so a reused id would otherwise mix two attempts.
    The caller passes only rows ready for dispatch, with retry suffixes already assigned.
    Every valid id is cleared; malformed ids are then reported together in one `ValueError`.
    """
    if not token_capture_dirs:
        return
    rollout_ids, malformed, _without_id = rollout_ids_of(records)
    clear_captures(open_capture_store(token_capture_dirs[0]), rollout_ids)
    if malformed:
        raise InvalidRecordError(
            f"{len(malformed)} record(s) have malformed rollout ids and were not cleared: "
            + "; ".join(malformed)
        )


def rollout_ids_of(records: Iterable[Any]) -> tuple[list[str], list[str], int]:
    """Distinct rollout ids, a description of each malformed one, and how many had no id.

    An id no store can hold (too long) counts as malformed: nothing was captured under it.
    """
    ids: dict[str, None] = {}
    malformed: list[str] = []
    without_id = 0
    for position, record in enumerate(records):
        try:
            rollout_id = maybe_rollout_id_from_run_body(record)
            if rollout_id is not None:
                validate_rollout_id(rollout_id)
        except ValueError as exc:
            malformed.append(f"record {position}: {exc}")
            continue
        if rollout_id is None:
            without_id += 1
        else:
            ids[rollout_id] = None
    return list(ids), malformed, without_id


def token_id_capture_dirs_from_config(
    global_config_dict: Mapping[str, Any] | None,
) -> list[Path | str]:
    """Return the enabled token store location (a `Path` or a URL) or an empty list."""
    location = TokenIdCaptureConfig.from_global(global_config_dict).location()
    return [] if location is None else [location]
