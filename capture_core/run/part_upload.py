"""Durable handoff of a finalized batch: its parts written create-only, read back, receipted.

A part is written create-only and verified by reading it back; an identical existing part
(a re-run, or a write whose reply was lost) is accepted, a different one is refused and
left untouched. `handoff_batch` uploads a batch's records part and rows part and only then
returns the `HandoffReceipt` that names them. This module does not import Prefect.
"""

from __future__ import annotations

import hashlib
import time
from concurrent import futures

from capture_core.errors import HandoffConflictError, TransientStoreError
from capture_core.run.batch_finalize import FinalizedBatch
from capture_core.run.crash_points import crash_point
from capture_core.run.receipt import HandoffReceipt, RowsPart
from capture_core.storage import ByteStore
from capture_core.storage.io_pool import io_pool


def upload_part(dest: ByteStore, key: str, data: bytes) -> tuple[str, int]:
    """Write a part create-only and verify it; return its sha256 and size.

    An identical existing part (a re-run, or a write whose reply was lost) is accepted.
    A different one raises `HandoffConflictError` and is left untouched.
    """
    digest = hashlib.sha256(data).hexdigest()
    if not data:
        return digest, 0
    crash_point("mid-upload")
    dest.create(key, data)
    stored = dest.get(key)
    if stored is None:
        raise TransientStoreError(f"part {dest.url}/{key} is not readable right after writing it")
    if len(stored) != len(data) or hashlib.sha256(stored).hexdigest() != digest:
        raise HandoffConflictError(
            f"destination part {dest.url}/{key} already exists with other content "
            f"({len(stored)} bytes, not {len(data)}); it is never overwritten. Keep it: it may "
            "hold records already handed off whose captures are retired, and this run would "
            "deliver them masked. Check that the run's receipts are intact; to finalize this "
            "input afresh, use a new run id"
        )
    return digest, len(data)


def handoff_batch(run_id: str, finalized: FinalizedBatch, dest: ByteStore) -> HandoffReceipt:
    """Durably hand a finalized batch off (records part and rows part) and return its receipt.

    The rows part is uploaded on the I/O pool while the records part is uploaded here; both
    are waited for, and either one's error raised, before anything is returned.
    """
    key, data = finalized.rows_key, finalized.rows
    rows_upload = (
        None if key is None or data is None else io_pool().submit(upload_part, dest, key, data)
    )
    try:
        digest, size = upload_part(dest, finalized.part_key, finalized.part)
    finally:
        if rows_upload is not None:
            futures.wait([rows_upload])
    rows = None
    if rows_upload is not None and key is not None and data is not None:
        from capture_core.rows.trainer_rows import count_rows

        rows_digest, rows_size = rows_upload.result()
        rows = RowsPart(key=key, sha256=rows_digest, bytes=rows_size, rows=count_rows(data))
    return HandoffReceipt(
        run_id=run_id,
        batch=finalized.index,
        receipt_key=finalized.receipt_key,
        part_key=finalized.part_key,
        sha256=digest,
        bytes=size,
        records=sum(1 for o in finalized.outcomes if o.emitted),
        rollouts=finalized.outcomes,
        rows=rows,
        handed_off_at=time.time(),
    )
