"""The trainer's current weight version, read from a small file or URL, stamped on puts.

A trainer publishes its version (one non-negative integer, as text) after each weight update.
A store given such a source (`weight_version_source`) records it as `end_weight_version` on
every put whose entry carries no weight version: the weights loaded when the call was stored.
A local file is read again only when its stat changes; a URL at most once per second.
Content that is missing, unreadable or not a non-negative integer refuses the put by name:
a version is never guessed. What the stamp means and does not mean is in docs/async.md.
This module imports only `errors`, `records` and `storage`.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from typing import Any

from capture_core.errors import InvalidInputError, InvalidRecordError
from capture_core.records import TokenEntry
from capture_core.records.provenance import MAX_WEIGHT_VERSION, RUNS_KEY, VERSION_FIELDS
from capture_core.storage import filesystem_for, local_path, url_scheme

STAMPED_FIELD = "end_weight_version"
"""The field a stamp sets: the weights loaded when the call was stored."""
URL_REFRESH_SECONDS = 1.0
"""A URL source is fetched at most once per this many seconds per store object."""
_MAX_BYTES = 64
"""A version file holds one integer: anything longer is not one (and is not read whole)."""
SINK_UNSET = "remove weight_version_source from the sink's settings"
"""How a sink goes without a version source, for the message naming an unreadable one."""


class WeightVersionSource:
    """The current version at `location`: a local path (plain or `file://`) or an fsspec URL
    (`s3://`, `http(s)://`); `storage_options` go to the URL's filesystem. Thread-safe.
    `unset` says how its user goes without a source (a sink setting, a gateway option)."""

    def __init__(
        self,
        location: str | os.PathLike[str],
        storage_options: Mapping[str, Any] | None = None,
        unset: str = SINK_UNSET,
    ) -> None:
        self.location, self._unset = os.fspath(location), unset
        self._path = local_path(self.location)
        if self._path is not None and not os.path.isabs(self._path):
            raise InvalidInputError(
                f"weight_version_source {self.location!r} is a relative path, which each "
                "writer process would read from its own working folder; give an absolute path"
            )
        self._options = dict(storage_options or {})
        self._lock = threading.Lock()
        self._seen: Any = None  # the stat key, or the monotonic time, of the cached read
        self._version: int | None = None

    def __repr__(self) -> str:
        return f"WeightVersionSource({self.location!r})"

    def current(self) -> int:
        """The version the source holds now. Raises `InvalidRecordError` naming the source
        when it cannot be read or does not hold a non-negative integer."""
        with self._lock:
            if self._path is not None:
                return self._read_file(self._path)
            return self._read_url()

    def stamp(self, entry: TokenEntry) -> TokenEntry:
        """`entry` with the current version as its `end_weight_version` when it carries no
        version (no start, end or per-token versions); else `entry` as it is."""
        if any(getattr(entry, name) is not None for name in (*VERSION_FIELDS, RUNS_KEY)):
            return entry
        try:
            version = self.current()
        except InvalidRecordError as exc:
            raise InvalidRecordError(
                f"call {entry.model_call_id!r}: end_weight_version cannot be stamped: {exc}"
            ) from exc
        return entry.model_copy(update={STAMPED_FIELD: version})

    def _read_file(self, path: str) -> int:
        try:
            info = os.stat(path)
            key = (info.st_mtime_ns, info.st_size, info.st_ino)
            if key == self._seen and self._version is not None:
                return self._version
            with open(path, "rb") as handle:
                data = handle.read(_MAX_BYTES + 1)
        except OSError as exc:
            raise self._unreadable(exc) from exc
        return self._keep(key, self._parse(data))

    def _read_url(self) -> int:
        now = time.monotonic()
        if self._version is not None and now - self._seen < URL_REFRESH_SECONDS:
            return self._version
        try:
            fs, path = filesystem_for(self.location, self._options)
            data = fs.cat_file(path, start=0, end=_MAX_BYTES + 1)
        except Exception as exc:  # any backend's failure: the source cannot be read
            raise self._unreadable(exc) from exc
        return self._keep(now, self._parse(data))

    def _keep(self, seen: Any, version: int) -> int:
        self._seen, self._version = seen, version
        return version

    def _parse(self, data: bytes) -> int:
        text = data.strip()
        if len(data) > _MAX_BYTES or not text.isdigit() or int(text) > MAX_WEIGHT_VERSION:
            shown = data[:_MAX_BYTES].decode("utf-8", "replace")
            raise InvalidRecordError(
                f"the weight version source {self.location} holds {shown!r}, not a weight "
                "version; the trainer must write its current version there as one integer from "
                f"0 to {MAX_WEIGHT_VERSION} (replace the file atomically: write a temporary "
                "file, then rename it)"
            )
        return int(text)

    def _unreadable(self, exc: BaseException) -> InvalidRecordError:
        return InvalidRecordError(
            f"the weight version source {self.location} cannot be read "
            f"({type(exc).__name__}: {exc}); make it readable, or {self._unset} to store "
            "calls without a version"
        )


def source_options(
    source: str | os.PathLike[str], root: str, storage_options: Mapping[str, Any]
) -> dict[str, Any]:
    """The storage options a source URL is read with: the store's when both are URLs of one
    scheme (a version object beside an S3 store), else none."""
    scheme = url_scheme(source)
    return dict(storage_options) if scheme is not None and scheme == url_scheme(root) else {}
