"""Every run of a destination as one verified, resumable stream of rows parts, split by rank.

A `RowStream(dest, name)` reads every run at `dest` whose manifest says it writes rows, each
part verified against its receipt as `RowConsumer` verifies it, and follows runs as they land
(a poll every `poll_seconds`; with `follow=False` it yields what was there when it started
and stops). Acknowledgements are `RowConsumer`'s own create-only objects, one per run, part
and consumer name, so retirement after that consumer and the inbox's retire pass honour
them unchanged, and a restarted stream yields every unacknowledged part again.

Order: parts are yielded in handoff order, by the time their receipt records both parts
were verified (`HandoffReceipt.handed_off_at`; a receipt written before tokcap recorded it
counts as handed off when its run was claimed, the manifest's `started_at`), then run id,
then batch. The key is in the receipt, so every rank and every restart sees the same order.
A poll yields the parts it finds after every part of earlier polls, so a part found late (a
handing-off clock behind the others) comes after what was already yielded, never skipped;
on a restart the unacknowledged parts come again in key order.

Ranks: each part is read by exactly one of `world_size` ranks, recorded create-only beside
its acknowledgement (`<run>/consumers/<name>/part-...-<digest>.rank`) before any rank reads
it. Whoever lists a part first records the rank of every unrecorded part it found, greedily
balancing their rows bytes (the part's tokens, compressed) over that window; a record lost
in a race is read back, so every rank agrees on every part, and a part's rank never changes.
Each rank acknowledges its own parts, so a slow rank blocks nobody. A rank record names its
`world_size`: a stream of another size is refused while any part recorded under the old one
is unacknowledged (drain every rank first).

A part or receipt that does not verify stops the stream by default, naming the part, its
run, the consumer's rank and what to do: a trainer never trains on a hole and never skips a
part unannounced. `on_unverified="hold"` reads the other parts instead: the bad one is
logged as an error, listed in `held`, left unacknowledged (retirement keeps its captures)
and checked again on every poll. This module does not import Prefect.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ValidationError

from capture_core.errors import (
    CaptureStoreError,
    InvalidInputError,
    PartMismatchError,
    RowsNotWrittenError,
    UnreadableReceiptError,
)
from capture_core.rows.row_consumer import RowConsumer, RowPart, UnknownVersion
from capture_core.rows.row_cursor import Acknowledgement, read_stored_receipt, receipt_keys
from capture_core.run.receipt import HandoffReceipt
from capture_core.run.run_layout import MANIFEST, RunManifest, ack_key
from capture_core.storage import ByteStore, open_byte_store

logger = logging.getLogger("capture_core.dataset")  # the public face: its name stays

DEFAULT_POLL_SECONDS = 2.0
OnUnverified = Literal["raise", "hold"]
ON_UNVERIFIED: tuple[OnUnverified, ...] = ("raise", "hold")
"""What a stream does at a part or receipt that does not verify: stop there (raise, the
default), or hold it back, logged and listed in `held`, and read the others."""


class RankRecord(BaseModel):
    """Which rank of how many reads a part for consumer `consumer`."""

    consumer: str
    part: str
    rank: int
    world_size: int


class WorldSizeChangedError(InvalidInputError):
    """The stream's `world_size` differs from the one parts are still pending under."""


def rank_key(run_id: str, consumer: str, part: str) -> str:
    """The rank record of rows part `part` for consumer `consumer`, beside its ack."""
    return ack_key(run_id, consumer, part).removesuffix(".ack") + ".rank"


@dataclass(frozen=True)
class Pending:
    """A part found by a poll: its order key (handoff time, run, batch), run and receipt."""

    order: tuple[float, str, int]
    run_id: str
    receipt: HandoffReceipt


def _rows_key(pending: Pending) -> str:
    rows = pending.receipt.rows
    assert rows is not None  # `_receipt` refuses a receipt without rows
    return rows.key


def _checked_rank(rank: int, world_size: int) -> tuple[int, int]:
    for label, value in (("rank", rank), ("world_size", world_size)):
        if type(value) is not int or value < 0:
            raise InvalidInputError(f"{label} is {value!r}; it must be an integer 0 or more")
    if not 0 <= rank < world_size:
        raise InvalidInputError(
            f"rank {rank} is not below world_size {world_size}; ranks are 0..world_size-1"
        )
    return rank, world_size


def balanced_ranks(sizes: Sequence[int], world_size: int) -> list[int]:
    """A rank per part, in order: each to the rank with the least load so far (ties to the
    lowest rank), largest part first, so a window's loads differ by at most one part."""
    loads = [0] * world_size
    ranks = [0] * len(sizes)
    for index in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        rank = min(range(world_size), key=lambda r: (loads[r], r))
        ranks[index] = rank
        loads[rank] += sizes[index]
    return ranks


class RowStream:
    """Consumer `name` of every run's trainer rows at `dest`, as rank `rank` of `world_size`.

    Iterating yields `RowPart`s naming their `run_id`; their keys hold the run id, so they are
    unique across runs. `ack(key)` acknowledges one. `columns` reads only those columns
    (the ones staleness masking needs are read as well); without it every column is read but
    `weight_version`, unless staleness masking needs it. Staleness settings are
    `RowConsumer`'s; `current_weight_version` may be set while streaming. `on_unverified`
    says what a part or receipt that does not verify does: stop the stream ("raise") or wait
    in `held`, unacknowledged, while the others are read ("hold").
    """

    def __init__(
        self,
        dest: str,
        name: str,
        *,
        storage_options: Mapping[str, Any] | None = None,
        follow: bool = True,
        poll_seconds: float = DEFAULT_POLL_SECONDS,
        rank: int = 0,
        world_size: int = 1,
        current_weight_version: int | None = None,
        max_weight_lag: int | None = None,
        unknown_version: UnknownVersion | None = None,
        columns: Sequence[str] | None = None,
        use_threads: bool = True,
        on_unverified: OnUnverified = "raise",
    ) -> None:
        if on_unverified not in ON_UNVERIFIED:
            raise InvalidInputError(
                f"on_unverified is {on_unverified!r}; use 'raise' (stop at a part that does "
                "not verify) or 'hold' (read the others; it waits, unacknowledged)"
            )
        self.on_unverified = on_unverified
        self.held: dict[str, str] = {}
        """Parts (or receipts) held back because they do not verify, with why; a held part
        is checked again on every poll and leaves this once it verifies."""
        self.dest_url, self.options = dest, storage_options
        self.dest: ByteStore = open_byte_store(dest, storage_options)
        self.name = name
        self.follow, self.poll_seconds = follow, float(poll_seconds)
        self.rank, self.world_size = _checked_rank(rank, world_size)
        self.token = uuid.uuid4().hex
        self.columns = None if columns is None else tuple(columns)
        self.settings: dict[str, Any] = {
            "current_weight_version": current_weight_version,
            "max_weight_lag": max_weight_lag,
            "unknown_version": unknown_version,
            "use_threads": use_threads,
        }
        self.runs: dict[str, RowConsumer] = {}
        self.receipts: dict[tuple[str, str], HandoffReceipt] = {}
        self.settled: set[str] = set()
        """Parts known acknowledged by this name or recorded for another rank: neither
        changes, so a poll never reads them again."""
        self.yielded: set[str] = set()
        self.template = self._consumer("stream-settings-check")  # refuses bad settings now

    @property
    def current_weight_version(self) -> int | None:
        return self.template.current_weight_version

    @current_weight_version.setter
    def current_weight_version(self, version: int) -> None:
        self.template.current_weight_version = version
        for consumer in self.runs.values():
            consumer.current_weight_version = version

    def __iter__(self) -> Iterator[RowPart]:
        """This rank's unacknowledged parts of every run, verified, in stream order."""
        while True:
            found = self._poll()
            for pending in found:
                consumer = self.runs[pending.run_id]
                try:
                    part = consumer.verified(pending.receipt, self.columns, self._skipped())
                except PartMismatchError as exc:
                    self._unverified(_rows_key(pending), exc)
                    continue
                self.held.pop(part.key, None)
                self.yielded.add(part.key)
                yield replace(part, run_id=pending.run_id)
            if not self.follow:
                return
            time.sleep(self.poll_seconds)

    def _unverified(self, key: str, exc: CaptureStoreError) -> None:
        """Stop at a part or receipt that does not verify, or hold it (`on_unverified`)."""
        if self.on_unverified == "raise":
            raise type(exc)(
                f"{exc}. Consumer {self.name} (rank {self.rank} of {self.world_size}) stops "
                "here: parts come in handoff order and none is skipped unannounced. Restore "
                "it and iterate again (the stream resumes at it), or build the stream with "
                "on_unverified='hold' to read the other parts while this one waits, "
                "unacknowledged (its captures are kept)"
            ) from exc
        if key not in self.held:
            logger.error(
                "%s is held, not yielded: %s. It stays unacknowledged (its captures are kept) "
                "and is checked again on every poll; restore it to read it",
                key,
                exc,
            )
        self.held[key] = str(exc)

    def _skipped(self) -> tuple[str, ...]:
        """`weight_version` is decoded only for staleness masking or when asked for."""
        masking = self.template.staleness is not None
        return () if masking or self.columns is not None else ("weight_version",)

    def ack(self, key: str) -> Acknowledgement:
        """Record, create-only and durably, that this consumer consumed part `key` (a
        yielded `RowPart.key`): the same object `RowConsumer.ack` writes."""
        run_id = key.split("/", 1)[0]
        if run_id not in self.runs:
            raise InvalidInputError(
                f"{key!r} is not a part this stream yielded; acknowledge a yielded `.key`"
            )
        return self.runs[run_id].ack(key)

    def pending(self) -> list[str]:
        """Keys of this rank's parts present now and not acknowledged by this name."""
        return [_rows_key(p) for p in self._scan()]

    def _consumer(self, run_id: str) -> RowConsumer:
        consumer = RowConsumer(self.dest_url, run_id, self.name, self.options, **self.settings)
        consumer.cursor.token = self.token
        return consumer

    def _poll(self) -> list[Pending]:
        """The parts of this rank found now that this lifetime has not yielded."""
        return [p for p in self._scan() if _rows_key(p) not in self.yielded]

    def _scan(self) -> list[Pending]:
        """Every unacknowledged part of this rank present now, in stream order."""
        found: list[Pending] = []
        unranked: list[Pending] = []
        for run_id, started in self._rows_runs():
            if run_id not in self.runs:
                self.runs[run_id] = self._consumer(run_id)
            consumer = self.runs[run_id]
            for key in receipt_keys(consumer.layout):
                try:
                    receipt = self._receipt(consumer, key)
                except UnreadableReceiptError as exc:
                    self._unverified(consumer.layout.receipt_key(key), exc)
                    continue
                assert receipt.rows is not None
                if receipt.rows.key in self.settled:
                    continue
                if consumer.cursor.acknowledged(receipt) is not None:
                    self.settled.add(receipt.rows.key)
                    continue
                handed_off = started if receipt.handed_off_at is None else receipt.handed_off_at
                unranked.append(Pending((handed_off, run_id, receipt.batch), run_id, receipt))
        ranks = self._ranks(unranked)
        self.settled.update(key for key, rank in ranks.items() if rank != self.rank)
        found = [p for p in unranked if ranks[_rows_key(p)] == self.rank]
        return sorted(found, key=lambda p: p.order)

    def _receipt(self, consumer: RowConsumer, key: str) -> HandoffReceipt:
        """Receipt `key` of the consumer's run, read once (a receipt never changes)."""
        where = (consumer.layout.run_id, key)
        if where not in self.receipts:
            receipt = read_stored_receipt(consumer.layout, key)
            if receipt.rows is None:
                raise RowsNotWrittenError(
                    f"batch {receipt.batch} of run {receipt.run_id} was handed off without "
                    "trainer rows though its manifest says it writes them; its receipt was "
                    "edited. Restore it"
                )
            self.receipts[where] = receipt
        return self.receipts[where]

    def _rows_runs(self) -> list[tuple[str, float]]:
        """The destination's runs that write rows, with their claim time."""
        names = self.dest.list_children("")
        manifests = self.dest.get_many([f"{n}/{MANIFEST}" for n in names])
        runs = []
        for name in names:
            data = manifests[f"{name}/{MANIFEST}"]
            if data is None:
                continue
            try:
                manifest = RunManifest.model_validate(orjson.loads(data))
            except (ValueError, ValidationError):
                logger.warning("%s/%s: unreadable manifest; its run is skipped", name, MANIFEST)
                continue
            if manifest.rows != "none" and manifest.run_id == name:
                runs.append((name, manifest.started_at or 0.0))
        return runs

    def _ranks(self, parts: list[Pending]) -> dict[str, int]:
        """The rank of every part: its record, or one recorded now for the unrecorded ones."""
        keys = {_rows_key(p): rank_key(p.run_id, self.name, _rows_key(p)) for p in parts}
        stored = self.dest.get_many(list(keys.values()))
        ranks: dict[str, int] = {}
        new: list[Pending] = []
        for part in parts:
            data = stored[keys[_rows_key(part)]]
            if data is None:
                new.append(part)
            else:
                ranks[_rows_key(part)] = self._recorded_rank(keys[_rows_key(part)], data)
        sizes = [p.receipt.rows.bytes if p.receipt.rows else 0 for p in new]
        for part, rank in zip(new, balanced_ranks(sizes, self.world_size), strict=True):
            key = keys[_rows_key(part)]
            record = RankRecord(
                consumer=self.name, part=_rows_key(part), rank=rank, world_size=self.world_size
            )
            body = orjson.dumps(record.model_dump(), option=orjson.OPT_SORT_KEYS)
            if not self.dest.create(key, body):  # another rank recorded it first
                rank = self._recorded_rank(key, self.dest.get(key) or b"")
            ranks[_rows_key(part)] = rank
        return ranks

    def _recorded_rank(self, key: str, data: bytes) -> int:
        try:
            record = RankRecord.model_validate(orjson.loads(data))
        except (ValueError, ValidationError) as exc:
            raise InvalidInputError(
                f"rank record {self.dest.url}/{key} cannot be read ({type(exc).__name__}); "
                "restore it: it says which rank reads its part"
            ) from exc
        if record.world_size != self.world_size:
            raise WorldSizeChangedError(
                f"consumer {self.name}: part {record.part} is pending for rank {record.rank} "
                f"of world_size {record.world_size}, but this stream has world_size "
                f"{self.world_size}. Restart with world_size={record.world_size}, or drain "
                "every rank (acknowledge all their parts) before changing it"
            )
        return record.rank
