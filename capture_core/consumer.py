"""Turn a rollout's frozen token capture into trajectories.

Gym rollout collection and trainer finalization both use this consumer.
Every path freezes first, then passes the snapshot through `build_from_snapshot`.
A build is a typed `BuildResult` until a seed function returns it as NeMo Gym's dict.
Builder, validation, projection and contiguity errors become failed builds, never exceptions.
Single-response delivery rejects `per_request` because it can return several trajectories.
The caller supplies the rollout id; this module does not import rollout-record modules.
A finished record, when given, names its terminal call; attribution anchors the build to it.
Capture locations are local paths or fsspec URLs.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from capture_core.build_result import SNAPSHOT_KEY as SNAPSHOT_KEY
from capture_core.build_result import TERMINAL_METRIC as TERMINAL_METRIC
from capture_core.build_result import BuildResult, SnapshotIdentity
from capture_core.builder import (
    BuildOutput,
    assert_prefix_contiguity,
    project_main_chain_response,
    run_builder,
)
from capture_core.capture_source import clear_captures
from capture_core.config import TokenIdCaptureConfig
from capture_core.ids import maybe_rollout_id_from_run_body, validate_rollout_id
from capture_core.protocols import TokenSource
from capture_core.records import coerce_token_entry
from capture_core.store import TokenCaptureStore
from capture_core.terminal import (
    CHAIN_BROKEN,
    CHAIN_DELIVERED,
    NOT_ATTRIBUTED,
    TerminalAttribution,
    TerminalInputs,
    attribute_terminal,
    check_strict_chain,
)
from capture_core.trace_envelope import MAIN_CHAIN
from capture_core.traces import build_training_traces

logger = logging.getLogger(__name__)

EMPTY_CAPTURE_ERROR = "capture contains no token records"
PER_REQUEST_ERROR = (
    "per_request builds one trajectory per call; single-response delivery needs prefix_merging"
)


def _failed_build(rollout_id: str, builder: str, error: str, n_calls: int = 0) -> dict:
    """A failed (masked) build as the seed dict; see `BuildResult.failed`."""
    return BuildResult.failed(rollout_id, builder, error, n_calls=n_calls).to_dict()


def _assemble(
    rollout_id: str,
    entries: list,
    builder: str,
    model: str,
    terminal: TerminalInputs | None = None,
) -> dict:
    """`assemble` as the seed dict."""
    return assemble(rollout_id, entries, builder, model, terminal).to_dict()


@dataclass
class _Progress:
    """What a build has established so far: a build that fails later reports it."""

    attribution: TerminalAttribution = NOT_ATTRIBUTED
    chain: str = ""

    def terminal_metrics(self) -> dict[str, Any]:
        return self.attribution.metrics(self.chain)


def assemble(
    rollout_id: str,
    entries: list,
    builder: str,
    model: str,
    terminal: TerminalInputs | None = None,
) -> BuildResult:
    """Build and project one rollout's entries; any failure is a failed (masked) build.

    An attributed terminal anchors the build and decides the mask: delivered or masked,
    never the strict policy. Unattributed, the strict single-chain policy applies; a
    declared terminal that could not be attributed, or contradicting witnesses, mask.
    """
    if builder == "per_request":
        return BuildResult.failed(rollout_id, builder, PER_REQUEST_ERROR, n_calls=len(entries))
    progress = _Progress()
    try:
        return _build_and_project(rollout_id, entries, builder, model, terminal, progress)
    except Exception as exc:
        logger.warning("rollout %s: build failed: %s", rollout_id, exc)
        error = f"{type(exc).__name__}: {exc}"
        metrics = progress.terminal_metrics()
        return BuildResult.failed(
            rollout_id, builder, error, n_calls=len(entries), terminal=metrics
        )


def _build_and_project(
    rollout_id: str,
    entries: list,
    builder: str,
    model: str,
    terminal: TerminalInputs | None,
    progress: _Progress,
) -> BuildResult:
    """The steps of `assemble`; each may raise, and `progress` says how far they got."""
    records = [coerce_token_entry(entry) for entry in entries]
    progress.attribution = attribute_terminal(records, terminal)
    anchor = progress.attribution.call_id
    if anchor is None:
        built = run_builder(records, builder)
    else:
        built = run_builder(records, builder, terminal_call_id=anchor)
    progress.chain = built.notes.terminal_chain
    refused = _refusal(progress.attribution, built)
    if refused is not None:
        logger.warning("rollout %s: %s", rollout_id, refused)
        metrics = progress.terminal_metrics()
        return BuildResult.failed(
            rollout_id, builder, refused, n_calls=len(entries), terminal=metrics
        )
    for chain_built in built.chains:
        chain_built.validate()
    progress.attribution = _check_strict(progress.attribution, terminal, built)
    response = project_main_chain_response(rollout_id, built, model=model)
    assert_prefix_contiguity(response)
    masked = _mask(progress.attribution, built)
    metrics = progress.terminal_metrics()
    return BuildResult.trajectory(
        rollout_id, builder, response, masked, built, len(records), metrics
    )


def _mask(attribution: TerminalAttribution, built: BuildOutput) -> bool:
    if attribution.call_id is not None:
        return False
    notes = built.notes
    strict = bool(notes.unresolved_retries) or notes.roots != 1 or notes.chains != 1
    return strict or attribution.must_mask


def _check_strict(
    attribution: TerminalAttribution, terminal: TerminalInputs | None, built: BuildOutput
) -> TerminalAttribution:
    """Check a strict main chain about to be delivered against the scored response."""
    if not built.chains or _mask(attribution, built):
        return attribution
    main = [link.entry for link in built.chains[0].links]
    return check_strict_chain(attribution, terminal, main)


def _refusal(attribution: TerminalAttribution, built: BuildOutput) -> str | None:
    """Why this build is never delivered, whatever the strict policy says; else `None`.

    An attributed terminal whose chain is not delivered, a call whose recorded parent is
    missing from the snapshot (a lost call, even off the path: the tokens may have linked
    the path across it), or (unattributed) calls whose writer-recorded lineage the tokens
    contradict: dropping those would hide a lost call. A build the strict policy would
    deliver while it holds ambiguous calls is refused too (NeMo Gym delivers it without them).
    """
    chain = built.notes.terminal_chain
    if attribution.call_id is not None and chain != CHAIN_DELIVERED:
        return _undeliverable(attribution, chain)
    if attribution.call_id is not None and built.notes.lost_parents:
        return _lost_parents(built.notes.lost_parents)
    if attribution.call_id is None and built.notes.contradicted_calls:
        return _contradicted(built.notes.contradicted_calls)
    ambiguous = built.notes.ambiguous_calls
    if attribution.call_id is None and ambiguous and not _mask(attribution, built):
        return _ambiguous(ambiguous)
    return None


def _ambiguous(call_ids: list[str]) -> str:
    """The error of a strict build that would deliver a chain without its ambiguous calls."""
    return (
        f"calls {call_ids} extend several calls with one token sequence, so their parent is "
        "ambiguous; the only chain left would silently drop them, so the rollout is masked "
        "and its capture kept as evidence"
    )


def _contradicted(call_ids: list[str]) -> str:
    """The error of a strict build holding calls whose recorded lineage the tokens deny."""
    return (
        f"writer lineage contradicted by the tokens for calls {call_ids}: a recorded parent "
        "is missing from the snapshot or denied by the tokens, or a cum_len or digest does "
        "not describe the call; the rollout is masked and its capture kept as evidence"
    )


def _lost_parents(lost: dict[str, str]) -> str:
    """The error of an attributed build with calls whose recorded parents were lost."""
    named = ", ".join(f"{child!r} names {parent!r}" for child, parent in lost.items())
    return (
        f"recorded parents missing from the snapshot ({named}): a call was lost, and the "
        "tokens may link the scored path across it; the rollout is masked and its capture "
        "kept as evidence"
    )


def _undeliverable(attribution: TerminalAttribution, chain: str) -> str:
    """The error of an attributed terminal whose chain cannot be delivered (it masks)."""
    if chain == CHAIN_BROKEN:
        why = "its path crosses an ambiguous or contradicted call"
    else:
        why = "it is not among the calls with generated tokens"
    return (
        f"terminal chain {chain}: call {attribution.call_id!r} (attributed by "
        f"{attribution.method}) cannot be delivered, {why}; the rollout is masked and its "
        "capture kept as evidence"
    )


def assemble_traces(
    rollout_id: str, entries: list, builder: str, terminal: TerminalInputs | None = None
) -> BuildResult:
    """The `all_traces` build of one rollout's entries; any failure is a failed (masked) build."""
    try:
        return BuildResult.traced(build_training_traces(rollout_id, entries, builder, terminal))
    except Exception as exc:
        logger.warning("rollout %s: traces build failed: %s", rollout_id, exc)
        error = f"{type(exc).__name__}: {exc}"
        return BuildResult.failed(rollout_id, builder, error, n_calls=len(entries))


def build_from_snapshot(
    snapshot: Any,
    builder: str,
    model: str,
    terminal: TerminalInputs | None = None,
    delivery: str = MAIN_CHAIN,
) -> BuildResult:
    """The one build path: empty snapshots fail, incomplete ones mask, the snapshot is attached.

    `snapshot` is a `TokenCaptureSnapshot` or another library's snapshot type with the same
    fields (`rollout_id`, `entries`, `incomplete`, `snapshot_id`, `version`); one that cannot
    be read is a failed build, never an exception. An incomplete snapshot masks the build
    without inventing an `error`; its reasons are logged. With no entry left its reasons are
    the cause, so they become the failed build's error. `terminal` (from the finished record)
    anchors the build to the scored call. `delivery="all_traces"` builds the envelope instead
    of the main chain (an incomplete snapshot never carries one).
    """
    rollout_id = str(getattr(snapshot, "rollout_id", ""))
    try:
        entries = list(snapshot.entries)
        incomplete = bool(snapshot.incomplete)
        identity = SnapshotIdentity(snapshot.snapshot_id, snapshot.version)
        reasons = "; ".join(getattr(snapshot, "incomplete_reasons", ())) or "a call was lost"
    except Exception as exc:
        logger.warning("rollout %s: unreadable snapshot: %s", rollout_id, exc)
        error = f"unreadable snapshot: {type(exc).__name__}: {exc}"
        return BuildResult.failed(rollout_id, builder, error)
    if not entries:
        error = f"capture incomplete: {reasons}" if incomplete else EMPTY_CAPTURE_ERROR
        built = BuildResult.failed(rollout_id, builder, error)
    elif delivery == MAIN_CHAIN:
        built = assemble(rollout_id, entries, builder, model, terminal)
    else:
        built = assemble_traces(rollout_id, entries, builder, terminal)
    if incomplete:
        logger.warning("rollout %s masked: capture incomplete: %s", rollout_id, reasons)
    return built.of_snapshot(identity, incomplete)


def _freeze_failed(rollout_id: str, builder: str, exc: Exception) -> dict:
    return _failed_build(rollout_id, builder, f"freeze failed: {type(exc).__name__}: {exc}")


def _seed_build(snapshot: Any, builder: str, model: str, record: Mapping[str, Any] | None) -> dict:
    """A seed function's build of a frozen snapshot, anchored by the finished `record`."""
    return build_from_snapshot(
        snapshot, builder, model, TerminalInputs.from_record(record)
    ).to_dict()


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
        snapshot = TokenCaptureStore(token_capture_dirs[0]).freeze_now(rollout_id)
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
    clear_captures(TokenCaptureStore(token_capture_dirs[0]), rollout_ids)
    if malformed:
        raise ValueError(
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
