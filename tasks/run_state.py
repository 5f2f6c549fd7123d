"""Tasks over a run's state at the destination: preflight, manifest, ledger."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from capture_core.builder.trace_envelope import MAIN_CHAIN
from capture_core.run.capture_source import SourceSpec, check_destination, check_source
from capture_core.run.inbox import Claim
from capture_core.run.rollout_io import RolloutFilePlan
from capture_core.run.run_index import refresh_summary
from capture_core.run.run_layout import MANIFEST, LedgerLine, RunLayout, RunManifest, run_location
from capture_core.storage import open_byte_store
from tokcap.tasks.common import ensure_claim, tokcap_task


@tokcap_task("check-locations", "check store {source.store} and destination {dest}")
def check_locations(
    source: SourceSpec, dest: str, storage_options: Mapping[str, Any] | None = None
) -> None:
    """Fail before any work when the capture store or the destination cannot be used."""
    check_source(source.store, source.storage_options, source.source_kwargs)
    check_destination(dest, storage_options)


@tokcap_task("claim-run-id", "claim run id {run_id} at {dest}")
def claim_run_id(
    dest: str,
    run_id: str,
    plan: RolloutFilePlan,
    store: str,
    builder: str,
    batch_size: int,
    max_mask_fraction: float | None,
    mask_fraction_min_samples: int,
    storage_options: Mapping[str, Any] | None = None,
    claim: Claim | None = None,
    rows: str = "none",
    retire_after_consumer: str | None = None,
    delivery: str = MAIN_CHAIN,
) -> bool:
    """Bind the run id to this input; refuse a run id already used for another input."""
    ensure_claim(dest, claim, storage_options)
    manifest = RunManifest(
        run_id=run_id,
        rollouts=plan.url,
        rollouts_sha256=plan.sha256,
        rollouts_fingerprint=plan.fingerprint,
        store=store,
        builder=builder,
        batch_size=batch_size,
        batches=len(plan.batches),
        max_mask_fraction=max_mask_fraction,
        mask_fraction_min_samples=mask_fraction_min_samples,
        rows=rows,
        retire_after_consumer=retire_after_consumer,
        delivery=delivery,
        started_at=time.time(),
    )
    return RunLayout(open_byte_store(dest, storage_options), run_id).claim(manifest)


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
