"""How a location string is read: a local path, or a URL with a scheme.

Every module that must tell local from remote, or S3 from other filesystems, asks here,
so the spellings (`/x`, `file:///x`, `local:///x`, `s3://b/p`, `s3a://b/p`) are read one way,
whether two locations overlap is decided here only, and a URL typed with a slash missing
(`s3:/bucket`) or with a protocol nothing knows (`s4://bucket`) is refused here, in one
line, before it could pass for a path or reach a filesystem's own checks.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Mapping

import fsspec

from capture_core.errors import InvalidInputError, OverlappingLocationsError

LOCAL_SCHEMES = ("file://", "local://")
S3_PROTOCOLS = ("s3", "s3a")


def url_scheme(location: str | os.PathLike[str]) -> str | None:
    """The scheme before `://` (`s3`, `memory`, `file`), or `None` for a plain path."""
    text = os.fspath(location)
    return text.split("://", 1)[0] if "://" in text else None


_ONE_SLASH = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):(?!:)(/?)(?!/)(.+)$")


def misspelled_url(location: str | os.PathLike[str]) -> str | None:
    """The URL `location` meant when it is a known protocol's URL missing a slash
    (`s3:/bucket`, `s3:bucket/prefix`, `file:/tmp/x`) or with its scheme in capitals
    (`S3://bucket`: filesystems know only the lower-case name), else `None`.

    A class spec (`module:Class`), a chained URL and anything without a slash after the
    colon are left alone: they are not typos of a URL.
    """
    text = os.fspath(location)
    scheme = url_scheme(text)
    if scheme is not None and "::" not in text and _wrong_case(scheme):
        return f"{scheme.lower()}://{text.split('://', 1)[1]}"
    found = _ONE_SLASH.match(text)
    if found is None:
        return None
    scheme, slash, rest = found.groups()
    if not (slash or "/" in rest) or scheme.lower() not in fsspec.available_protocols():
        return None
    scheme = scheme.lower()
    return f"{scheme}:///{rest}" if f"{scheme}://" in LOCAL_SCHEMES else f"{scheme}://{rest}"


def _wrong_case(scheme: str) -> bool:
    """A known protocol's name typed with capitals (`S3`, `File`)."""
    known = fsspec.available_protocols()
    return scheme != scheme.lower() and scheme not in known and scheme.lower() in known


_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):/")


def unknown_protocol(location: str | os.PathLike[str]) -> str | None:
    """The scheme of a location typed as a URL (`s4://b`, `s4:/b`) that no filesystem here
    knows, else `None`. A chained URL is left to fsspec, which names the link it lacks."""
    text = os.fspath(location)
    found = _SCHEME.match(text)
    if found is None or "::" in text:
        return None
    scheme = found.group(1)
    return None if scheme.lower() in fsspec.available_protocols() else scheme


def location_problem(location: str | os.PathLike[str]) -> str | None:
    """Why a location typed as a URL cannot be read, in one line, else `None`: a known
    protocol missing a slash names the URL it meant; every unknown protocol is told alike."""
    typed = os.fspath(location)
    meant = misspelled_url(location)
    if meant is not None:
        return f"{typed} is neither a URL nor a path tokcap can use: did you mean {meant}?"
    scheme = unknown_protocol(location)
    if scheme is not None:
        return (
            f"{typed} is neither a URL nor a path tokcap can use: no filesystem knows the "
            f"protocol {scheme}://; give a local path or an s3:// URL (s3://bucket/prefix)"
        )
    return None


def refuse_misspelled(location: str | os.PathLike[str]) -> None:
    """Raise `InvalidInputError` for a URL missing a slash, naming the URL it meant, or for a
    protocol no filesystem knows (`location_problem`)."""
    problem = location_problem(location)
    if problem is not None:
        raise InvalidInputError(problem)


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


def place(location: str | os.PathLike[str]) -> tuple[str, str]:
    """Where a location points, as (kind, path): `local` and the real absolute path (`..`,
    symlinks and trailing slashes resolved), `s3` and `bucket/prefix`, or the URL's scheme
    and its normalized path. A chained URL (`simplecache::s3://b/p`) points where its last
    link does: the links before it cache or unpack what that one holds."""
    location = os.fspath(location).rsplit("::", 1)[-1]
    local = local_path(location)
    if local is not None:
        return "local", os.path.realpath(os.path.expanduser(local))
    text = os.fspath(location)
    scheme, _, rest = text.partition("://")
    kind = "s3" if scheme in S3_PROTOCOLS else scheme
    return kind, posixpath.normpath("/" + rest).lstrip("/")


def locations_overlap(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Whether two locations are the same place or one lies inside the other."""
    (kind_a, path_a), (kind_b, path_b) = place(a), place(b)
    if kind_a != kind_b:
        return False
    if path_a == path_b or not path_a or not path_b:
        return True
    return path_a.startswith(path_b.rstrip("/") + "/") or path_b.startswith(
        path_a.rstrip("/") + "/"
    )


def refuse_overlapping(named: Mapping[str, str]) -> None:
    """Raise `OverlappingLocationsError` in one line naming the first two that overlap.

    Captures, finalized runs and inbox files each need their own place: a clear of captures
    or a retirement would otherwise delete a run's parts and receipts, or an inbox pass read
    a run's files as input.
    """
    items = list(named.items())
    for i, (label_a, a) in enumerate(items):
        for label_b, b in items[i + 1 :]:
            if locations_overlap(a, b):
                raise OverlappingLocationsError(
                    f"{label_a} {a} and {label_b} {b} are the same location or one lies "
                    f"inside the other; give {label_a} and {label_b} separate locations "
                    "(a clear or retirement of one would delete the other's files)"
                )
