"""A run's manifest and ledger at the destination: `<dest>/<run_id>/run.json`, `ledger.jsonl`.

The manifest binds a run id to one input (by digest) and its settings, create-only, so a run
id cannot silently mix two inputs; retrigger and status read it back.
It never holds storage options or credentials. This module does not import Prefect.
"""

from __future__ import annotations

import orjson
from pydantic import BaseModel

from capture_core.handoff import LedgerLine
from capture_core.ids import validate_rollout_id
from capture_core.rollout_io import split_lines
from capture_core.storage import ByteStore


class RunManifest(BaseModel):
    """What a run finalizes and how."""

    run_id: str
    rollouts: str
    rollouts_sha256: str
    store: str
    builder: str
    batch_size: int
    batches: int
    max_mask_fraction: float | None = None
    mask_fraction_min_samples: int = 50


class RunIdInUseError(ValueError):
    """The run id already holds another input or other settings; nothing of this run ran."""


def validate_run_id(run_id: str) -> str:
    """Run ids follow the rollout-id rules: they are path segments under the destination."""
    try:
        return validate_rollout_id(run_id)
    except ValueError as exc:
        raise ValueError(str(exc).replace("rollout id", "run id")) from exc


def claim_run(dest: ByteStore, manifest: RunManifest) -> bool:
    """Record the manifest; `False` when this run id already holds the same input.

    Raises `RunIdInUseError` naming each changed setting when the run id was used for another
    input, batch size or builder.
    """
    key = f"{manifest.run_id}/run.json"
    data = orjson.dumps(manifest.model_dump(), option=orjson.OPT_SORT_KEYS)
    if dest.create(key, data):
        return True
    existing = read_manifest(dest, manifest.run_id)
    changed = _changed_settings(existing, manifest)
    if changed:
        raise RunIdInUseError(
            f"run id {manifest.run_id} at {dest.url} was used for other input or settings: "
            f"{'; '.join(changed)}. Rerun with the original input and settings, or pick a new "
            "run id"
        )
    return False


def _changed_settings(existing: RunManifest | None, new: RunManifest) -> list[str]:
    """What differs between a run's recorded manifest and a new claim, in words."""
    if existing is None:
        return ["the recorded run.json is unreadable"]
    changed = []
    if existing.rollouts_sha256 != new.rollouts_sha256:
        changed.append(
            f"input digest {existing.rollouts_sha256[:12]} ({existing.rollouts}) is now "
            f"{new.rollouts_sha256[:12]} ({new.rollouts})"
        )
    for name in ("batch_size", "builder"):
        old, now = getattr(existing, name), getattr(new, name)
        if old != now:
            changed.append(f"{name.replace('_', ' ')} {old} is now {now}")
    return changed


def read_manifest(dest: ByteStore, run_id: str) -> RunManifest | None:
    data = dest.get(f"{validate_run_id(run_id)}/run.json")
    return None if data is None else RunManifest.model_validate(orjson.loads(data))


def read_ledger(dest: ByteStore, run_id: str) -> list[LedgerLine] | None:
    data = dest.get(f"{validate_run_id(run_id)}/ledger.jsonl")
    if data is None:
        return None
    return [
        LedgerLine.model_validate(orjson.loads(line))
        for line in split_lines([data])
        if line.strip()
    ]
