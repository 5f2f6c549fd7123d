"""Tasks over a run's state at the destination: preflight, manifest, ledger."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from capture_core.handoff import LedgerLine, encode_ledger, is_class_spec, open_source
from capture_core.nemo_gym_store import NemoGymFileStore
from capture_core.rollout_io import RolloutFilePlan
from capture_core.run_manifest import RunManifest, claim_run, read_ledger, read_manifest
from capture_core.storage import open_byte_store
from capture_core.store import TokenCaptureStore
from tasks.common import TRANSIENT_RETRIES


@task(name="check-locations", cache_policy=NO_CACHE, **TRANSIENT_RETRIES)
def check_locations(
    store: str,
    dest: str,
    storage_options: Mapping[str, Any] | None = None,
    source_kwargs: Mapping[str, Any] | None = None,
) -> None:
    """Fail before any work when the capture store or the destination cannot be used."""
    source = open_source(store, storage_options, source_kwargs)
    if isinstance(source, TokenCaptureStore):
        source.byte_store.probe(must_exist=True)
    elif isinstance(source, NemoGymFileStore):
        source.probe()
    elif not is_class_spec(store):
        raise ValueError(f"store {store!r} is neither a location nor a source class")
    open_byte_store(dest, storage_options).probe(must_exist=False)


@task(name="claim-run-id", cache_policy=NO_CACHE, **TRANSIENT_RETRIES)
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
) -> bool:
    """Bind the run id to this input; refuse a run id already used for another input."""
    manifest = RunManifest(
        run_id=run_id,
        rollouts=plan.url,
        rollouts_sha256=plan.sha256,
        store=store,
        builder=builder,
        batch_size=batch_size,
        batches=len(plan.batches),
        max_mask_fraction=max_mask_fraction,
        mask_fraction_min_samples=mask_fraction_min_samples,
    )
    return claim_run(open_byte_store(dest, storage_options), manifest)


@task(name="load-manifest", cache_policy=NO_CACHE, **TRANSIENT_RETRIES)
def load_manifest(
    dest: str, run_id: str, storage_options: Mapping[str, Any] | None = None
) -> RunManifest:
    manifest = read_manifest(open_byte_store(dest, storage_options), run_id)
    if manifest is None:
        raise ValueError(
            f"unknown run id {run_id}: no {dest}/{run_id}/run.json; check --dest and --run-id"
        )
    return manifest


@task(name="load-ledger", cache_policy=NO_CACHE, **TRANSIENT_RETRIES)
def load_ledger(
    dest: str, run_id: str, storage_options: Mapping[str, Any] | None = None
) -> list[LedgerLine]:
    return read_ledger(open_byte_store(dest, storage_options), run_id) or []


@task(name="mark-retired", cache_policy=NO_CACHE, **TRANSIENT_RETRIES)
def mark_retired(
    dest: str, run_id: str, rollout_ids: list[str], storage_options: Mapping[str, Any] | None = None
) -> int:
    """Record retirements done outside `finalize_run` in the run's ledger."""
    byte_store = open_byte_store(dest, storage_options)
    ledger = read_ledger(byte_store, run_id)
    if ledger is None:
        return 0
    retired = set(rollout_ids)
    for line in ledger:
        if line.rollout_id in retired:
            line.retired = True
            if line.error and "kept" not in line.error:
                line.error = None
    byte_store.replace(f"{run_id}/ledger.jsonl", encode_ledger(ledger))
    return len(retired)
