"""The byte-store interface beneath the capture store.

Keys are `/`-separated paths relative to the store root, built only from validated segments.
A missing key reads as `None`; backend exceptions are translated into `capture_core.errors`.
Capture and handoff writes are create-only, so concurrent writers never overwrite each other;
`replace` exists for derived reports (ledgers) that are rewritten on every run.
Listing reflects every other client's completed writes (no listing cache).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence


def check_key(key: str) -> str:
    """Refuse a key that could leave the store root; keys are built by us, so this is a guard."""
    parts = key.split("/")
    if "" in parts or "." in parts or ".." in parts:
        raise ValueError(f"store key {key!r} is not a relative path inside the store root")
    return key


class ByteStore(ABC):
    """Create-only object storage with durable writes and uncached listings."""

    url: str

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
        """

    def create_in_place(self, key: str, data: bytes) -> bool:
        """`create`, allowed to write the final name directly (no temporary, no rename).

        Readers may see the object partially written while the write is in flight, and a
        crash may leave it torn. Use it only for objects whose readers tell a torn form from
        a whole one (sealed entries) or never read the content (intents); a torn object is a
        write that never returned. Backends whose create is atomic anyway just create.
        """
        return self.create(key, data)

    @abstractmethod
    def replace(self, key: str, data: bytes) -> None:
        """Durably write `data`, atomically replacing any existing object (reports only)."""

    @abstractmethod
    def exists(self, key: str) -> bool:
        """Whether the object exists."""

    @abstractmethod
    def list_prefix(self, prefix: str) -> list[str]:
        """Every key below `prefix/`, recursively, sorted."""

    @abstractmethod
    def list_children(self, prefix: str) -> list[str]:
        """Names of the immediate children (objects or folders) of `prefix` ('' is the root)."""

    @abstractmethod
    def delete(self, keys: Iterable[str], *, durable: bool = True) -> None:
        """Delete objects; missing ones are fine; any other failure raises. Callers verify by
        listing. `durable=False`: the removals need not survive a crash (a durable tombstone
        already covers the objects), so a local backend may skip the folder fsync."""

    @abstractmethod
    def probe(self, must_exist: bool) -> None:
        """Raise a clear error when the store cannot be used (missing root, bucket, endpoint)."""

    def close(self) -> None:  # noqa: B027 - optional hook; most backends hold nothing
        """Release resources. Safe to repeat."""
