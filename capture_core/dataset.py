"""Read a run's trainer rows as a verified, resumable dataset: `RowConsumer`.

Iterating a `RowConsumer(dest, run_id, name)` yields the run's rows parts (one per batch,
Parquet) in batch order, each as a `RowPart` with `.key` and `.table` (a `pyarrow.Table`),
after its bytes were checked against the size and sha256 its batch's receipt certifies. A
part whose bytes differ raises `PartMismatchError` naming the part and the run; it is never
yielded. `ack(key)` records durably and create-only that consumer `name` consumed that
part (`capture_core.run.row_cursor`). A new consumer of the same name yields only the parts it
has not acknowledged, so across crashes every part is acknowledged exactly once per name.
Acknowledge a part after the training step that used it is durable (its checkpoint): a
crash before the ack yields the part again to the restored trainer, never skips it.

Works on every destination the byte store opens (local paths, S3 URLs). Each pass over the
consumer lists the receipts present when it starts; iterate again for batches handed off
later. Plain readers (pyarrow.dataset, Hugging Face `datasets`) read the same files but
verify nothing: only this consumer checks the receipt.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from capture_core.errors import (
    AlreadyAcknowledgedError,
    PartMismatchError,
    RowsNotWrittenError,
    UnreadableAcknowledgementError,
)
from capture_core.run.receipt import HandoffReceipt
from capture_core.run.row_cursor import (
    Acknowledgement,
    Cursor,
    read_stored_receipt,
    receipt_key_of_part,
    receipt_keys,
    validate_consumer_name,
)
from capture_core.run.run_layout import RunLayout
from capture_core.run.trainer_rows import read_rows
from capture_core.run.verified_read import verified_bytes, verified_decode
from capture_core.storage import open_byte_store

__all__ = [
    "AlreadyAcknowledgedError",
    "PartMismatchError",
    "RowConsumer",
    "RowPart",
    "RowsNotWrittenError",
    "UnreadableAcknowledgementError",
]

NOT_YIELDED = "it is not yielded. Restore the part from a copy with that digest, then iterate again"


@dataclass(frozen=True)
class RowPart:
    """One verified rows part: its key (acknowledge it), its batch, and its rows."""

    key: str
    batch: int
    receipt_key: str
    table: pa.Table


class RowConsumer:
    """Consumer `name` of run `run_id`'s trainer rows at `dest` (a path or URL).

    A part is decoded on pyarrow's CPU thread pool (pyarrow's default) while its digest is
    computed on a thread of its own, and yielded only once the digest agrees; with
    `use_threads=False` it is verified first, then decoded on the iterating thread (a trainer
    already using every core, e.g. one data-loading process per core).
    """

    def __init__(
        self,
        dest: str,
        run_id: str,
        name: str,
        storage_options: Mapping[str, Any] | None = None,
        use_threads: bool = True,
    ) -> None:
        self.layout = RunLayout(open_byte_store(dest, storage_options), run_id)
        self.name = validate_consumer_name(name)
        self.cursor = Cursor(self.layout, self.name, token=uuid.uuid4().hex)
        self.use_threads = use_threads

    def __iter__(self) -> Iterator[RowPart]:
        """Every rows part not yet acknowledged by this name, verified, in batch order."""
        for key in receipt_keys(self.layout):
            receipt = read_stored_receipt(self.layout, key)
            if self._acknowledged(receipt):
                continue
            yield self._verified(receipt)

    def pending(self) -> list[str]:
        """Receipt names of the batches this consumer has not acknowledged."""
        keys = receipt_keys(self.layout)
        return [k for k in keys if not self._acknowledged(read_stored_receipt(self.layout, k))]

    def ack(self, key: str) -> Acknowledgement:
        """Record that this consumer consumed part `key` (a yielded `RowPart.key`).

        Durable and create-only: `AlreadyAcknowledgedError` when it was acknowledged before
        by another lifetime or process of this name (count it once).
        """
        receipt = read_stored_receipt(self.layout, receipt_key_of_part(self.layout, key))
        return self.cursor.ack(receipt)

    def _acknowledged(self, receipt: HandoffReceipt) -> bool:
        if receipt.rows is None:
            raise RowsNotWrittenError(
                f"batch {receipt.batch} of run {receipt.run_id} was handed off without trainer "
                f"rows ({self.layout.dest.url}/{receipt.part_key} only): the run was finalized "
                "without `--rows parquet`. Finalize the input under a new run id with rows"
            )
        return self.cursor.acknowledged(receipt) is not None

    def _verified(self, receipt: HandoffReceipt) -> RowPart:
        rows = receipt.rows
        assert rows is not None
        dest = self.layout.dest
        if self.use_threads:
            table = verified_decode(
                dest, receipt, rows.key, rows.bytes, rows.sha256, read_rows, NOT_YIELDED
            )
        else:
            data = verified_bytes(dest, receipt, rows.key, rows.bytes, rows.sha256, NOT_YIELDED)
            table = read_rows(data, use_threads=False)
        return RowPart(rows.key, receipt.batch, receipt.receipt_key, table)
