"""`TokenCaptureStore`: tokcap's capture protocol on any byte store, without a lock service.

One object per event, every write create-only, so racing writers and freezers stay correct.
This module holds the store's construction, identity and freeze; writes are in
`tokcap_writes`, drops, deletes and the sweep in `tokcap_removal`. The key layout is in
`capture_layout`, the entry format in `compact` (stored schema 3), the freeze claim and
retirement decision in `retirement`, reading events back in `capture_entries`; the byte
stores beneath are in `capture_core.storage`.
It is a `CaptureStore` (so a `TokenSink` and a `TokenSource`); NeMo Gym can load it as a sink.
The guarantees are described in docs/store.md.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from capture_core.ids import validate_rollout_id
from capture_core.protocols import TokenCaptureSnapshot
from capture_core.records import TokenEntry
from capture_core.storage import ByteStore, open_byte_store
from capture_core.store import capture_entries, parent_index, retirement
from capture_core.store import capture_layout as layout
from capture_core.store.nemo_gym_store import nemo_gym_store_for
from capture_core.store.tokcap_removal import TokcapRemoval
from capture_core.store.tokcap_writes import TokcapWrites
from capture_core.store.version_source import WeightVersionSource, source_options


class TokenCaptureStore(TokcapWrites, TokcapRemoval):
    """Capture store at `root`: a local path (plain, `file://`, `local://`), `memory://` or S3.

    `storage_options` go to the fsspec filesystem (endpoint, credentials); they are never
    logged or shown in `repr`. `parent_index_bytes` bounds the memory a writer spends finding
    delta parents (docs/store.md, Delta parents). `weight_version_source` (a local path or
    a URL, read with `storage_options` when it is a URL of the root's scheme) is where the
    trainer publishes its current weight version: a put whose entry carries no version
    records it as `end_weight_version` (`version_source`, docs/async.md). Async methods run
    blocking I/O on the process's shared I/O thread pool (`capture_core.storage.io_pool`).
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
            source = args[3] if len(args) > 3 else kwargs.get("weight_version_source")
            found = nemo_gym_store_for(root, weight_version_source=source)
            if found is not None:
                return found
        return super().__new__(cls)

    def __init__(
        self,
        root: str | os.PathLike[str],
        storage_options: Mapping[str, Any] | None = None,
        parent_index_bytes: int = parent_index.DEFAULT_MAX_BYTES,
        weight_version_source: str | os.PathLike[str] | None = None,
    ) -> None:
        self.root = os.fspath(root)
        self.storage_options = dict(storage_options or {})
        self._bytes = open_byte_store(self.root, self.storage_options)
        self._parents = parent_index.ParentIndex(parent_index_bytes)
        if weight_version_source is not None:
            options = source_options(weight_version_source, self.root, self.storage_options)
            self.weight_version_source = WeightVersionSource(weight_version_source, options)

    def __repr__(self) -> str:
        return f"TokenCaptureStore({self.root!r})"

    def __reduce__(
        self,
    ) -> tuple[type[TokenCaptureStore], tuple[str, dict[str, Any], int, str | None]]:
        return (
            TokenCaptureStore,
            (
                self.root,
                self.storage_options,
                self._parents.max_bytes,
                self.weight_version_location,
            ),
        )

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, TokenCaptureStore)
            and self.root == other.root
            and self.storage_options == other.storage_options
            and self.weight_version_location == other.weight_version_location
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

    def holds_capture(self, rollout_id: str) -> bool:
        """Whether the root holds anything of the rollout's capture (`CAPTURE_NAMES`): one
        listing of its folder, for telling a capture store from another folder."""
        return self.capture_state(rollout_id) == layout.CAPTURED

    def capture_state(self, rollout_id: str) -> str:
        """What the rollout's folder shows (`capture_layout.folder_state`): a capture, only a
        dispatch-time clear's attempt marker, or nothing. One listing of its folder."""
        validate_rollout_id(rollout_id)
        return layout.folder_state(self._bytes.list_children(rollout_id))

    def read_entries(self, rollout_id: str) -> list[TokenEntry]:
        """Read a rollout's entries without freezing it (diagnostics; no consistency promise)."""
        validate_rollout_id(rollout_id)
        events = layout.group_events(rollout_id, self._bytes.list_prefix(rollout_id))
        return capture_entries.read_entries(self._bytes, rollout_id, events[layout.ENTRY])[0]

    def close_now(self) -> None:
        """Synchronous `close`. Safe to repeat."""
        self._bytes.close()
