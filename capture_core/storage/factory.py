"""The one place a location becomes a byte store."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from capture_core.errors import InvalidInputError
from capture_core.storage.base import ByteStore
from capture_core.storage.local import LocalStore
from capture_core.storage.locations import local_path, refuse_misspelled
from capture_core.storage.remote import FsspecStore


def open_byte_store(
    url: str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None
) -> ByteStore:
    """Open the byte store for a URL. Every local form (a path, `file://`, `local://`) is local.

    Only the local backend owns durability and exclusive creates on a local disk; other
    fsspec filesystems must create atomically themselves or are refused (`FsspecStore`).
    A URL missing a slash (`s3:/bucket`) is refused, naming the URL it meant.
    """
    refuse_misspelled(url)
    text = local_path(url)
    if text is not None:
        if not os.path.isabs(text):
            raise InvalidInputError(
                f"store location {text!r} is relative; use an absolute path or a URL such as "
                "s3://bucket/prefix"
            )
        return LocalStore(text)
    return FsspecStore(os.fspath(url), storage_options)
