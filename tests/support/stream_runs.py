"""Runs landing at a destination while a `RowStream` reads: each a claimed manifest, then
its batches finalized with trainer rows and handed off with receipts, as a run writes them.

No Prefect flow runs: the receipt is persisted as the upload task persists it (Prefect's
result record of the `HandoffReceipt`), so consumers read it exactly as they read a run's.
"""

from __future__ import annotations

import asyncio
import hashlib
import time

from prefect.results import ResultRecord, ResultRecordMetadata
from prefect.serializers import JSONSerializer

from capture_core.run.batch_finalize import finalize_batch
from capture_core.run.part_upload import handoff_batch
from capture_core.run.rollout_io import plan_rollout_file, read_batch
from capture_core.run.run_layout import RunLayout, RunManifest
from capture_core.storage import open_byte_store
from capture_core.store import TokenCaptureStore
from tests.support.pipeline_helpers import make_batch, write_rollouts


def land_run(
    locations: dict,
    run_id: str,
    task: int,
    rollouts: int = 4,
    batch_size: int = 2,
    started_at: float | None = None,
    rows: str = "parquet",
) -> list[str]:
    """Capture `rollouts` rollouts of task `task`, claim run `run_id` and hand off its
    batches with rows; return its rows part keys in batch order. `started_at`: the claim
    time its manifest records (now by default; earlier for a run claimed long ago). `rows`:
    the rows format (`parquet` or `arrow`)."""
    options = locations["options"]
    records = make_batch(TokenCaptureStore(locations["store"], options), rollouts, task=task)
    url = locations["rollouts"].replace("rollouts.jsonl", f"{run_id}.jsonl")
    write_rollouts(url, records, options)
    plan = plan_rollout_file(url, batch_size, options)
    dest = open_byte_store(locations["dest"], options)
    layout = RunLayout(dest, run_id)
    digest = hashlib.sha256(b"".join(b"%d" % n for n in range(task))).hexdigest()
    layout.claim(
        RunManifest(
            run_id=run_id,
            rollouts=url,
            rollouts_sha256=digest,
            store=locations["store"],
            builder="prefix_merging",
            batch_size=batch_size,
            batches=len(plan.batches),
            rows=rows,
            started_at=time.time() if started_at is None else started_at,
        )
    )
    keys = []
    source = TokenCaptureStore(locations["store"], options)
    for batch in plan.batches:
        lines = read_batch(url, batch, options)
        finalized = asyncio.run(finalize_batch(run_id, batch, lines, source, rows=rows))
        receipt = handoff_batch(run_id, finalized, dest)
        metadata = ResultRecordMetadata(
            serializer=JSONSerializer(), storage_key=layout.receipt_key(receipt.receipt_key)
        )
        record = ResultRecord(result=receipt, metadata=metadata)
        dest.create(layout.receipt_key(receipt.receipt_key), record.serialize())
        assert receipt.rows is not None
        keys.append(receipt.rows.key)
    return keys
