"""Tasks over a run's state at the destination: preflight, manifest, ledger."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from capture_core.operator.run_index import refresh_summary
from capture_core.run.capture_source import SourceSpec, check_destination, check_source
from capture_core.run.inbox import Claim
from capture_core.run.rollout_io import RolloutFilePlan
from capture_core.run.run_layout import MANIFEST, LedgerLine, RunLayout, RunManifest, run_location
from capture_core.run.store_check import check_store_for_run
from capture_core.storage import open_byte_store
from tokcap.tasks.common import ensure_claim, tokcap_task


@tokcap_task("check-locations", "check store {source.store} and destination {dest}")
def check_locations(
    source: SourceSpec, dest: str, storage_options: Mapping[str, Any] | None = None
) -> None:
    """Fail before any work when the capture store or the destination cannot be used."""
    check_source(source.store, source.storage_options, source.source_kwargs)
    check_destination(dest, storage_options)


@tokcap_task("check-store-captures", "check store {source.store} holds captures of {rollouts}")
def check_store_captures(
    rollouts: str,
    source: SourceSpec,
    dest: str,
    run_id: str,
    storage_options: Mapping[str, Any] | None = None,
) -> None:
    """Fail before anything is frozen, written or claimed when the store holds no capture of
    any input rollout (`capture_core.run.store_check`); a claimed run id was checked then."""
    check_store_for_run(rollouts, source.store, dest, run_id, storage_options)


@tokcap_task("claim-run-id", "claim run id {run_id} at {dest}")
def claim_run_id(
    dest: str,
    run_id: str,
    plan: RolloutFilePlan,
    settings: Mapping[str, Any],
    storage_options: Mapping[str, Any] | None = None,
    claim: Claim | None = None,
) -> bool:
    """Bind the run id to this input and these settings (`RunManifest`'s: store, builder,
    batch size, mask gate, rows, consumer, delivery); refuse a run id already used for
    another input or other settings."""
    ensure_claim(dest, claim, storage_options)
    recorded = {**recorded_input(plan), **settings}
    manifest = RunManifest(run_id=run_id, **recorded, started_at=time.time())
    return RunLayout(open_byte_store(dest, storage_options), run_id).claim(manifest)


def recorded_input(plan: RolloutFilePlan) -> dict[str, Any]:
    """What a manifest records of its input: where it is, its digests, its batches."""
    return {
        "rollouts": plan.url,
        "rollouts_sha256": plan.sha256,
        "rollouts_fingerprint": plan.fingerprint,
        "batches": len(plan.batches),
    }


@tokcap_task("load-manifest", "load manifest of run {run_id}")
def load_manifest(
    dest: str, run_id: str, storage_options: Mapping[str, Any] | None = None
) -> RunManifest:
    layout = RunLayout(open_byte_store(dest, storage_options), run_id)
    manifest = layout.read_manifest()
    if manifest is None:
        raise ValueError(
            f"unknown run id {run_id}: no {run_location(dest, run_id, MANIFEST)}; check --dest "
            "and --run-id"
        )
    return manifest


@tokcap_task("load-ledger", "load ledger of run {run_id}")
def load_ledger(
    dest: str, run_id: str, storage_options: Mapping[str, Any] | None = None
) -> list[LedgerLine]:
    return RunLayout(open_byte_store(dest, storage_options), run_id).read_ledger() or []


@tokcap_task("mark-retired", "mark retired rollouts in ledger of run {run_id}")
def mark_retired(
    dest: str, run_id: str, rollout_ids: list[str], storage_options: Mapping[str, Any] | None = None
) -> int:
    """Record retirements done outside `finalize_run` in the run's ledger and its summary."""
    layout = RunLayout(open_byte_store(dest, storage_options), run_id)
    marked = layout.mark_retired(rollout_ids)
    refresh_summary(layout)
    return marked
