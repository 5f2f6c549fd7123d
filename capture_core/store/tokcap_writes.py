"""Writing a rollout's events in tokcap's layout: puts, intents, loss markers, the fence.

`TokcapWrites` is the write half of `TokenCaptureStore`. A put is checked, encoded as a
delta against its longest stored parent (`compact`, `parent_index`) and created once; a
byte-identical repeat is a no-op, another payload reports the call lost. Intents and loss
markers are create-only objects too. `FROZEN` (the freeze claim) fences every write; a loss
reported after it races retirement (`retirement`). This module imports no Prefect.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

from capture_core.errors import (
    CaptureConflictError,
    CaptureFencedError,
    CaptureRetiredError,
    CaptureStoreError,
    InvalidRecordError,
)
from capture_core.ids import validate_rollout_id
from capture_core.records import TokenEntry
from capture_core.storage import ByteStore
from capture_core.store import capture_entries, compact, parent_index, retirement
from capture_core.store import capture_layout as layout
from capture_core.store.base import CaptureStore
from capture_core.store.capture_layout import call_key
from capture_core.store.stored_json import encode_json

SETTLE_SECONDS = 5.0


class TokcapWrites(CaptureStore):
    """Puts, intents and loss reports of `TokenCaptureStore`, on its byte store and its
    index of delta parents."""

    _bytes: ByteStore
    _parents: parent_index.ParentIndex

    def put_now(self, entry: Any) -> None:
        """Record one call durably; when this returns every client of the root sees it.

        A byte-identical repeat is a no-op, also after freeze. A different payload for the
        same call id raises `CaptureConflictError` and marks the rollout incomplete.
        A put after freeze raises `CaptureFencedError`. One whose entry landed while the
        rollout was being frozen raises too: the entry is stored, and a snapshot listed
        before it landed can no longer be retired, because the entry changed its version.
        """
        record, prompt_ids, stamped = self.storable(entry)
        rollout_id = validate_rollout_id(record.rollout_id)
        name = call_key(record.model_call_id)
        key = layout.entry_key(rollout_id, name)
        try:
            encoded = self._encode(rollout_id, compact.Draft(record, name, prompt_ids))
        except (TypeError, ValueError, OverflowError) as exc:  # checked, yet not encodable
            raise self.refused(record, InvalidRecordError(f"cannot be encoded: {exc}")) from exc
        self._judge(rollout_id, key, name, record, encoded.data)
        if self._fence(rollout_id):
            existing = self._settled(key)
            if existing is not None and compact.same_call(existing, encoded.identity, stamped):
                return
            raise CaptureFencedError(
                f"rollout {rollout_id} is already frozen or retired; call "
                f"{record.model_call_id!r} arrived too late and was not recorded"
            )
        existing = self._create_entry(rollout_id, record.model_call_id, name, encoded)
        if existing is None:
            return
        if compact.same_call(existing, encoded.identity, stamped):
            self._parents.remember(rollout_id, name, encoded.known)
            return
        self._refuse_conflict(rollout_id, record.model_call_id, existing)

    def _judge(self, rollout_id: str, key: str, name: str, record: TokenEntry, data: bytes) -> None:
        """Refuse, storing nothing, bytes a freeze would not read: the put passes the exact
        bytes it is about to store, after mapping and stamping, through the reader's own
        judgement (`capture_entries.read_entry`), so an accepted put never reads back as an
        unreadable capture."""
        stored = capture_entries.parse_stored_entry(rollout_id, key, name, data)
        if stored.prompt is None:  # a delta: its prefix is the parent's, the digest binds it
            stored.prompt = record.prompt_token_ids
        try:
            capture_entries.read_entry(stored)
        except InvalidRecordError as exc:
            raise self.unreadable(record, exc) from exc

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
