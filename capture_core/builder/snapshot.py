"""One rollout's build from a frozen snapshot: attribution, builder, projection, the verdict.

`build_from_snapshot` is the one build path: every seed function and the finalizer use it.
Empty snapshots fail, incomplete ones mask, and the snapshot's identity is attached.
Builder, validation, projection and contiguity errors become failed builds, never exceptions.
Single-response delivery rejects `per_request` because it can return several trajectories.
A finished record, when given, names its terminal call; attribution anchors the build to it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from capture_core.builder.build_result import BuildResult, SnapshotIdentity, incomplete_reason
from capture_core.builder.chain import BuildOutput
from capture_core.builder.projection import assert_prefix_contiguity, project_main_chain_response
from capture_core.builder.registry import run_builder
from capture_core.builder.terminal import (
    CHAIN_BROKEN,
    CHAIN_DELIVERED,
    NOT_ATTRIBUTED,
    TerminalAttribution,
    TerminalInputs,
    TerminalMetric,
)
from capture_core.builder.terminal_witnesses import attribute_terminal, check_strict_chain
from capture_core.builder.token_provenance import chain_provenance, traces_provenance
from capture_core.builder.trace_envelope import MAIN_CHAIN
from capture_core.builder.traces import build_training_traces
from capture_core.errors import error_text
from capture_core.records import coerce_token_entry

logger = logging.getLogger(__name__)

EMPTY_CAPTURE_ERROR = "capture contains no token records"
PER_REQUEST_ERROR = (
    "per_request builds one trajectory per call; single-response delivery needs prefix_merging"
)


@dataclass
class _Progress:
    """What a build has established so far: a build that fails later reports it."""

    attribution: TerminalAttribution = NOT_ATTRIBUTED
    chain: str = ""

    def terminal_metrics(self) -> TerminalMetric:
        return TerminalMetric.of(self.attribution, self.chain)


def assemble(
    rollout_id: str,
    entries: list,
    builder: str,
    model: str,
    terminal: TerminalInputs | None = None,
    *,
    delivery: str = MAIN_CHAIN,
    one_attempt: bool = True,
) -> BuildResult:
    """The in-memory build of one rollout's entries for `delivery`; a failure is a failed
    (masked) build, never an exception.

    `main_chain` builds and projects the main chain. An attributed terminal anchors it and
    decides the mask: delivered or masked, never the strict policy. Unattributed, the strict
    single-chain policy applies; a declared terminal that could not be attributed, or
    contradicting witnesses, mask. Any other delivery builds the `all_traces` envelope;
    `one_attempt` says the capture shows it holds one attempt (see `build_training_traces`).
    """
    if delivery != MAIN_CHAIN:
        return _assemble_traces(rollout_id, entries, builder, terminal, one_attempt)
    if builder == "per_request":
        return BuildResult.failed(rollout_id, builder, PER_REQUEST_ERROR, n_calls=len(entries))
    progress = _Progress()
    try:
        return _build_and_project(rollout_id, entries, builder, model, terminal, progress)
    except Exception as exc:
        logger.debug("rollout %s: build failed: %s", rollout_id, exc, exc_info=True)
        error = error_text(exc)
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
    provenance = chain_provenance([link.entry for link in built.main_chain.links])
    return BuildResult.trajectory(
        rollout_id, builder, response, masked, built, len(records), metrics, provenance
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


def _assemble_traces(
    rollout_id: str, entries: list, builder: str, terminal: TerminalInputs | None, one_attempt: bool
) -> BuildResult:
    """The `all_traces` build of `assemble`; `one_attempt`: the capture holds one attempt."""
    try:
        built = build_training_traces(
            rollout_id, entries, builder, terminal, one_attempt=one_attempt
        )
        if built.envelope is None:
            return BuildResult.traced(built)
        calls = [coerce_token_entry(entry) for entry in entries]
        return BuildResult.traced(built, traces_provenance(built.envelope, calls))
    except Exception as exc:
        logger.debug("rollout %s: traces build failed: %s", rollout_id, exc, exc_info=True)
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
    without inventing an `error`; its reasons are the build's `mask_reason`. With no entry
    left they are also the failed build's error. It does not log a mask: its caller warns
    once per masked rollout (`warn_masked`), or reports it with the input line. `terminal`
    (from the finished record) anchors the build to the scored call. `delivery="all_traces"`
    builds the envelope instead of the main chain (an incomplete snapshot never carries one);
    several traces need the snapshot's `attempt_marked` (absent: not marked).
    """
    rollout_id = str(getattr(snapshot, "rollout_id", ""))
    try:
        entries = list(snapshot.entries)
        incomplete = bool(snapshot.incomplete)
        marked = getattr(snapshot, "attempt_marked", False) is True
        identity = SnapshotIdentity(snapshot.snapshot_id, snapshot.version)
        reasons = tuple(map(str, getattr(snapshot, "incomplete_reasons", ()))) or (
            "a call was lost",
        )
    except Exception as exc:
        error = f"unreadable snapshot: {error_text(exc)}"
        return BuildResult.failed(rollout_id, builder, error)
    if not entries:
        error = incomplete_reason(reasons) if incomplete else EMPTY_CAPTURE_ERROR
        built = BuildResult.failed(rollout_id, builder, error)
    else:
        built = assemble(
            rollout_id, entries, builder, model, terminal, delivery=delivery, one_attempt=marked
        )
    return built.of_snapshot(identity, incomplete, reasons)


def warn_masked(built: BuildResult, rollout: str | None = None) -> None:
    """The one warning of a masked build, with its one reason (`mask_reason`)."""
    if built.mask_sample:
        name = built.rollout_id or rollout or "without a rollout id"
        logger.warning("rollout %s masked: %s", name, built.mask_reason())
