"""Read a run's trainer rows as a verified, resumable dataset: `RowConsumer`.

Iterating a `RowConsumer(dest, run_id, name)` yields the run's rows parts (one per batch,
Parquet or Arrow) in batch order, each as a `RowPart` with `.key` and `.table` (a `pyarrow.Table`),
after its bytes were checked against the size and sha256 its batch's receipt certifies. A
part whose bytes differ raises `PartMismatchError` naming the part and the run; it is never
yielded. `ack(key)` records durably and create-only that consumer `name` consumed that
part (`capture_core.rows.row_cursor`). A new consumer of the same name yields only the parts it
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
unchanged. A token of unknown version (a capture without versions) is neither fresh nor
stale: `unknown_version="keep"` trains it, `"mask"` masks it, and without the choice a part
holding one is refused, never masked silently; the part counts them as
`unknown_version_tokens`, and a part whose trainable tokens are all of unknown version is
reported once in the log and on the part (`all_versions_unknown`). `staleness_mask` is the
same rule for a trainer reading parts itself (docs/async.md).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pyarrow as pa

from capture_core.errors import (
    AlreadyAcknowledgedError,
    InvalidInputError,
    PartMismatchError,
    RowsNotWrittenError,
    UnreadableAcknowledgementError,
)
from capture_core.rows.row_cursor import (
    Acknowledgement,
    Cursor,
    read_stored_receipt,
    receipt_key_of_part,
    receipt_keys,
    validate_consumer_name,
)
from capture_core.rows.trainer_rows import read_rows
from capture_core.run.receipt import HandoffReceipt
from capture_core.run.run_layout import RunLayout, row_format
from capture_core.run.verified_read import verified_bytes, verified_decode
from capture_core.storage import open_byte_store

__all__ = [
    "UNKNOWN_VERSION_POLICIES",
    "AlreadyAcknowledgedError",
    "PartMismatchError",
    "RowConsumer",
    "RowPart",
    "RowsNotWrittenError",
    "UnreadableAcknowledgementError",
    "stale_token_count",
    "staleness_mask",
    "unknown_version_count",
]

logger = logging.getLogger("capture_core.dataset")  # the public face: its name stays

NOT_YIELDED = "it is not yielded. Restore the part from a copy with that digest, then iterate again"


@dataclass(frozen=True)
class RowPart:
    """One verified rows part: its key (acknowledge it), its batch, and its rows."""

    key: str
    batch: int
    receipt_key: str
    table: pa.Table
    stale_tokens: int | None = None
    """Loss-mask tokens of a known version older than the bound, which `trainable_mask`
    masks; `None` when the consumer does not mask for staleness."""
    unknown_version_tokens: int | None = None
    """Loss-mask tokens of unknown version (never counted as stale), kept or masked as the
    consumer's `unknown_version` says; `None` when it does not mask for staleness."""
    all_versions_unknown: bool | None = None
    """The part has loss-mask tokens and none of a known version (its captures carried no
    versions, so staleness judged nothing); `None` when the consumer does not mask."""
    run_id: str | None = None
    """The part's run, as a `RowStream` yields it (its key begins with it too)."""


class RowConsumer:
    """Consumer `name` of run `run_id`'s trainer rows at `dest` (a path or URL).

    A part is decoded on pyarrow's CPU thread pool (pyarrow's default) while its digest is
    computed on a thread of its own, and yielded only once the digest agrees; with
    `use_threads=False` it is verified first, then decoded on the iterating thread (a trainer
    already using every core, e.g. one data-loading process per core). With
    `current_weight_version` and `max_weight_lag` (both or neither) each table gains
    `trainable_mask` and the part reports `stale_tokens` (`staleness_mask`). The trainer's
    version moves while it trains: set `current_weight_version` after each weight update,
    and every part yielded after that is masked against the new version. `unknown_version`
    ("keep" or "mask") says what masking does with tokens of unknown version; a part holding
    one is refused until it is said, and a part whose trainable tokens are all of unknown
    version is logged once (a warning) and flagged (`RowPart.all_versions_unknown`).
    `columns` decodes only those columns of each part (and the ones staleness masking
    reads): the others are verified with the part's bytes but never decompressed.
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
        *,
        unknown_version: UnknownVersion | None = None,
        columns: Sequence[str] | None = None,
    ) -> None:
        self.columns = None if columns is None else tuple(columns)
        self.staleness = _staleness_setting(current_weight_version, max_weight_lag)
        self.unknown_version = _unknown_version_setting(unknown_version, self.staleness)
        self.reported: set[str] = set()
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
            yield self.verified(receipt, self.columns)

    def pending(self) -> list[str]:
        """Receipt names of the batches this consumer has not acknowledged."""
        keys = receipt_keys(self.layout)
        return [k for k in keys if not self._acknowledged(read_stored_receipt(self.layout, k))]

    def ack(self, key: str) -> Acknowledgement:
        """Record that this consumer consumed part `key` (a yielded `RowPart.key`).

        Durable and create-only: `AlreadyAcknowledgedError` when it was acknowledged before
        by another lifetime or process of this name (count it once). A key that is not the
        rows part its batch's receipt certifies (say, the other format's suffix) is refused:
        both suffixes share one ack object.
        """
        receipt = read_stored_receipt(self.layout, receipt_key_of_part(self.layout, key))
        if receipt.rows is not None and receipt.rows.key != key:
            raise InvalidInputError(
                f"{key!r} is not a rows part of run {self.layout.run_id} (its batch's part is "
                f"{receipt.rows.key}); acknowledge the `.key` of a part the consumer yielded"
            )
        return self.cursor.ack(receipt)

    def _acknowledged(self, receipt: HandoffReceipt) -> bool:
        if receipt.rows is None:
            raise RowsNotWrittenError(
                f"batch {receipt.batch} of run {receipt.run_id} was handed off without trainer "
                f"rows ({self.layout.dest.url}/{receipt.part_key} only): the run was finalized "
                "without `--rows parquet` or `--rows arrow`. Finalize the input under a new run "
                "id with rows"
            )
        return self.cursor.acknowledged(receipt) is not None

    def verified(
        self,
        receipt: HandoffReceipt,
        columns: Sequence[str] | None = None,
        skip: Sequence[str] = (),
    ) -> RowPart:
        """The receipt's rows part, verified, decoded (only `columns` and what staleness
        masking reads, when given; without `skip`) and masked as this consumer says.

        A Parquet part may be decoded while its digest is checked (a decoder that bounds
        every read); an Arrow part's buffers are taken as they are, so only verified bytes
        reach its reader. The key's suffix, not the bytes, picks the decoder."""
        rows = receipt.rows
        assert rows is not None
        dest = self.layout.dest
        if columns is not None and self.staleness is not None:
            columns = [*columns, *(c for c in STALENESS_COLUMNS if c not in columns)]

        fmt = row_format(rows.key)

        def decode(data: bytes) -> pa.Table:
            return read_rows(data, self.use_threads, columns, skip, fmt)

        if self.use_threads and fmt == "parquet":
            table = verified_decode(
                dest, receipt, rows.key, rows.bytes, rows.sha256, decode, NOT_YIELDED
            )
        else:
            table = decode(
                verified_bytes(dest, receipt, rows.key, rows.bytes, rows.sha256, NOT_YIELDED)
            )
        if self.staleness is None:
            return RowPart(rows.key, receipt.batch, receipt.receipt_key, table)
        current, lag = self.staleness
        table = staleness_mask(
            table, current, lag, part=rows.key, unknown_version=self.unknown_version
        )
        stale, unknown, known = _token_counts(table)
        all_unknown = unknown > 0 and known == 0
        if all_unknown and rows.key not in self.reported:
            self.reported.add(rows.key)
            logger.warning(
                "%s: all %d trainable tokens are of unknown weight version (its captures "
                "carried none), so staleness masking judged none of them; unknown_version=%r "
                "%s them",
                rows.key,
                unknown,
                self.unknown_version,
                "keeps" if self.unknown_version == "keep" else "masks",
            )
        return RowPart(
            rows.key, receipt.batch, receipt.receipt_key, table, stale, unknown, all_unknown
        )


TRAINABLE_MASK = "trainable_mask"
STALENESS_COLUMNS = ("loss_mask", "weight_version")
_MASK_TYPE = pa.list_(pa.field("element", pa.int8(), nullable=False))
UnknownVersion = Literal["mask", "keep"]
UNKNOWN_VERSION_POLICIES: tuple[UnknownVersion, ...] = ("mask", "keep")
"""What staleness masking does with a token of unknown version: mask it, or keep (train) it."""


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


def _unknown_version_setting(
    policy: UnknownVersion | None, staleness: tuple[int, int] | None
) -> UnknownVersion | None:
    """The `unknown_version` policy, checked: one of the policies, and only with masking."""
    if policy is None:
        return None
    if policy not in UNKNOWN_VERSION_POLICIES:
        raise InvalidInputError(
            f"unknown_version is {policy!r}; use 'keep' (train tokens of unknown version) or "
            "'mask' (mask them)"
        )
    if staleness is None:
        raise InvalidInputError(
            "unknown_version was given without current_weight_version and max_weight_lag: it "
            "says what staleness masking does with tokens of unknown version; give all three, "
            "or none"
        )
    return policy


def staleness_mask(
    table: pa.Table,
    current_weight_version: int,
    max_weight_lag: int,
    part: str = "table",
    *,
    unknown_version: UnknownVersion | None = None,
) -> pa.Table:
    """`table` with `trainable_mask` (list<int8>) added: per position, `loss_mask` and
    `weight_version >= current_weight_version - max_weight_lag`.

    A token of unknown version (-1, `NO_WEIGHT_VERSION`: its capture carried none) is neither
    fresh nor stale: `unknown_version="keep"` trains it, `"mask"` masks it, and without the
    choice a table holding one at a loss-mask position is refused by name, since masking it
    silently would drop every token of a run captured without versions. Nothing else
    changes. Vectorized over the flattened lists, one record batch at a time. A table without
    `weight_version` (rows written before tokcap recorded versions) is refused by name.
    """
    _staleness_setting(current_weight_version, max_weight_lag)
    _unknown_version_setting(unknown_version, (current_weight_version, max_weight_lag))
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
    keep = unknown_version == "keep"
    chunks = [_trainable(batch, oldest, keep, part) for batch in table.to_batches()]
    unknown = sum(n for _, n in chunks)
    if unknown and unknown_version is None:
        raise InvalidInputError(_unstated_policy(part, unknown, table))
    column = pa.chunked_array([mask for mask, _ in chunks], _MASK_TYPE)
    field = pa.field(TRAINABLE_MASK, _MASK_TYPE, nullable=False)
    if TRAINABLE_MASK in table.column_names:
        table = table.drop_columns([TRAINABLE_MASK])
    return table.append_column(field, column)


def _unstated_policy(part: str, unknown: int, table: pa.Table) -> str:
    """The refusal of a table holding tokens of unknown version without a policy for them."""
    loss = table.column("loss_mask").combine_chunks().flatten().to_numpy(zero_copy_only=False)
    trainable = int(np.count_nonzero(loss))
    return (
        f"{part}: {unknown} of its {trainable} trainable tokens (loss_mask 1) have no known "
        "weight version (their captures carried none, e.g. inputs from `tokcap make-inputs` "
        "or NeMo Gym's writer without a version source), so staleness cannot judge them and "
        "nothing was yielded. Say what to do with them: unknown_version='keep' trains them "
        "(their age is unknown) or unknown_version='mask' masks them; either way they are "
        "counted as unknown_version_tokens, never as stale"
    )


def _trainable(batch: pa.RecordBatch, oldest: int, keep: bool, part: str) -> tuple[pa.Array, int]:
    """One record batch's `trainable_mask`, on `loss_mask`'s list offsets, and its loss-mask
    positions of unknown version."""
    loss, versions = batch.column("loss_mask"), batch.column("weight_version")
    offsets = _offsets(loss)
    if not np.array_equal(offsets, _offsets(versions)):
        raise InvalidInputError(
            f"{part}: a row's weight_version and loss_mask have different lengths; the part "
            "was not written by tokcap, so its positions cannot be matched"
        )
    sampled = loss.flatten().to_numpy(zero_copy_only=False) != 0
    flat = versions.flatten().to_numpy(zero_copy_only=False)
    trainable = sampled & (flat >= oldest)
    unknown = sampled & (flat < 0)
    if keep:
        trainable |= unknown
    values = pa.array(trainable.astype(np.int8), pa.int8())
    mask = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values, _MASK_TYPE)
    return mask, int(np.count_nonzero(unknown))


def _offsets(lists: pa.ListArray) -> np.ndarray:
    """A list array's offsets from 0 (a sliced array's start at its first list)."""
    offsets = lists.offsets.to_numpy()
    return (offsets - offsets[0]).astype(np.int32)


def stale_token_count(table: pa.Table) -> int:
    """Loss-mask tokens of a known version that `trainable_mask` of a `staleness_mask`ed
    table masks: the stale ones (tokens of unknown version are counted apart)."""
    return _token_counts(table)[0]


def unknown_version_count(table: pa.Table) -> int:
    """Loss-mask tokens of a `staleness_mask`ed table whose version is unknown (-1)."""
    return _token_counts(table)[1]


def _token_counts(table: pa.Table) -> tuple[int, int, int]:
    """Loss-mask tokens of a `staleness_mask`ed table: stale (a known version, masked), of
    unknown version, and of a known version."""

    def flat(name: str) -> np.ndarray:
        return table.column(name).combine_chunks().flatten().to_numpy(zero_copy_only=False)

    sampled, versions = flat("loss_mask") != 0, flat("weight_version")
    known = sampled & (versions >= 0)
    stale = known & (flat(TRAINABLE_MASK) == 0)
    unknown = np.count_nonzero(sampled) - np.count_nonzero(known)
    return int(np.count_nonzero(stale)), int(unknown), int(np.count_nonzero(known))
