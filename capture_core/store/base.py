"""`CaptureStore`: the one base both capture stores implement, with their capability flags.

A capture store is a `TokenSink` and a `TokenSource` with synchronous forms (`*_now`).
Subclasses write the blocking operations; the async forms are written once here and run
them on the process's I/O pool (`storage.io_pool`), so no caller asks which class it holds.
`drop_each` is the batch drop of any `TokenSource`, one rollout at a time; `drop_in_phases`
the two-phase one of a store that can take its decisions before its deletions.
This module imports only `errors`, `records`, `protocols`, `storage.io_pool`,
`checked_entries` and `version_source`.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

from capture_core.errors import CaptureRetiredError, InvalidInputError, InvalidRecordError
from capture_core.protocols import (
    DECIDED,
    DELETED,
    DropCheckpoint,
    DropRequest,
    DropResults,
    TokenCaptureSnapshot,
    TokenSource,
)
from capture_core.records import TokenEntry
from capture_core.storage.io_pool import map_blocking, run_blocking
from capture_core.store.checked_entries import StorableEntry, storable_entry
from capture_core.store.version_source import WeightVersionSource


class CaptureStore(ABC):
    """A capture store: writes, freeze, retire, delete and sweep, each safe to repeat.

    `shared_across_hosts`: writers on several hosts may use one store at once (tokcap's
    create-only objects), rather than only the host that owns it (NeMo Gym's `flock`).
    `keeps_loss_reasons`: `mark_incomplete` stores its reason, rather than only logging it.
    """

    shared_across_hosts: ClassVar[bool]
    keeps_loss_reasons: ClassVar[bool]
    root: str

    @abstractmethod
    def probe(self, must_exist: bool = True) -> None:
        """Raise a clear error naming the store when it cannot be used (missing, not writable)."""

    @abstractmethod
    def put_now(self, entry: Any) -> None:
        """Record one call durably; a byte-identical repeat is a no-op, another payload raises."""

    @abstractmethod
    def begin_call_now(self, rollout_id: str, model_call_id: str) -> None:
        """Record the intent to make a call; after freeze it raises `CaptureFencedError`."""

    @abstractmethod
    def mark_incomplete_now(
        self, rollout_id: str, model_call_id: str = "", reason: str = ""
    ) -> None:
        """Durably record a lost call; it changes the version even after a freeze."""

    @abstractmethod
    def freeze_now(self, rollout_id: str) -> TokenCaptureSnapshot:
        """Fence a rollout against further writes and return its snapshot; idempotent."""

    @abstractmethod
    def drop_now(self, rollout_id: str, snapshot_id: str, version: int) -> bool:
        """Retire exactly the consumed snapshot; `False`, deleting nothing, if it changed."""

    @abstractmethod
    def read_entries(self, rollout_id: str) -> list[TokenEntry]:
        """A rollout's entries without freezing it (diagnostics; no consistency promise)."""

    @abstractmethod
    def delete(self, rollout_id: str) -> None:
        """Remove a rollout's capture unconditionally so the id can be reused; safe to repeat."""

    def clear_for_dispatch(self, rollout_id: str) -> None:
        """The dispatch-time clear of one rollout: `delete`, then mark the next attempt.

        A store that can record an attempt marker writes it after the delete, so a freeze
        can show that the capture holds one attempt (`TokenCaptureSnapshot.attempt_marked`);
        this base keeps none. Safe to repeat.
        """
        self.delete(rollout_id)

    @abstractmethod
    def sweep_retired(self, older_than_seconds: float) -> int:
        """Remove tombstones retired longer ago than the cutoff; return how many."""

    @abstractmethod
    def close_now(self) -> None:
        """Release the backend. Safe to repeat."""

    weight_version_source: WeightVersionSource | None = None
    """Where the trainer publishes its current weight version, stamped on puts that carry
    none (`version_source`); `None`: nothing is stamped."""

    @property
    def weight_version_location(self) -> str | None:
        """Where `weight_version_source` reads, or `None`: part of a store's identity."""
        source = self.weight_version_source
        return None if source is None else source.location

    def storable(self, entry: Any) -> StorableEntry:
        """The entry a put stores, checked as it is now (`checked_entries.storable_entry`),
        stamped with the source's current version when it carries none
        (`weight_version_source`; a source that cannot say refuses the put).

        A refused entry is never stored. When its rollout and call can be read and the
        rollout is still open to writes, the call is first reported lost
        (`mark_incomplete_now`), so the rollout is masked even when no intent was recorded
        for it: a rollout never trains without one of its calls. On a frozen rollout the
        refusal is all, as for any late put: the snapshot taken stands.
        Raises `InvalidRecordError` naming the rollout, the call and the field.
        """
        try:
            checked = storable_entry(entry)
            if self.weight_version_source is not None:
                stamped = self.weight_version_source.stamp(checked.entry)
                if stamped is not checked.entry:
                    checked = checked._replace(entry=stamped, stamped=True)
        except InvalidRecordError as exc:
            raise self.refused(entry, exc) from exc
        return checked

    def refused(self, entry: Any, exc: InvalidRecordError) -> InvalidRecordError:
        """The error to raise for an entry a put cannot store, its call reported lost first
        as `storable` says; also for one that passed the check but cannot be encoded."""
        rollout_id, call_id = _identity(entry)
        if rollout_id is None:
            return exc
        detail = str(exc).removeprefix(f"call {call_id!r}: ")
        refusal = f"call {call_id!r} was refused at put: {detail}"
        try:
            outcome = self._lose_refused_call(rollout_id, call_id, refusal)
        except InvalidInputError:  # an id no store holds: nothing can be stored under it
            return exc
        return InvalidRecordError(f"rollout {rollout_id}: {refusal}. Nothing was stored; {outcome}")

    def unreadable(self, entry: TokenEntry, exc: InvalidRecordError) -> InvalidRecordError:
        """The error to raise for an entry whose stored form a reader would refuse, found by
        judging the exact bytes a put is about to store (`refused`; nothing is stored)."""
        detail = str(exc).removeprefix(f"call {entry.model_call_id!r}: ")
        return self.refused(
            entry,
            InvalidRecordError(
                f"what it would store does not read back ({detail}); give every field a value "
                "JSON holds as it is (no NaN or infinity) of the type a TokenEntry gives it"
            ),
        )

    def _lose_refused_call(self, rollout_id: str, call_id: str, refusal: str) -> str:
        """Report a refused call lost unless the rollout is closed to writes; say the outcome."""
        if self._writes_closed(rollout_id):
            return "the rollout was already frozen, so the call came too late anyway"
        try:
            self.mark_incomplete_now(rollout_id, call_id, refusal)
        except CaptureRetiredError:
            return "the rollout was already retired"
        return "the rollout is marked incomplete and will be masked"

    def _writes_closed(self, rollout_id: str) -> bool:
        """Whether the rollout is frozen or retired, so a put to it raises. A store that
        cannot tell answers `False` (a refused put then reports its call lost in any case)."""
        return False

    def append(self, entry: Any) -> None:
        """Synchronous `put`, the name NeMo Gym's sink protocol uses."""
        self.put_now(entry)

    async def put(self, entry: Any) -> None:
        """Record one call durably; see `put_now`."""
        await run_blocking(self.put_now, entry)

    async def begin_call(self, rollout_id: str, model_call_id: str) -> None:
        """Durably record the intent to make a call; see `begin_call_now`."""
        await run_blocking(self.begin_call_now, rollout_id, model_call_id)

    async def mark_incomplete(
        self, rollout_id: str, model_call_id: str = "", reason: str = ""
    ) -> None:
        """Durably record a lost call; see `mark_incomplete_now`."""
        await run_blocking(self.mark_incomplete_now, rollout_id, model_call_id, reason)

    async def freeze(self, rollout_id: str) -> TokenCaptureSnapshot:
        """Fence and read a rollout's capture; see `freeze_now`."""
        return await run_blocking(self.freeze_now, rollout_id)

    async def drop(self, rollout_id: str, *, snapshot_id: str, version: int) -> bool:
        """Retire exactly the consumed snapshot; see `drop_now`."""
        return await run_blocking(self.drop_now, rollout_id, snapshot_id, version)

    async def drop_many(
        self, drops: Sequence[DropRequest], *, concurrency: int, checkpoint: DropCheckpoint = None
    ) -> DropResults:
        """Retire a batch (`BatchTokenSource`); here one `drop` per rollout (`drop_each`)."""
        return await drop_each(self, drops, concurrency=concurrency, checkpoint=checkpoint)

    async def close(self) -> None:
        """Release the backend. Safe to repeat."""
        self.close_now()


def _identity(entry: Any) -> tuple[str | None, str]:
    """The rollout and call ids an entry names, when they are strings (else `None`, "")."""
    if isinstance(entry, Mapping):
        rollout_id, call_id = entry.get("rollout_id"), entry.get("model_call_id")
    else:
        rollout_id = getattr(entry, "rollout_id", None)
        call_id = getattr(entry, "model_call_id", None)
    return (
        rollout_id if isinstance(rollout_id, str) else None,
        call_id if isinstance(call_id, str) else "",
    )


async def drop_each(
    source: TokenSource,
    drops: Sequence[DropRequest],
    *,
    concurrency: int,
    checkpoint: DropCheckpoint = None,
) -> DropResults:
    """`drop_many` of any source: its `drop` per rollout, up to `concurrency` at once.

    Each drop decides and deletes its own rollout, so `DELETED` follows each successful one
    and `DECIDED` comes once all of them returned.
    """
    limit = asyncio.Semaphore(concurrency)

    async def drop(request: DropRequest) -> bool | Exception:
        async with limit:
            try:
                retired = await source.drop(
                    request.rollout_id, snapshot_id=request.snapshot_id, version=request.version
                )
            except Exception as exc:
                return exc
        if retired and checkpoint is not None:
            checkpoint(DELETED)
        return retired

    results = await asyncio.gather(*map(drop, drops))
    if checkpoint is not None:
        checkpoint(DECIDED)
    return results


async def drop_in_phases(
    drops: Sequence[DropRequest],
    decide: Callable[[DropRequest], Any],
    delete: Callable[[DropRequest, Any], bool],
    *,
    concurrency: int,
    decide_concurrency: int | None = None,
    checkpoint: DropCheckpoint = None,
    after_decisions: Callable[[], None] | None = None,
) -> DropResults:
    """`drop_many` in two phases: every rollout's decision durable, then the deletions.

    `decide` takes one rollout's decision durably and returns what `delete` needs to delete
    its capture, or None when the snapshot is not retired; `delete` returns whether it
    deleted (False: the decision no longer stands, say the id was cleared meanwhile). Both
    run on the I/O pool (`map_blocking`): the decisions up to `decide_concurrency` (default
    `concurrency`) at once, the deletions up to `concurrency`. `after_decisions`
    runs on the pool once every decision returned (say, to release what they shared),
    then `DECIDED` is told; `DELETED` is told, from the deleting thread, after each deleted
    capture. No capture is deleted before its own decision is durable.
    """
    decided = await map_blocking(decide, drops, min(concurrency, decide_concurrency or concurrency))
    if after_decisions is not None:
        await run_blocking(after_decisions)
    if checkpoint is not None:
        checkpoint(DECIDED)

    def finish(index: int) -> bool | Exception:
        listed = decided[index]
        if listed is None:
            return False
        if isinstance(listed, Exception):
            return listed
        return delete(drops[index], listed)

    def deleted(result: Any) -> None:
        if result is True and checkpoint is not None:
            checkpoint(DELETED)

    return await map_blocking(finish, range(len(drops)), concurrency, after=deleted)
