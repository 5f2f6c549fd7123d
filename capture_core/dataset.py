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

Staleness masking: given `current_weight_version` V and `max_weight_lag` K, each yielded
table gains `trainable_mask` (`loss_mask` and `weight_version >= V - K`, per position) and
the part reports `stale_tokens`; nothing is dropped or rewritten, and the cursor and acks are
unchanged. `staleness_mask` is the same rule for a trainer reading parts itself
(docs/async.md).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from capture_core.errors import (
    AlreadyAcknowledgedError,
    InvalidInputError,
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
    "stale_token_count",
    "staleness_mask",
]

NOT_YIELDED = "it is not yielded. Restore the part from a copy with that digest, then iterate again"


@dataclass(frozen=True)
class RowPart:
    """One verified rows part: its key (acknowledge it), its batch, and its rows."""

    key: str
    batch: int
    receipt_key: str
    table: pa.Table
    stale_tokens: int | None = None
    """Loss-mask tokens `trainable_mask` masks for staleness (unknown versions included);
    `None` when the consumer does not mask for staleness."""


class RowConsumer:
    """Consumer `name` of run `run_id`'s trainer rows at `dest` (a path or URL).

    A part is decoded on pyarrow's CPU thread pool (pyarrow's default) while its digest is
    computed on a thread of its own, and yielded only once the digest agrees; with
    `use_threads=False` it is verified first, then decoded on the iterating thread (a trainer
    already using every core, e.g. one data-loading process per core). With
    `current_weight_version` and `max_weight_lag` (both or neither) each table gains
    `trainable_mask` and the part reports `stale_tokens` (`staleness_mask`). The trainer's
    version moves while it trains: set `current_weight_version` after each weight update,
    and every part yielded after that is masked against the new version.
    """

    def __init__(
        self,
        dest: str,
        run_id: str,
        name: str,
        storage_options: Mapping[str, Any] | None = None,
        use_threads: bool = True,
        current_weight_version: int | None = None,
        max_weight_lag: int | None = None,
    ) -> None:
        self.staleness = _staleness_setting(current_weight_version, max_weight_lag)
        self.layout = RunLayout(open_byte_store(dest, storage_options), run_id)
        self.name = validate_consumer_name(name)
        self.cursor = Cursor(self.layout, self.name, token=uuid.uuid4().hex)
        self.use_threads = use_threads

    @property
    def current_weight_version(self) -> int | None:
        """The trainer's version the next part is masked against (`None`: no masking)."""
        return None if self.staleness is None else self.staleness[0]

    @current_weight_version.setter
    def current_weight_version(self, version: int) -> None:
        if self.staleness is None:
            raise InvalidInputError(
                "this consumer does not mask for staleness; build it with "
                "current_weight_version and max_weight_lag to set the trainer's version"
            )
        self.staleness = _staleness_setting(version, self.staleness[1])

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
        if self.staleness is None:
            return RowPart(rows.key, receipt.batch, receipt.receipt_key, table)
        current, lag = self.staleness
        table = staleness_mask(table, current, lag, part=rows.key)
        stale = stale_token_count(table)
        return RowPart(rows.key, receipt.batch, receipt.receipt_key, table, stale)


TRAINABLE_MASK = "trainable_mask"
_MASK_TYPE = pa.list_(pa.field("element", pa.int8(), nullable=False))


def _staleness_setting(current: int | None, lag: int | None) -> tuple[int, int] | None:
    """Both staleness parameters, checked, or `None` when neither is given."""
    if current is None and lag is None:
        return None
    if current is None or lag is None:
        given, missing = (
            ("max_weight_lag", "current_weight_version")
            if current is None
            else ("current_weight_version", "max_weight_lag")
        )
        raise InvalidInputError(
            f"{given} was given without {missing}: staleness masking needs both the "
            "trainer's current weight version and the largest lag it trains on; give both "
            "or neither"
        )
    for name, value in (("current_weight_version", current), ("max_weight_lag", lag)):
        if type(value) is not int or value < 0:
            raise InvalidInputError(
                f"{name} is {value!r}; it must be an integer 0 or more (a trainer version, "
                "or a number of versions)"
            )
    return current, lag


def staleness_mask(
    table: pa.Table, current_weight_version: int, max_weight_lag: int, part: str = "table"
) -> pa.Table:
    """`table` with `trainable_mask` (list<int8>) added: per position, `loss_mask` and
    `weight_version >= current_weight_version - max_weight_lag`.

    An unknown version (-1, `NO_WEIGHT_VERSION`) is always masked: a token of unknown age is
    not known to be fresh. Nothing else changes. Vectorized over the flattened lists, one record
    batch at a time. A table without `weight_version` (rows written before tokcap recorded
    versions) is refused by name: its tokens' age cannot be known.
    """
    _staleness_setting(current_weight_version, max_weight_lag)
    missing = [c for c in ("loss_mask", "weight_version") if c not in table.column_names]
    if missing:
        raise InvalidInputError(
            f"{part} has no {' or '.join(missing)} column, so its tokens' weight versions are "
            "unknown (rows written before tokcap recorded them); read it without "
            "current_weight_version and max_weight_lag"
        )
    # Versions are 0 or more, so the floor at 0 changes nothing for a known one and keeps
    # an unknown one (-1) masked even when the lag reaches back before version 0.
    oldest = max(current_weight_version - max_weight_lag, 0)
    chunks = [_trainable(batch, oldest, part) for batch in table.to_batches()]
    column = pa.chunked_array(chunks, _MASK_TYPE)
    field = pa.field(TRAINABLE_MASK, _MASK_TYPE, nullable=False)
    if TRAINABLE_MASK in table.column_names:
        table = table.drop_columns([TRAINABLE_MASK])
    return table.append_column(field, column)


def _trainable(batch: pa.RecordBatch, oldest: int, part: str) -> pa.Array:
    """One record batch's `trainable_mask`, on `loss_mask`'s list offsets."""
    loss, versions = batch.column("loss_mask"), batch.column("weight_version")
    offsets = _offsets(loss)
    if not np.array_equal(offsets, _offsets(versions)):
        raise InvalidInputError(
            f"{part}: a row's weight_version and loss_mask have different lengths; the part "
            "was not written by tokcap, so its positions cannot be matched"
        )
    trainable = (loss.flatten().to_numpy(zero_copy_only=False) != 0) & (
        versions.flatten().to_numpy(zero_copy_only=False) >= oldest
    )
    values = pa.array(trainable.astype(np.int8), pa.int8())
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values, _MASK_TYPE)


def _offsets(lists: pa.ListArray) -> np.ndarray:
    """A list array's offsets from 0 (a sliced array's start at its first list)."""
    offsets = lists.offsets.to_numpy()
    return (offsets - offsets[0]).astype(np.int32)


def stale_token_count(table: pa.Table) -> int:
    """Loss-mask tokens of a `staleness_mask`ed table that `trainable_mask` masks."""
    loss = table.column("loss_mask").combine_chunks().flatten().to_numpy(zero_copy_only=False)
    mask = table.column(TRAINABLE_MASK).combine_chunks().flatten()
    return int(np.count_nonzero(loss) - np.count_nonzero(mask.to_numpy(zero_copy_only=False)))
