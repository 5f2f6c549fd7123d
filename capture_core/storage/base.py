"""The byte-store interface beneath the capture store; every backend follows it.

Keys are `/`-separated paths relative to the store root, built only from validated segments.
A missing key reads as `None`; backend exceptions are translated into `capture_core.errors`.
Capture and handoff writes are create-only, so concurrent writers never overwrite each other;
`replace` exists for derived reports (ledgers) that are rewritten on every run.
Listing reflects every other client's completed writes (no listing cache).

Two rules hold on every backend (the contract suite checks both):
- An empty create is refused with `ValueError`: an empty object cannot be told from a torn
  one, and some backends cannot create an empty object exclusively.
- A name starting with `.` is reserved for the backend's own bookkeeping (the local
  backend's `.tmp/`) and for files other tools leave (`.nfs*`, `.DS_Store`): a key with
  such a segment is refused, and listings never show one.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from capture_core.errors import CaptureStoreError, InvalidInputError, error_text, is_transient


def check_key(key: str) -> str:
    """Refuse a key that could leave the store root or names a reserved (dot) name.

    Keys are built by us from validated segments, so this is a guard. It runs on every
    store call, so the common case is decided by a few substring tests: a key has an empty
    segment exactly when it is empty, starts or ends with `/` or holds `//`, and a segment
    starting with `.` exactly when it starts with `.` or holds `/.`.
    """
    if (
        key
        and not key.startswith(("/", "."))
        and not key.endswith("/")
        and "//" not in key
        and "/." not in key
    ):
        return key
    parts = key.split("/")
    if "" in parts or "." in parts or ".." in parts:
        raise InvalidInputError(f"store key {key!r} is not a relative path inside the store root")
    if any(is_reserved(part) for part in parts):
        raise InvalidInputError(
            f"store key {key!r} has a segment starting with '.'; such names are reserved for "
            "the backend's own files and are never listed"
        )
    return key


def check_new_object(key: str, data: bytes) -> str:
    """Refuse a create that no backend can make exclusive and durable: an empty object."""
    if not data:
        raise InvalidInputError(
            f"refusing to create empty object {key}: an empty object cannot be told from a "
            "torn one, and empty creates are not exclusive on every backend"
        )
    return check_key(key)


def is_reserved(name: str) -> bool:
    """Whether a name is reserved (starts with `.`): never written, never listed."""
    return name.startswith(".")


@dataclass(frozen=True)
class StagedObject:
    """Bytes prepared once for several exclusive creates (`ByteStore.staged`).

    `path` is the local backend's durable temporary copy of `data`; elsewhere `None`.
    """

    data: bytes
    path: str | None = None


class FolderView(Protocol):
    """What `ByteStore.pinned` yields: reads, listings, deletes and moves below one folder."""

    def get(self, key: str) -> bytes | None: ...

    def list_prefix(self, prefix: str) -> list[str]: ...

    def delete_each(self, keys: Iterable[str], *, durable: bool = True) -> dict[str, str]: ...

    def move_aside(self, prefix: str, names: Sequence[str]) -> list[str]: ...


class ByteStore(ABC):
    """Create-only object storage with durable writes and uncached listings."""

    url: str
    shares_staged: bool = False
    """Whether `create_staged` shares one write between keys (worth grouping creates for)."""
    round_trips: bool = True
    """Whether each operation waits on a network round trip, so overlapping many hides it.
    False where operations are local syscalls: more at once only contend for the CPU."""

    @abstractmethod
    def get(self, key: str) -> bytes | None:
        """Return the object's bytes, or `None` when it does not exist."""

    def get_many(self, keys: Sequence[str]) -> dict[str, bytes | None]:
        """Return several objects; backends with latency override this to read concurrently."""
        return {key: self.get(key) for key in keys}

    def iter_many(self, keys: Sequence[str], chunk: int = 64) -> Iterator[tuple[str, bytes | None]]:
        """Yield `(key, bytes)` in order, holding at most `chunk` objects in memory at once."""
        for start in range(0, len(keys), chunk):
            yield from self.get_many(keys[start : start + chunk]).items()

    @abstractmethod
    def create(self, key: str, data: bytes) -> bool:
        """Durably write `data` if `key` is absent. Return `False`, writing nothing, if present.

        A `False` may also mean our own earlier attempt landed; callers compare bytes.
        Empty `data` raises `ValueError` (see `check_new_object`).
        """

    @contextlib.contextmanager
    def staged(self, data: bytes) -> Iterator[StagedObject]:
        """Prepare `data` once for several `create_staged` calls; released on exit.

        Empty `data` raises `ValueError` here, before any create (see `check_new_object`).
        """
        check_new_object("a staged object", data)
        yield StagedObject(data)

    def create_staged(self, key: str, staged: StagedObject) -> bool:
        """`create(key, staged.data)`, sharing the preparation between keys.

        Every key gets the same bytes, each create exclusive and durable on its own; the
        local backend links one durable file instead of writing and syncing each copy.
        """
        return self.create(key, staged.data)

    def create_in_place(self, key: str, data: bytes) -> bool:
        """`create`, allowed to write the final name directly (no temporary, no rename).

        Readers may see the object partially written while the write is in flight, and a
        crash may leave it torn. Use it only for objects whose readers tell a torn form from
        a whole one (sealed entries) or never read the content (intents); a torn object is a
        write that never returned. Backends whose create is atomic anyway just create.
        """
        return self.create(key, data)

    @contextlib.contextmanager
    def pinned(self, prefix: str) -> Iterator[FolderView]:
        """Reads, listings and deletes of keys below `prefix`, held to the folder it is now.

        Through the view they reach that folder even after it was removed and made again
        under the same name, so a pass that paused between judging a rollout's objects and
        deleting them deletes none of a newer rollout's (the tombstone sweep). Object stores
        have no folders to hold: there the view is the store itself, and the pause stays open.
        """
        yield self

    @abstractmethod
    def replace(self, key: str, data: bytes) -> None:
        """Durably write `data`, atomically replacing any existing object (reports only)."""

    @abstractmethod
    def exists(self, key: str) -> bool:
        """Whether the object exists."""

    @abstractmethod
    def list_prefix(self, prefix: str) -> list[str]:
        """Every key below `prefix/`, recursively, sorted; reserved (dot) names left out."""

    @abstractmethod
    def list_children(self, prefix: str) -> list[str]:
        """Names of the immediate children (objects or folders) of `prefix` ('' is the root),
        sorted, reserved (dot) names left out."""

    @abstractmethod
    def delete(self, keys: Iterable[str], *, durable: bool = True) -> None:
        """Delete objects; missing ones are fine; any other failure raises. Callers verify by
        listing. `durable=False`: the removals need not survive a crash (a durable tombstone
        already covers the objects), so a local backend may skip the folder fsync."""

    def delete_each(self, keys: Iterable[str], *, durable: bool = True) -> dict[str, str]:
        """Delete objects like `delete`, but return each key that could not be deleted, with
        why, instead of raising; callers deleting many independent things (the tombstone
        sweep) keep what did go. A store that cannot be reached still raises. Backends with
        batch deletes override this."""
        failed: dict[str, str] = {}
        for key in keys:
            try:
                self.delete([key], durable=durable)
            except (OSError, CaptureStoreError) as exc:
                if is_transient(exc):
                    raise
                failed[key] = error_text(exc)
        return failed

    @abstractmethod
    def probe(self, must_exist: bool) -> None:
        """Raise a clear error when the store cannot be used (missing root, bucket, endpoint)."""

    def delete_prefix(self, prefix: str, keep: Iterable[str] = (), *, durable: bool = True) -> bool:
        """Delete every key below `prefix` but `keep`, verified by listing; late keys go too.

        Return whether nothing but `keep` is left after a few rounds (a writer racing the
        delete can keep adding keys; the caller says what to do then).
        """
        kept = set(keep)
        for _attempt in range(3):
            doomed = [key for key in self.list_prefix(prefix) if key not in kept]
            if not doomed:
                return True
            self.delete(doomed, durable=durable)
        return False

    def delete_folder(self, prefix: str) -> bool:
        """`delete_prefix(prefix)`, after which the store leaves no folder of its own under that
        name, so what is written under `prefix` next lands in a new one: a pass still holding
        the old folder (`pinned`) never reaches it. Object stores have no folders: the prefix
        is deleted."""
        return self.delete_prefix(prefix)

    def move_aside(self, prefix: str, names: Sequence[str]) -> list[str]:
        """Move the folders `<prefix>/<name>` out of the store's keys, one atomic step each, for
        `remove_moved` to delete off the caller's path; return what was moved. What is not
        moved stays where it was, for the caller to delete. Object stores have no folders to
        rename: nothing is moved."""
        return []

    def remove_moved(self, moved: Sequence[str]) -> None:  # noqa: B027 - nothing moved here
        """Delete what `move_aside` moved, in the background; a process killed first leaves it
        to `remove_stale_temporaries`."""

    def remove_stale_temporaries(self, older_than_seconds: float, now: float) -> int:
        """Delete temporaries crashed writers left, older than `older_than_seconds`; return how
        many. Backends whose writes leave no temporaries have none to remove."""
        return 0

    def close(self) -> None:  # noqa: B027 - optional hook; most backends hold nothing
        """Release resources. Safe to repeat."""
