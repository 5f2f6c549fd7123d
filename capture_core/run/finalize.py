"""Finalize one finished rollout record from its capture: the one finalize path.

The finalizer freezes the rollout's captured calls and rebuilds `response.output` from them.
It never retires; the caller retires only after durable handoff, by snapshot id and version.
Existing token ids are the policy's sampled data: such a rollout is left unchanged, when
they pass a captured call's validation; malformed ones (or two token sets) mask the rollout
under either delivery, and its capture is kept as evidence like every masked build's.
The record's terminal fields and scored `response` attribute the call that earned the reward.
Fields it replaces are kept as the harness wrote them, so finalizing a finalized record again
gives what finalizing the original gives; an incoming `training_traces` never survives, and
a record finalize writes carries its own `token_provenance` (on an unmasked delivery) or none.
`delivery.finalize_rollout_token_capture` (NeMo Gym's name) returns this build as a dict.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from capture_core.builder.build_result import (
    MASK_SAMPLE_KEY,
    TOKEN_CAPTURE_KEY,
    BuildResult,
    SnapshotIdentity,
)
from capture_core.builder.snapshot import build_from_snapshot, warn_masked
from capture_core.builder.terminal import BEFORE_FINALIZE_KEY, TerminalInputs
from capture_core.builder.token_provenance import TOKEN_PROVENANCE_KEY
from capture_core.builder.trace_envelope import DELIVERIES, ENVELOPE_KEY, MAIN_CHAIN
from capture_core.errors import InvalidRecordError, error_text
from capture_core.ids import maybe_rollout_id_from_run_body
from capture_core.protocols import TokenSource
from capture_core.records import check_response_token_arrays
from capture_core.records.served import token_carriers
from capture_core.records.token_values import TOKEN_FIELDS

logger = logging.getLogger(__name__)

NO_CAPTURE_KEY = "no capture key"
"""The error of a record that names no rollout (NeMo Gym's words): its capture has no key."""
KEPT_FIELDS = ("response", MASK_SAMPLE_KEY, TOKEN_CAPTURE_KEY)
"""The record fields finalize replaces and keeps under `_before_finalize`."""
LOST_TRANSCRIPT = (
    "an earlier finalize rebuilt this record's response.output without keeping the one the "
    f"harness wrote ({BEFORE_FINALIZE_KEY}), so the scored transcript is lost; finalize the "
    "harness's original record instead"
)


def mask_unusable(result: dict, error: str) -> BuildResult:
    """Mask a rollout that needed token ids and could not get them; the record keeps why.

    An unmasked rollout would appear healthy until it reaches the trainer.
    """
    built = BuildResult.unusable(error)
    result.pop(TOKEN_PROVENANCE_KEY, None)
    kept: dict[str, Any] = {}
    _mask(result, kept)
    _replace(result, kept, TOKEN_CAPTURE_KEY, built.record_metrics())
    _keep(result, kept)
    return built


def _replace(result: dict, kept: dict[str, Any], key: str, value: Any) -> None:
    """Set `result[key]`, keeping the value it replaces in `kept` (`None`: there was none).

    No entry is kept for metrics the record did not have: restoring removes finalize's own.
    """
    if key not in kept and (key in result or key != TOKEN_CAPTURE_KEY):
        kept[key] = result.get(key)
    result[key] = value


def _mask(result: dict, kept: dict[str, Any]) -> None:
    """Mask the record; a mask the harness set is its own, so only an unmasked value is kept."""
    if result.get(MASK_SAMPLE_KEY):
        result[MASK_SAMPLE_KEY] = True
    else:
        _replace(result, kept, MASK_SAMPLE_KEY, True)


def _keep(result: dict, kept: dict[str, Any]) -> None:
    if kept:
        result[BEFORE_FINALIZE_KEY] = kept


def recover_harness_record(result: dict) -> str | None:
    """Return `result` to what the harness wrote; why its scored transcript is lost, or `None`.

    No envelope survives: finalize builds its own or none. An earlier finalize's metrics
    go, and the fields it replaced come back from `_before_finalize` (`null`: the harness
    wrote none), so finalizing a finalized record gives what finalizing the original gives.
    `token_provenance` stays until a build replaces it (`_apply`, `mask_unusable`); a record
    that arrived with its own token ids loses it (no capture vouches for its versions: its
    rows say unknown). A record whose output an earlier finalize
    rebuilt without keeping the harness's (NeMo Gym's, say: its metrics count `chains`) has
    lost its scored transcript: no build may read it there.
    A `_before_finalize` that finalize could not have written raises `InvalidRecordError`:
    the record was edited, so the finalizer masks it and keeps its capture.
    """
    result.pop(ENVELOPE_KEY, None)
    if BEFORE_FINALIZE_KEY in result:
        kept = result.pop(BEFORE_FINALIZE_KEY)
        if not isinstance(kept, Mapping) or not kept or not set(kept) <= set(KEPT_FIELDS):
            raise InvalidRecordError(
                f"{BEFORE_FINALIZE_KEY} is not what finalize writes (an object of some of "
                f"{', '.join(KEPT_FIELDS)}): the record was edited; {LOST_TRANSCRIPT}"
            )
        result.pop(TOKEN_CAPTURE_KEY, None)
        for key in KEPT_FIELDS:
            if key in kept and kept[key] is None:
                result.pop(key, None)
            elif key in kept:
                result[key] = kept[key]
    metrics = result.get(TOKEN_CAPTURE_KEY)
    if isinstance(metrics, Mapping) and "chains" in metrics:
        return LOST_TRANSCRIPT
    result.pop(TOKEN_CAPTURE_KEY, None)
    return None


def _carries_generated_ids(item: Any) -> bool:
    """A non-empty array of ids (a list, tuple or array); empty or absent carries nothing."""
    ids = item.get("generation_token_ids") if isinstance(item, Mapping) else None
    if ids is None or isinstance(ids, str | bytes) or not hasattr(ids, "__len__"):
        return False
    return len(ids) > 0


def rollout_carries_token_ids(result: dict) -> bool:
    """Whether this rollout already holds what training needs.

    True when any carrier (`records.served.token_carriers`: a Responses output item or a
    Chat `choices[].message`, also beside an `output` list) has a non-empty
    `generation_token_ids`: what the policy sampled takes precedence over a reconstruction,
    and partial coverage stays visible. An empty list carries nothing, so such a record is
    finalized from its capture like any other. Both deliveries and the retire verdict ask
    this one question.
    """
    response = result.get("response")
    if not isinstance(response, Mapping):
        return False
    return any(_carries_generated_ids(item) for _, item in token_carriers(response))


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

    It mutates `result`, replacing only `response.output` and adding the metrics and mask;
    what it replaced is kept under `_before_finalize`. It freezes and never retires. It never
    raises: missing or ambiguous tokens mask the rollout. `None` when there is no source (or a
    record that already carries token ids cannot be frozen). With the `all_traces` delivery it
    keeps `response` and adds the checked `training_traces` envelope instead
    (docs/traces.md). An envelope on the input never survives, and a masked record (also one
    that arrived masked) carries none and never retires. A record an earlier finalize wrote is
    finalized as the harness's original (`recover_harness_record`).
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
    try:
        lost = recover_harness_record(result)
        malformed = malformed_token_arrays(result)
        if malformed is not None:
            return mask_unusable(result, malformed)
        if delivery == MAIN_CHAIN:
            return await _finalize(result, source, builder, lost)
        return await _finalize_traces(result, source, builder, delivery, lost)
    except Exception as exc:
        return mask_unusable(result, error_text(exc))


def plain_rollout_id(result: dict) -> str | None:
    """The record's rollout id, or `None` when it has none or a malformed one."""
    try:
        return maybe_rollout_id_from_run_body(result)
    except ValueError:
        return None


async def _finalize_traces(
    result: dict, source: TokenSource, builder: str, delivery: str, lost: str | None
) -> BuildResult:
    """The `all_traces` finalize: the checked envelope from the capture, or a mask and none.

    A record that already carries token ids gets its envelope from the capture too: those
    ids cover one chain at most. A record whose scored transcript is `lost` masks.
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
    if lost is not None:
        return mask_unusable(result, lost)
    try:
        snapshot = await source.freeze(rollout_id)
    except Exception as exc:
        return mask_unusable(result, f"{type(exc).__name__}: {exc}")
    terminal = TerminalInputs.from_record(result)
    built = build_from_snapshot(snapshot, builder, "", terminal, delivery)
    return _apply(result, built)


async def _finalize(
    result: dict, source: TokenSource, builder: str, lost: str | None
) -> BuildResult | None:
    """The `main_chain` finalize: a redundant capture, the rebuilt output, or a mask.

    A record whose scored transcript is `lost` masks unless it carries token ids (the
    caller masked malformed ones already).
    """
    try:
        rollout_id = maybe_rollout_id_from_run_body(result)
    except ValueError as exc:
        return mask_unusable(result, f"malformed rollout id: {exc}")
    if rollout_carries_token_ids(result):
        result.pop(TOKEN_PROVENANCE_KEY, None)  # versions no capture can vouch for
        return await _redundant_capture(result, rollout_id, source)
    if rollout_id is None:
        return mask_unusable(result, NO_CAPTURE_KEY)
    if lost is not None:
        return mask_unusable(result, lost)
    try:
        snapshot = await source.freeze(rollout_id)
    except Exception as exc:
        return mask_unusable(result, error_text(exc))
    response = result.get("response")
    model = str(response.get("model") or "") if isinstance(response, dict) else ""
    built = build_from_snapshot(snapshot, builder, model, TerminalInputs.from_record(result))
    return _apply(result, built)


MALFORMED_ARRAYS = "the token arrays on the record are malformed"
"""How the reason of a record masked for the token arrays it carries begins."""


def malformed_token_arrays(result: dict) -> str | None:
    """Why the token arrays already on the record cannot go out, or `None`.

    Every carrier (`token_carriers`: Responses output items and Chat messages) that holds
    any array must pass a captured call's validation: arrays that fail it (a length
    mismatch, a null or negative id such as a -100 pad, a non-finite log prob, a missing
    array) are not what the policy sampled. Generated ids on both kinds of carrier are two
    token sets, and which one was sampled cannot be told. Either way the finalizer masks the
    rollout with this reason, under both deliveries, and keeps its capture as evidence:
    the arrays are never delivered beside a rebuild or an envelope whose capture retires.
    """
    response = result.get("response")
    if not isinstance(response, Mapping):
        return None
    try:
        check_response_token_arrays(response)
    except ValueError as exc:
        return f"{MALFORMED_ARRAYS} ({exc}); fix how the harness writes them, or leave them off"
    kinds = {
        where.split("[")[0]
        for where, item in token_carriers(response)
        if _carries_generated_ids(item)
    }
    if len(kinds) > 1:
        return (
            f"{MALFORMED_ARRAYS} (two token sets: generated ids on response.output items and "
            "on response.choices messages, so which one the policy sampled is unknown); "
            "keep them on one of the two"
        )
    return None


def _with_rebuilt_output(response: Any, rebuilt: dict) -> dict:
    """The record's new response: the harness's with the rebuilt `output`, as a new object,
    so the harness's is kept as it was; the rebuilt one when the record has none.

    A Chat response keeps its `choices` without token arrays (any it had carried nothing:
    empty or null), so the rebuilt `output` is the record's one token set.
    """
    if not isinstance(response, dict):
        return rebuilt
    new = {**response, "output": rebuilt["output"]}
    choices = response.get("choices")
    if isinstance(choices, list):
        new["choices"] = [_without_token_arrays(choice) for choice in choices]
    return new


def _without_token_arrays(choice: Any) -> Any:
    message = choice.get("message") if isinstance(choice, dict) else None
    if not isinstance(message, dict):
        return choice
    return {**choice, "message": {k: v for k, v in message.items() if k not in TOKEN_FIELDS}}


async def _redundant_capture(
    result: dict, rollout_id: str | None, source: TokenSource
) -> BuildResult | None:
    """Freeze the capture of a record that already carries tokens, so it can retire later;
    the record is left unchanged. One that arrived masked stays masked and never retires."""
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
    built = BuildResult.redundant(identity)
    return built.of_masked_record() if result.get(MASK_SAMPLE_KEY) else built


def _apply(result: dict, built: BuildResult) -> BuildResult:
    """Write a build into the record and return it as written: the envelope (all_traces) or
    `response.output`, the metrics and the mask; an unmasked delivery's `token_provenance`.

    Each field replaced is kept as it was under `_before_finalize`. A record that arrived
    masked stays masked, so its build is masked too and carries no envelope.
    """
    if result.get(MASK_SAMPLE_KEY):
        built = built.of_masked_record()
    kept: dict[str, Any] = {}
    if built.training_traces is not None:
        result[ENVELOPE_KEY] = built.training_traces
    if built.token_provenance is not None:
        result[TOKEN_PROVENANCE_KEY] = built.token_provenance
    else:
        result.pop(TOKEN_PROVENANCE_KEY, None)
    if built.rebuilt_response is not None:
        response = _with_rebuilt_output(result.get("response"), built.rebuilt_response)
        _replace(result, kept, "response", response)
    _replace(result, kept, TOKEN_CAPTURE_KEY, built.record_metrics())
    if built.mask_sample:
        _mask(result, kept)
    _keep(result, kept)
    return built
