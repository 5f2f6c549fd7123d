"""Removing captures in tokcap's layout: retiring snapshots, deleting, clearing, sweeping.

`TokcapRemoval` is the removal half of `TokenCaptureStore`. A drop retires exactly the
consumed snapshot and leaves a tombstone (`FROZEN` and `RETIRED`, decided in `retirement`);
a batch is retired in two phases, every decision durable before any deletion (`base`,
`drop_in_phases`). `delete` removes a capture unconditionally, the dispatch-time clear adds
the attempt marker, and the sweep removes old tombstones. This module imports no Prefect.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from capture_core.errors import CaptureStoreError
from capture_core.ids import validate_rollout_id
from capture_core.protocols import DropCheckpoint, DropRequest, DropResults
from capture_core.storage import ByteStore
from capture_core.storage.io_pool import run_blocking
from capture_core.store import capture_layout as layout
from capture_core.store import parent_index, retirement
from capture_core.store.base import CaptureStore, drop_in_phases
from capture_core.store.retirement import TombstoneGroups
from capture_core.store.stored_json import encode_json

# Decisions taken at once on a byte store without round trips (local disk): each is some
# interpreter work and one folder fsync, and more threads only contend (docs/perf.md).
LOCAL_DECISIONS_AT_ONCE = 2


class TokcapRemoval(CaptureStore):
    """Drops, deletes, the dispatch-time clear and the sweep of `TokenCaptureStore`."""

    _bytes: ByteStore
    _parents: parent_index.ParentIndex

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
        moved = None if listed is None else self._delete_payloads(request, listed)
        self._bytes.remove_moved(moved or [])
        return moved is not None

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
        if own != (TokcapRemoval.drop_now, CaptureStore.drop):
            return await super().drop_many(drops, concurrency=concurrency, checkpoint=checkpoint)
        tombstones = TombstoneGroups(self._bytes, drops)
        moved: list[str] = []
        try:
            return await drop_in_phases(
                drops,
                lambda d: self._decide_drop(d, tombstones),
                lambda d, listed: self._delete_retired(d, listed, moved),
                concurrency=concurrency,
                decide_concurrency=None if self._bytes.round_trips else LOCAL_DECISIONS_AT_ONCE,
                checkpoint=checkpoint,
                after_decisions=tombstones.release,
            )
        finally:
            await run_blocking(tombstones.release)
            self._bytes.remove_moved(moved)

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

    def _delete_retired(
        self, request: DropRequest, listed: Sequence[str], moved: list[str]
    ) -> bool:
        """Phase two of `drop_many` for one rollout: delete its payloads if its tombstone still
        retires the snapshot, adding what was moved aside to `moved` (removed once the batch
        is done). A clear that removed the tombstone while the batch was deciding (the id
        dispatched again) leaves the new rollout's capture alone: False."""
        taken = self._delete_payloads(request, listed)
        if taken is None:
            return False
        moved.extend(taken)
        return True

    def _delete_payloads(
        self, request: DropRequest, listed: Sequence[str] = ()
    ) -> list[str] | None:
        """Take every event object out of the capture if its tombstone retires the request's
        snapshot, then verify by listing; late objects go too. Return what was moved aside,
        for `ByteStore.remove_moved`, or `None` when the tombstone is gone (a clear: the id
        was dispatched again) or names another snapshot, deleting nothing.

        The tombstone is read, and everything deleted, through the rollout's folder pinned
        (`ByteStore.pinned`): on local disk a clear landing meanwhile removes that folder
        and the next attempt writes into a new one, which this never reaches. On local disk
        each event folder (`e/`, `i/`, `x/`) is moved into the store's temporaries with one
        rename, so the unlinks of its objects run off the retirement's path (each freed file
        can cost a synchronous discard); elsewhere, or for what could not be moved, `listed`
        (the listing the decision was taken from) is deleted without listing again.
        FROZEN and RETIRED stay: together they are the tombstone that fences late writers.
        No step needs an fsync: the tombstone is durable, and a payload that reappears after
        a crash lies beneath it (a repeated drop or the sweep removes it).
        """
        rollout_id = request.rollout_id
        keep = (layout.retired_key(rollout_id), layout.frozen_key(rollout_id))
        with self._bytes.pinned(rollout_id) as view:
            data = view.get(layout.retired_key(rollout_id))
            decision = None if data is None else retirement.parse_decision(rollout_id, data)
            if decision is None or not retirement.retires(
                decision, request.snapshot_id, request.version
            ):
                return None
            moved = view.move_aside(rollout_id, layout.EVENT_KINDS)
            doomed = [] if moved else [key for key in listed if key not in keep]
            for _attempt in range(4):
                if doomed:
                    view.delete_each(doomed, durable=False)
                doomed = [key for key in view.list_prefix(rollout_id) if key not in keep]
                if not doomed:
                    return moved
        self._bytes.remove_moved(moved)
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
