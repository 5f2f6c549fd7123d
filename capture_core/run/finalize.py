"""Finalize one finished rollout record from its capture: the one finalize path.

The finalizer freezes the rollout's captured calls and rebuilds `response.output` from them.
It never retires; the caller retires only after durable handoff, by snapshot id and version.
Existing token ids are the policy's sampled data: such a rollout is left unchanged, when
they pass a captured call's validation; malformed ones are rebuilt from the capture, or mask.
Failed or masked builds keep their capture as evidence.
The record's terminal fields and scored `response` attribute the call that earned the reward.
`delivery.finalize_rollout_token_capture` (NeMo Gym's name) returns this build as a dict.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from capture_core.builder.build_result import (
    MASK_SAMPLE_KEY,
    TOKEN_CAPTURE_KEY,
    BuildResult,
    SnapshotIdentity,
)
from capture_core.builder.snapshot import build_from_snapshot, warn_masked
from capture_core.builder.terminal import TerminalInputs
from capture_core.builder.trace_envelope import DELIVERIES, ENVELOPE_KEY, MAIN_CHAIN
from capture_core.errors import error_text
from capture_core.ids import maybe_rollout_id_from_run_body
from capture_core.protocols import TokenSource
from capture_core.records import TOKEN_FIELDS, check_response_token_arrays, response_items

logger = logging.getLogger(__name__)

NO_CAPTURE_KEY = "no capture key"
"""The error of a record that names no rollout (NeMo Gym's words): its capture has no key."""


def mask_unusable(result: dict, error: str) -> BuildResult:
    """Mask a rollout that needed token ids and could not get them; the record keeps why.

    An unmasked rollout would appear healthy until it reaches the trainer.
    """
    built = BuildResult.unusable(error)
    result[MASK_SAMPLE_KEY] = True
    result[TOKEN_CAPTURE_KEY] = built.record_metrics()
    return built


def _carries_generated_ids(item: Any) -> bool:
    """A non-empty array of ids (a list, tuple or array); empty or absent carries nothing."""
    ids = item.get("generation_token_ids") if isinstance(item, Mapping) else None
    if ids is None or isinstance(ids, str | bytes) or not hasattr(ids, "__len__"):
        return False
    return len(ids) > 0


def rollout_carries_token_ids(result: dict) -> bool:
    """Whether this rollout already holds what training needs.

    True when any Responses output item or Chat `choices[].message` carries a non-empty
    `generation_token_ids`: what the policy sampled takes precedence over a reconstruction,
    and partial coverage stays visible. An empty list carries nothing, so such a record is
    finalized from its capture like any other.
    """
    response = result.get("response")
    if not isinstance(response, Mapping):
        return False
    return any(_carries_generated_ids(item) for item in response_items(response))


@dataclass(frozen=True)
class BuildOptions:
    """How a rollout is built: the builder and the delivery (`main_chain` or `all_traces`).

    They are not refused here: an unknown one masks each rollout, naming it, because the
    finalizer never raises.
    """

    builder: str = "prefix_merging"
    delivery: str = MAIN_CHAIN


async def finalize_rollout(
    result: dict, source: TokenSource | None, options: BuildOptions = BuildOptions()
) -> BuildResult | None:
    """Finalize `result` in place from its capture through `source`; the build, typed.

    It mutates `result`, replacing only `response.output` and adding the metrics and mask.
    It freezes and never retires. It never raises: missing or ambiguous tokens mask the
    rollout. `None` when there is no source (or a record that already carries token ids
    cannot be frozen). With the `all_traces` delivery it keeps `response` and adds the checked
    `training_traces` envelope instead (docs/traces.md); a masked record carries none.
    A masked rollout is one warning, with its `mask_reason`.
    """
    built = await finalize_record(result, source, options)
    if built is not None:
        warn_masked(built, plain_rollout_id(result))
    return built


async def finalize_record(
    result: dict, source: TokenSource | None, options: BuildOptions
) -> BuildResult | None:
    """`finalize_rollout` without its mask warning: for a caller that reports each masked
    rollout itself, with its input line (a run's batch)."""
    builder, delivery = options.builder, options.delivery
    if source is None:
        return None
    if delivery != MAIN_CHAIN:
        result.pop(ENVELOPE_KEY, None)  # one already on the record never survives
    try:
        if delivery == MAIN_CHAIN:
            return await _finalize(result, source, builder)
        return await _finalize_traces(result, source, builder, delivery)
    except Exception as exc:
        return mask_unusable(result, error_text(exc))


def plain_rollout_id(result: dict) -> str | None:
    """The record's rollout id, or `None` when it has none or a malformed one."""
    try:
        return maybe_rollout_id_from_run_body(result)
    except ValueError:
        return None


async def _finalize_traces(
    result: dict, source: TokenSource, builder: str, delivery: str
) -> BuildResult:
    """The `all_traces` finalize: the checked envelope from the capture, or a mask and none.

    A record that already carries token ids gets its envelope from the capture too: those
    ids cover one chain at most.
    """
    if delivery not in DELIVERIES:
        error = f"unknown delivery {delivery!r}; use one of {', '.join(DELIVERIES)}"
        return mask_unusable(result, error)
    try:
        rollout_id = maybe_rollout_id_from_run_body(result)
    except ValueError as exc:
        return mask_unusable(result, f"malformed rollout id: {exc}")
    if rollout_id is None:
        return mask_unusable(result, NO_CAPTURE_KEY)
    try:
        snapshot = await source.freeze(rollout_id)
    except Exception as exc:
        return mask_unusable(result, f"{type(exc).__name__}: {exc}")
    terminal = TerminalInputs.from_record(result)
    built = build_from_snapshot(snapshot, builder, "", terminal, delivery)
    _apply(result, built)
    return built


async def _finalize(result: dict, source: TokenSource, builder: str) -> BuildResult | None:
    try:
        rollout_id = maybe_rollout_id_from_run_body(result)
    except ValueError as exc:
        return mask_unusable(result, f"malformed rollout id: {exc}")
    malformed = None
    if rollout_carries_token_ids(result):
        malformed = malformed_token_arrays(result)
        if malformed is None:
            return await _redundant_capture(rollout_id, source)
        logger.warning("rollout %s: rebuilding it from its capture: %s", rollout_id, malformed)
    if rollout_id is None:
        return mask_unusable(result, _noting(NO_CAPTURE_KEY, malformed))
    try:
        snapshot = await source.freeze(rollout_id)
    except Exception as exc:
        return mask_unusable(result, _noting(error_text(exc), malformed))
    response = result.get("response")
    model = str(response.get("model") or "") if isinstance(response, dict) else ""
    built = build_from_snapshot(snapshot, builder, model, TerminalInputs.from_record(result))
    if malformed is not None:
        built = _replacing_malformed(result, built, malformed)
    _apply(result, built)
    return built


def malformed_token_arrays(result: dict) -> str | None:
    """Why the token arrays already on the record fail a captured call's validation, or `None`.

    Such arrays are not what the policy sampled (a length mismatch, a null or negative id, a
    non-finite log prob, a missing array), so they never make the record a redundant capture.
    """
    response = result.get("response")
    if not isinstance(response, Mapping):
        return None
    try:
        check_response_token_arrays(response)
    except ValueError as exc:
        return f"the token arrays on the record are malformed ({exc})"
    return None


def _noting(error: str, malformed: str | None) -> str:
    return error if malformed is None else f"{error}; {malformed}"


def _replacing_malformed(result: dict, built: BuildResult, malformed: str) -> BuildResult:
    """A build that replaces malformed arrays: none of them stays beside the rebuilt output.

    A Chat response keeps its `choices` (the rebuilt `output` is read first), without their
    token arrays. A build with nothing to deliver names the malformed arrays in its error.
    """
    if built.rebuilt_response is None:
        return replace(built, error=_noting(built.error, malformed)) if built.error else built
    response = result.get("response")
    choices = response.get("choices") if isinstance(response, dict) else None
    for choice in choices if isinstance(choices, list) else []:
        message = choice.get("message") if isinstance(choice, dict) else None
        for field in TOKEN_FIELDS if isinstance(message, dict) else ():
            message.pop(field, None)
    return built


async def _redundant_capture(rollout_id: str | None, source: TokenSource) -> BuildResult | None:
    """Freeze the capture of a record that already carries tokens, so it can retire later."""
    if rollout_id is None:
        return None
    try:
        snapshot = await source.freeze(rollout_id)
        identity = SnapshotIdentity(snapshot.snapshot_id, snapshot.version)
    except Exception as exc:
        logger.warning(
            "rollout %s carries token ids; its capture could not be frozen: %s", rollout_id, exc
        )
        return None
    return BuildResult.redundant(identity)


def _apply(result: dict, built: BuildResult) -> None:
    """Write a build into the record: only `response.output`, the metrics and the mask."""
    rebuilt = built.rebuilt_response
    if built.training_traces is not None:
        result[ENVELOPE_KEY] = built.training_traces
    if rebuilt is not None:
        if isinstance(result.get("response"), dict):
            result["response"]["output"] = rebuilt["output"]
        else:
            result["response"] = rebuilt
    result[TOKEN_CAPTURE_KEY] = built.record_metrics()
    if built.mask_sample:
        result[MASK_SAMPLE_KEY] = True
