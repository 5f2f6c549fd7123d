"""Which capture store a run reads: open it from its location or class, name it, clear it.

A store is a path or URL (`store.open_capture_store`) or a `module.path:ClassName` class.
Its identity digest keys results recorded against one store, such as a retirement.
`SourceSpec` names one store as the tasks receive it.
This module does not import Prefect.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict

from capture_core.errors import InvalidInputError
from capture_core.protocols import TokenSource, load_capture_class
from capture_core.run.crash_points import crash_point
from capture_core.storage import local_path, open_byte_store, refuse_overlapping
from capture_core.store import CaptureStore, open_capture_store


def open_source(
    store: str,
    storage_options: Mapping[str, Any] | None = None,
    source_kwargs: Mapping[str, Any] | None = None,
) -> TokenSource:
    """The capture store at a path or URL, or a `module.path:ClassName` source class."""
    if is_class_spec(store):
        return load_capture_class(store, source_kwargs, TokenSource)
    return open_capture_store(store, storage_options)


def check_source(
    store: str,
    storage_options: Mapping[str, Any] | None = None,
    source_kwargs: Mapping[str, Any] | None = None,
) -> None:
    """Fail now when the capture store cannot be used: an unknown scheme, a class that does
    not import or build, a missing root or bucket, an unreachable endpoint."""
    source = open_source(store, storage_options, source_kwargs)
    if isinstance(source, CaptureStore):
        source.probe(must_exist=True)
    elif not is_class_spec(store):
        raise InvalidInputError(f"store {store!r} is neither a location nor a source class")


def check_destination(dest: str, storage_options: Mapping[str, Any] | None = None) -> None:
    """Fail now when the destination cannot be used: an unknown scheme, a missing bucket, an
    unreachable endpoint. A missing local directory is created by the first write."""
    open_byte_store(dest, storage_options).probe(must_exist=False)


class SourceSpec(BaseModel):
    """What names one capture store: its location or class, the storage options that open a
    location, the arguments that build a class. A flow builds it once and hands it to each
    task that opens the store, so every task opens, and keys results against, the same one.
    """

    model_config = ConfigDict(frozen=True)

    store: str
    storage_options: dict[str, Any] | None = None
    source_kwargs: dict[str, Any] | None = None

    def open(self) -> TokenSource:
        return open_source(self.store, self.storage_options, self.source_kwargs)

    def identity(self) -> str:
        """`store_identity` of this store."""
        return store_identity(self.store, self.storage_options, self.source_kwargs)


def check_separate_locations(named: Mapping[str, str | None]) -> None:
    """Refuse a store, destination or inbox that overlaps another (`refuse_overlapping`).

    A `module.path:ClassName` store names no location, so it is left out, as is an unset one.
    """
    refuse_overlapping(
        {label: value for label, value in named.items() if value and not is_class_spec(value)}
    )


def clear_captures(source: Any, rollout_ids: list[str], name: str = "") -> int:
    """Delete each rollout's capture, tombstone included; safe to repeat. Returns the count.

    This is the one dispatch-time clear: the seed API and the clear task both call it. A
    capture store also marks each rollout's next attempt (`CaptureStore.clear_for_dispatch`),
    which is what lets `all_traces` trust several traces (docs/traces.md); another source
    is cleared with its `delete`.
    """
    clear = getattr(source, "clear_for_dispatch", None) or getattr(source, "delete", None)
    if clear is None:
        raise InvalidInputError(
            f"source {name or type(source).__name__} has no delete(rollout_id); it cannot "
            "clear captures"
        )
    for rollout_id in rollout_ids:
        clear(rollout_id)
        crash_point("mid-clear")
    return len(rollout_ids)


def store_identity(
    store: str,
    storage_options: Mapping[str, Any] | None = None,
    source_kwargs: Mapping[str, Any] | None = None,
) -> str:
    """A digest of what names a capture store: location or class, endpoint, source arguments.

    Results recorded against one store (a retirement) are never reused for another, and
    spellings of one location (`/x/`, `file:///x`, `s3://b/p/`) are one store, so a retire
    through another spelling reports the earlier work instead of claiming it again.
    """
    named = [canonical_location(store), dict(storage_options or {}), dict(source_kwargs or {})]
    encoded = orjson.dumps(named, option=orjson.OPT_SORT_KEYS, default=str)
    return hashlib.sha256(encoded).hexdigest()[:16]


def canonical_location(store: str) -> str:
    """One spelling per location: a normalized local path, or a URL without trailing slashes."""
    if is_class_spec(store):
        return store
    path = local_path(store)
    if path is not None:
        return os.path.normpath(path)
    return store.rstrip("/")


def is_class_spec(store: str) -> bool:
    """Whether `store` names a class (`pkg.module:Class`) rather than a location."""
    module, sep, name = store.partition(":")
    return (
        bool(sep)
        and "/" not in store
        and module.replace(".", "").replace("_", "").isalnum()
        and name.isidentifier()
    )
