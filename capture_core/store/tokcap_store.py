"""`TokenCaptureStore`: tokcap's capture protocol on any byte store, without a lock service.

One object per event, every write create-only, so racing writers and freezers stay correct.
The key layout is in `capture_layout`, the entry format in `compact` (stored schema 3), the
freeze claim and retirement decision in `retirement`, reading events back in
`capture_entries`; the byte stores beneath are in `capture_core.storage`.
It is a `CaptureStore` (so a `TokenSink` and a `TokenSource`); NeMo Gym can load it as a sink.
The guarantees are described in docs/store.md.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from capture_core.errors import (
    CaptureConflictError,
    CaptureFencedError,
    CaptureRetiredError,
    CaptureStoreError,
    InvalidRecordError,
)
from capture_core.ids import validate_rollout_id
from capture_core.protocols import (
    DropCheckpoint,
    DropRequest,
    DropResults,
    TokenCaptureSnapshot,
)
from capture_core.records import TokenEntry
from capture_core.storage import ByteStore, open_byte_store
from capture_core.storage.io_pool import run_blocking
from capture_core.store import capture_entries, compact, parent_index, retirement
from capture_core.store import capture_layout as layout
from capture_core.store.base import CaptureStore, drop_in_phases
from capture_core.store.capture_layout import call_key
from capture_core.store.nemo_gym_store import nemo_gym_store_for
from capture_core.store.retirement import TombstoneGroups
from capture_core.store.stored_json import encode_json

SETTLE_SECONDS = 5.0
# Decisions taken at once on a byte store without round trips (local disk): each is some
# interpreter work and one folder fsync, and more threads only contend (docs/perf.md).
LOCAL_DECISIONS_AT_ONCE = 2


class TokenCaptureStore(CaptureStore):
    """Capture store at `root`: a local path (plain, `file://`, `local://`), `memory://` or S3.

    `storage_options` go to the fsspec filesystem (endpoint, credentials); they are never
    logged or shown in `repr`. `parent_index_bytes` bounds the memory a writer spends finding
    delta parents (docs/store.md, Delta parents). Async methods run blocking I/O on the
    process's shared I/O thread pool (`capture_core.storage.io_pool`).
    """

    shared_across_hosts = True
    keeps_loss_reasons = True

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        """For compatibility, a directory in NeMo Gym's layout opens as `NemoGymFileStore`.

        Code that may meet such a directory calls `open_capture_store`, which says so;
        earlier callers of the constructor keep the store they got. Subclasses are
        constructed as they are, whatever their signature.
        """
        root = args[0] if args else kwargs.get("root")
        if cls is TokenCaptureStore and root is not None:
            found = nemo_gym_store_for(root)
            if found is not None:
                return found
        return super().__new__(cls)

    def __init__(
        self,
        root: str | os.PathLike[str],
        storage_options: Mapping[str, Any] | None = None,
        parent_index_bytes: int = parent_index.DEFAULT_MAX_BYTES,
    ) -> None:
        self.root = os.fspath(root)
        self.storage_options = dict(storage_options or {})
        self._bytes = open_byte_store(self.root, self.storage_options)
        self._parents = parent_index.ParentIndex(parent_index_bytes)

    def __repr__(self) -> str:
        return f"TokenCaptureStore({self.root!r})"

    def __reduce__(self) -> tuple[type[TokenCaptureStore], tuple[str, dict[str, Any], int]]:
        return (TokenCaptureStore, (self.root, self.storage_options, self._parents.max_bytes))

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, TokenCaptureStore)
            and self.root == other.root
            and self.storage_options == other.storage_options
        )

    def __hash__(self) -> int:
        return hash(self.root)

    @property
    def byte_store(self) -> ByteStore:
        """The byte store beneath; for tools and tests that inspect the raw layout."""
        return self._bytes

    def probe(self, must_exist: bool = True) -> None:
        """Raise a clear error naming the root when its byte store cannot be used."""
        self._bytes.probe(must_exist)

    # -- writes ---------------------------------------------------------------------------

    def put_now(self, entry: Any) -> None:
        """Record one call durably; when this returns every client of the root sees it.

        A byte-identical repeat is a no-op, also after freeze. A different payload for the
        same call id raises `CaptureConflictError` and marks the rollout incomplete.
        A put after freeze raises `CaptureFencedError`. One whose entry landed while the
        rollout was being frozen raises too: the entry is stored, and a snapshot listed
        before it landed can no longer be retired, because the entry changed its version.
        """
        record, prompt_ids = self.storable(entry)
        rollout_id = validate_rollout_id(record.rollout_id)
        name = call_key(record.model_call_id)
        key = layout.entry_key(rollout_id, name)
        try:
            encoded = self._encode(rollout_id, compact.Draft(record, name, prompt_ids))
        except (TypeError, ValueError, OverflowError) as exc:  # checked, yet not encodable
            raise self.refused(record, InvalidRecordError(f"cannot be encoded: {exc}")) from exc
        if self._fence(rollout_id):
            existing = self._settled(key)
            if existing is not None and compact.stored_identity(existing) == encoded.identity:
                return
            raise CaptureFencedError(
                f"rollout {rollout_id} is already frozen or retired; call "
                f"{record.model_call_id!r} arrived too late and was not recorded"
            )
        existing = self._create_entry(rollout_id, record.model_call_id, name, encoded)
        if existing is None:
            return
        if compact.stored_identity(existing) == encoded.identity:
            self._parents.remember(rollout_id, name, encoded.known)
            return
        self._refuse_conflict(rollout_id, record.model_call_id, existing)

    def _encode(self, rollout_id: str, draft: compact.Draft) -> compact.EncodedEntry:
        """The entry as a delta against its longest stored parent (docs/store.md).

        A parent held in memory that the prompt extends by at most that parent's generation
        length needs no listing, only proof that its object is still there. A longer parent
        would be a call another writer stored since, which adds its own generation and the
        input after it, so the prompt usually grew by more and the put lists. Otherwise the
        delta's new tokens are at most one generation long: storage stays linear.
        """
        parent = draft.match(self._parents.known(rollout_id))
        if (
            parent is not None
            and draft.prompt_length - parent.length <= parent.generation_length
            and self._bytes.exists(layout.entry_key(rollout_id, parent.call_key))
        ):
            return draft.encode(parent)
        return draft.encode(draft.match(self._parent_candidates(rollout_id)))

    def _parent_candidates(self, rollout_id: str) -> list[compact.Known]:
        """The stored calls of the rollout a put may extend: one listing, plus a read of
        each entry this process has not seen (another writer's, or after eviction)."""
        listed = self._bytes.list_children(layout.entry_folder(rollout_id))

        def read(names: Sequence[str]) -> dict[str, bytes | None]:
            found = self._bytes.get_many([layout.entry_key(rollout_id, n) for n in names])
            return {name: found[layout.entry_key(rollout_id, name)] for name in names}

        return self._parents.candidates(rollout_id, listed, read)

    def _create_entry(
        self, rollout_id: str, model_call_id: str, name: str, encoded: compact.EncodedEntry
    ) -> bytes | None:
        """Store the entry; return `None` once stored, or the object already under `name`."""
        key = layout.entry_key(rollout_id, name)
        for _attempt in range(3):
            if self._bytes.create_in_place(key, encoded.data):
                self._parents.remember(rollout_id, name, encoded.known)
                if self._fence(rollout_id):
                    raise CaptureFencedError(
                        f"call {model_call_id!r} of rollout {rollout_id} was stored while the "
                        "rollout was being frozen, so its finalization may not include it; a "
                        "snapshot without it cannot be retired (its version changed), so the "
                        "capture is kept either way. Put every call before finalizing its rollout"
                    )
                return None
            existing = self._settled(key)
            if existing is not None:
                return existing
        raise CaptureStoreError(
            f"rollout {rollout_id}: call {model_call_id!r} could not be stored, its object "
            "keeps vanishing (a concurrent delete of the rollout?); retry the put"
        )

    def _refuse_conflict(self, rollout_id: str, model_call_id: str, existing: bytes) -> None:
        """Another payload (or a torn earlier attempt) holds the call: report the call lost."""
        reason, advice = capture_entries.conflict_reason(model_call_id, existing)
        outcome = (
            "it was already retired, so its handed-off record holds the first payload"
            if self._report_loss(rollout_id, model_call_id, reason)
            else "the rollout is marked incomplete and will be masked"
        )
        raise CaptureConflictError(f"rollout {rollout_id}: {reason}; {outcome}; {advice}")

    def _settled(self, key: str) -> bytes | None:
        """The object at `key`, waiting up to `SETTLE_SECONDS` while it is torn.

        A local put writes in place, so a racing put of the same call may still be writing;
        a torn object that stays torn was left by a crashed put.
        """
        deadline = time.monotonic() + SETTLE_SECONDS
        pause = 0.001
        while True:
            data = self._bytes.get(key)
            if data is None or not compact.is_torn(data) or time.monotonic() > deadline:
                return data
            time.sleep(pause)
            pause = min(pause * 2, 0.05)

    def mark_incomplete_now(
        self, rollout_id: str, model_call_id: str = "", reason: str = ""
    ) -> None:
        """Durably record a lost call. It changes the version even after a freeze.

        Each call adds evidence; nothing clears it but retirement or delete. Linearizable
        with `drop`: on a frozen rollout the marker also races drop for `RETIRED`, so either
        this returns and no drop can succeed, or it raises `CaptureRetiredError` because the
        rollout was retired first (its handed-off record may lack this call).
        """
        validate_rollout_id(rollout_id)
        text = reason or (
            f"call {model_call_id!r} was lost" if model_call_id else "a call was lost"
        )
        if self._report_loss(rollout_id, model_call_id, text):
            raise CaptureRetiredError(
                f"rollout {rollout_id} was retired before this loss was reported ({text}); "
                "its handed-off record may be missing that call"
            )

    def _report_loss(self, rollout_id: str, model_call_id: str, reason: str) -> bool:
        """Write an incomplete marker; return whether the rollout was retired before it.

        Not frozen yet: every freeze lists after the marker, so every snapshot includes it.
        Frozen: the marker races drop for `RETIRED` with a refusal; exactly one wins.
        """
        self._write_marker(rollout_id, model_call_id, reason)
        if not self._fence(rollout_id):
            return False
        with retirement.staged_refusal(self._bytes, reason) as refusal:
            return retirement.is_tombstone(retirement.decide(self._bytes, rollout_id, refusal))

    def _write_marker(self, rollout_id: str, model_call_id: str, reason: str) -> None:
        marker = {"model_call_id": model_call_id, "reason": reason, "at": time.time()}
        self._bytes.create(layout.marker_key(rollout_id, uuid.uuid4().hex), encode_json(marker))

    def begin_call_now(self, rollout_id: str, model_call_id: str) -> None:
        """Record the intent to make a call; an intent without an entry at freeze is a loss.

        A repeat is a no-op. After freeze it raises `CaptureFencedError`, and so does an
        intent that landed while the rollout was being frozen: the call must not start.
        """
        validate_rollout_id(rollout_id)
        fenced = CaptureFencedError(
            f"rollout {rollout_id} is already frozen or retired; call {model_call_id!r} "
            "must not start"
        )
        if self._fence(rollout_id):
            raise fenced
        key = layout.intent_key(rollout_id, call_key(model_call_id))
        self._bytes.create_in_place(key, encode_json({"model_call_id": model_call_id}))
        if self._fence(rollout_id):
            raise fenced  # a freeze raced the intent: the snapshot may lack it

    def _writes_closed(self, rollout_id: str) -> bool:
        """Whether the rollout is frozen or retired (FROZEN exists: retirement keeps it)."""
        return self._fence(validate_rollout_id(rollout_id))

    def _fence(self, rollout_id: str) -> bool:
        """Whether writes are closed. Retirement keeps FROZEN, so one check covers both."""
        return self._bytes.exists(layout.frozen_key(rollout_id))

    # -- freeze ---------------------------------------------------------------------------

    def freeze_now(self, rollout_id: str) -> TokenCaptureSnapshot:
        """Fence a rollout against further writes and return its snapshot.

        Atomic and idempotent: the first freezer's id wins and, with nothing changed, a
        repeat returns the same id, version and entries. No records: an empty snapshot.
        A retired rollout raises `CaptureRetiredError`; an unreadable object raises
        `UnreadableCaptureError` naming it.
        """
        validate_rollout_id(rollout_id)
        # No decision check first: retirement keeps FROZEN, so a retired rollout's claim
        # fails and its listing shows RETIRED, which refuses it below (one round trip less).
        snapshot_id = retirement.claim_freeze(self._bytes, rollout_id)
        keys = self._bytes.list_prefix(rollout_id)
        if layout.retired_key(rollout_id) in keys:
            retirement.refuse_retired(self._bytes, rollout_id)
        events = layout.group_events(rollout_id, keys)
        names = events[layout.ENTRY]
        entries, reasons = capture_entries.read_entries(self._bytes, rollout_id, names)
        reasons += capture_entries.incomplete_reasons(self._bytes, rollout_id, events, entries)
        return TokenCaptureSnapshot(
            rollout_id=rollout_id,
            entries=tuple(entries),
            incomplete=bool(reasons),
            snapshot_id=snapshot_id,
            version=layout.version_of(events),
            incomplete_reasons=tuple(reasons),
            attempt_marked=layout.attempt_key(rollout_id) in keys,
        )

    def read_entries(self, rollout_id: str) -> list[TokenEntry]:
        """Read a rollout's entries without freezing it (diagnostics; no consistency promise)."""
        validate_rollout_id(rollout_id)
        events = layout.group_events(rollout_id, self._bytes.list_prefix(rollout_id))
        return capture_entries.read_entries(self._bytes, rollout_id, events[layout.ENTRY])[0]

    # -- retire and delete ----------------------------------------------------------------

    def drop_now(self, rollout_id: str, snapshot_id: str, version: int) -> bool:
        """Retire exactly the consumed snapshot, leaving a small tombstone.

        Returns `False`, deleting nothing, when the freeze id or version differ, or when a
        loss reported after the freeze refused retirement first (see `mark_incomplete_now`).
        Safe to repeat, also after a crash part-way: the tombstone names the snapshot.
        Call only after the finalized record was durably handed off.
        """
        validate_rollout_id(rollout_id)
        request = DropRequest(rollout_id, snapshot_id=snapshot_id, version=version)
        with TombstoneGroups(self._bytes, [request]) as tombstones:
            listed = self._decide_drop(request, tombstones)
        if listed is not None:
            self._delete_payloads(rollout_id, listed)
        return listed is not None

    async def drop_many(
        self, drops: Sequence[DropRequest], *, concurrency: int, checkpoint: DropCheckpoint = None
    ) -> DropResults:
        """Retire a batch as `drop_now` would, in two phases (`BatchTokenSource`).

        First every rollout's decision is taken and made durable; then the retired rollouts'
        payloads are deleted. The deletions run up to `concurrency` rollouts at once on the
        I/O pool, the decisions as many, or `LOCAL_DECISIONS_AT_ONCE` on local disk; no
        capture is deleted before its own tombstone is durable. A crash between the phases
        or during the second leaves tombstones above their payloads: a repeated drop (the
        re-run) deletes them, and until then they are fenced like any retired capture
        (docs/store.md, Retiring a batch). A subclass with its own `drop_now`
        or `drop` is retired through it, one drop per rollout: the two phases would bypass it.
        """
        own = type(self).drop_now, type(self).drop
        if own != (TokenCaptureStore.drop_now, CaptureStore.drop):
            return await super().drop_many(drops, concurrency=concurrency, checkpoint=checkpoint)
        tombstones = TombstoneGroups(self._bytes, drops)
        try:
            return await drop_in_phases(
                drops,
                lambda d: self._decide_drop(d, tombstones),
                self._delete_retired,
                concurrency=concurrency,
                decide_concurrency=None if self._bytes.round_trips else LOCAL_DECISIONS_AT_ONCE,
                checkpoint=checkpoint,
                after_decisions=tombstones.release,
            )
        finally:
            await run_blocking(tombstones.release)

    def _decide_drop(self, request: DropRequest, tombstones: TombstoneGroups) -> list[str] | None:
        """Take the retirement decision durably, proposing the request's tombstone; the
        listing it was taken from when it retires the snapshot (empty when an earlier drop
        decided), else `None`."""
        rollout_id, snapshot_id, version = request.rollout_id, request.snapshot_id, request.version
        validate_rollout_id(rollout_id)
        decision = retirement.read_decision(self._bytes, rollout_id)
        listed: list[str] = []
        if decision is None:
            if retirement.frozen_snapshot_id(self._bytes, rollout_id) != snapshot_id:
                return None
            listed = self._bytes.list_prefix(rollout_id)
            if layout.version_of(layout.group_events(rollout_id, listed)) == version:
                decision = retirement.decide(self._bytes, rollout_id, tombstones.proposal(request))
            else:  # changed, or a drop that decided meanwhile is deleting what it listed
                decision, listed = retirement.read_decision(self._bytes, rollout_id), []
                if decision is None:
                    return None
        if not retirement.retires(decision, snapshot_id, version):
            return None
        self._parents.forget(rollout_id)
        return listed

    def _delete_retired(self, request: DropRequest, listed: Sequence[str]) -> bool:
        """Phase two of `drop_many` for one rollout: delete its payloads if its tombstone still
        retires the snapshot. A clear that removed the tombstone while the batch was deciding
        (the id dispatched again) leaves the new rollout's capture alone: False."""
        decision = retirement.read_decision(self._bytes, request.rollout_id)
        if decision is None or not retirement.retires(
            decision, request.snapshot_id, request.version
        ):
            return False
        self._delete_payloads(request.rollout_id, listed)
        return True

    def _delete_payloads(self, rollout_id: str, listed: Sequence[str] = ()) -> None:
        """Delete every event object, then verify by listing; late objects go too.

        `listed` is the listing the decision was taken from: its objects go without listing
        again (a retry or a second drop passes none and lists). FROZEN and RETIRED stay:
        together they are the tombstone that fences late writers. The deletions need no
        fsync: the tombstone is durable, and a payload that reappears after a crash lies
        beneath it (a repeated drop or the sweep removes it).
        """
        keep = (layout.retired_key(rollout_id), layout.frozen_key(rollout_id))
        doomed = [key for key in listed if key not in keep]
        if doomed:
            self._bytes.delete(doomed, durable=False)
        if self._bytes.delete_prefix(rollout_id, keep, durable=False):
            return
        raise CaptureStoreError(
            f"rollout {rollout_id}: retired, but some payloads could not be deleted; "
            "retry the drop (it resumes safely) or check delete permissions"
        )

    def delete(self, rollout_id: str) -> None:
        """Remove a rollout's capture unconditionally, tombstone included, so the id can be reused.

        Used by the dispatch-time clear. Safe to repeat; verified by listing. On local disk the
        store's folders under the id go too, so the next attempt's objects land in a new one,
        which a sweep still holding the old folder (`ByteStore.pinned`) never reaches.
        """
        validate_rollout_id(rollout_id)
        self._parents.forget(rollout_id)
        if self._bytes.delete_folder(rollout_id):
            return
        raise CaptureStoreError(
            f"rollout {rollout_id}: capture could not be deleted completely; retry the "
            "delete (safe to repeat) or check delete permissions"
        )

    def clear_for_dispatch(self, rollout_id: str) -> None:
        """The dispatch-time clear: `delete`, then the attempt marker (`<rollout>/ATTEMPT`).

        The marker is written after the delete returned, so every object a freeze lists
        beside it was written after the clear: the capture holds this attempt's calls only
        (docs/traces.md). It is written in place, create-only (a repeated clear keeps it;
        only its presence is read, so a torn one still proves the clear ran), and no
        retirement decision or version counts it; a drop deletes it with the payloads.
        """
        self.delete(rollout_id)
        marker = encode_json({"cleared_at": time.time()})
        self._bytes.create_in_place(layout.attempt_key(rollout_id), marker)

    def sweep_retired(self, older_than_seconds: float) -> int:
        """Remove tombstones retired more than `older_than_seconds` ago; return how many.

        What is kept and why is `retirement.sweep_tombstones`. A rollout whose tombstone
        cannot be read or removed is logged by name and skipped, so one damaged rollout never
        stops the sweep. Also removes temporary files crashed local writers left.
        """
        now = time.time()
        swept = retirement.sweep_tombstones(self._bytes, older_than_seconds, now)
        self._bytes.remove_stale_temporaries(max(older_than_seconds, 3600.0), now)
        return swept

    def close_now(self) -> None:
        """Synchronous `close`. Safe to repeat."""
        self._bytes.close()
