"""How a location string is read: a local path, or a URL with a scheme.

Every module that must tell local from remote, or S3 from other filesystems, asks here,
so the spellings (`/x`, `file:///x`, `local:///x`, `s3://b/p`, `s3a://b/p`) are read one way.
"""

from __future__ import annotations

import os

LOCAL_SCHEMES = ("file://", "local://")
S3_PROTOCOLS = ("s3", "s3a")


def url_scheme(location: str | os.PathLike[str]) -> str | None:
    """The scheme before `://` (`s3`, `memory`, `file`), or `None` for a plain path."""
    text = os.fspath(location)
    return text.split("://", 1)[0] if "://" in text else None


def is_s3(location: str | os.PathLike[str]) -> bool:
    """Whether a location is an S3 (or S3-compatible) URL."""
    return url_scheme(location) in S3_PROTOCOLS


def local_path(location: str | os.PathLike[str]) -> str | None:
    """The local path a location names (a path, `file://`, `local://`), or `None` if remote."""
    text = os.fspath(location)
    for scheme in LOCAL_SCHEMES:
        if text.startswith(scheme):
            text = text[len(scheme) :]
            break
    return text if "://" not in text and "::" not in text else None
