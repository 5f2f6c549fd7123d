"""NeMo Gym's seed functions for delivery: finalize a finished rollout, retire after handoff.

`finalize_rollout_token_capture` is `run.finalize.finalize_rollout` returning NeMo Gym's dict.
It never retires; the caller retires only after durable handoff, by snapshot id and version.
Failed or masked builds keep their capture as evidence.
Training correlation preserves `/ng-rollout/<id>/training-token-capture`.
"""

from __future__ import annotations

import logging

from capture_core.builder.build_result import MASK_SAMPLE_KEY as MASK_SAMPLE_KEY
from capture_core.builder.build_result import REDUNDANT_CAPTURE_KEY, BuildResult
from capture_core.builder.build_result import TOKEN_CAPTURE_KEY as TOKEN_CAPTURE_KEY
from capture_core.builder.trace_envelope import MAIN_CHAIN
from capture_core.protocols import TokenSource
from capture_core.run.finalize import BuildOptions, finalize_rollout, mask_unusable

# A NeMo Gym seed name, so importable from here; it lives with the finalizer that uses it.
from capture_core.run.finalize import rollout_carries_token_ids as rollout_carries_token_ids

logger = logging.getLogger(__name__)

_REDUNDANT_CAPTURE_KEY = REDUNDANT_CAPTURE_KEY
"""The record key of a capture frozen for a record that already carried token ids."""


def _unusable(result: dict, error: str, message: str) -> dict:
    """Mask a rollout that needed token ids and could not get them.

    An unmasked rollout would appear healthy until it reaches the trainer.
    The record retains the reason for aggregate reporting; `message` is the one warning.
    """
    built = mask_unusable(result, error)
    logger.warning(message)
    return built.to_dict()


def capture_build_can_retire(built: dict | None) -> bool:
    """Whether a successful build consumed a frozen snapshot."""
    if not built:
        return False
    return BuildResult.from_dict(built).can_retire


async def finalize_rollout_token_capture(
    result: dict,
    source: TokenSource | None,
    *,
    builder: str = "prefix_merging",
    delivery: str = MAIN_CHAIN,
) -> dict | None:
    """Rebuild one finished rollout record's `response.output` from its recorded token ids.

    Call it after the harness and verifier finish the record; it mutates `result` in place,
    replacing only `response.output` and keeping the reward and every other field.
    It freezes through `source` and never retires. It never raises: missing or ambiguous
    tokens mask the rollout. Returns the build, or `None` when there is no source (or a
    record that already carries token ids cannot be frozen). `builder` is an extension;
    single-response delivery accepts only `prefix_merging`. `delivery="all_traces"` leaves
    `response` as it is and adds the checked `training_traces` envelope, built with `builder`
    (`prefix_merging` or `per_request`), also for a record that already carries token ids
    (docs/traces.md); a masked record never carries one. An envelope on the input never
    survives. What it replaces is kept under `_before_finalize`, so finalizing a finalized
    record again gives what finalizing the original gives (docs/contract.md). An unmasked
    delivery also carries `token_provenance`: which weights sampled each delivered token,
    beside the envelope, never inside it (docs/async.md).
    """
    built = await finalize_rollout(result, source, BuildOptions(builder, delivery))
    return None if built is None else built.to_dict()


def mask_reason(built: dict | BuildResult | None) -> str | None:
    """A short reason for a masked build, for ledgers and reports; `None` when not masked."""
    if not built:
        return None
    typed = built if isinstance(built, BuildResult) else BuildResult.from_dict(built)
    return typed.mask_reason()


async def retire_rollout_token_capture(
    rollout_id: str, source: TokenSource | None, built: dict | None
) -> bool:
    """Retire a frozen snapshot after durable handoff.

    The caller owns the durability boundary: call this only after downstream acceptance or a
    local fsync. Retirement uses the frozen `snapshot_id` and version; any failure is a
    warning and `False`. Failed or masked builds remain as diagnostic evidence.
    """
    typed = BuildResult.from_dict(built) if built else None
    if source is None or typed is None or not typed.can_retire or typed.snapshot is None:
        return False
    snapshot = typed.snapshot
    try:
        retired = await source.drop(
            rollout_id, snapshot_id=snapshot.snapshot_id, version=snapshot.version
        )
    except Exception as exc:
        logger.warning("rollout %s: retirement failed, capture kept: %s", rollout_id, exc)
        return False
    if not retired:
        logger.warning(
            "rollout %s: capture changed since it was frozen; kept as evidence", rollout_id
        )
    return bool(retired)
