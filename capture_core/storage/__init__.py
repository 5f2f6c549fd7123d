"""Byte storage beneath the capture store and the run destination: one interface, two backends.

`ByteStore` (base) is the contract; `LocalStore` (local) implements it on a POSIX disk and
`FsspecStore` (remote) on S3 and `memory://`. `open_byte_store` maps a location to its
backend, `locations` reads location strings for every other module, and `endpoints` says
which S3 endpoint did not answer. `io_pool` is the
process's one thread pool for blocking store I/O awaited from async code. Other modules
import from this package (and `io_pool`) only; docs/store.md describes the contract.
"""

from capture_core.storage.base import (
    ByteStore,
    FolderView,
    StagedObject,
    check_key,
    check_new_object,
    is_reserved,
)
from capture_core.storage.endpoints import is_connection_error, unreachable_message
from capture_core.storage.factory import open_byte_store
from capture_core.storage.local import TMP_DIR, LocalStore, fsync_dir
from capture_core.storage.locations import (
    LOCAL_SCHEMES,
    S3_PROTOCOLS,
    is_s3,
    local_path,
    location_problem,
    locations_overlap,
    misspelled_url,
    place,
    refuse_overlapping,
    url_scheme,
)
from capture_core.storage.options import S3_CLIENT_RETRIES, S3_DEFAULTS, s3_options
from capture_core.storage.remote import (
    ATOMIC_CREATE_PROTOCOLS,
    S3_DELETE_BATCH,
    FsspecStore,
    filesystem_for,
)

__all__ = [
    "ATOMIC_CREATE_PROTOCOLS",
    "LOCAL_SCHEMES",
    "S3_CLIENT_RETRIES",
    "S3_DEFAULTS",
    "S3_DELETE_BATCH",
    "S3_PROTOCOLS",
    "TMP_DIR",
    "ByteStore",
    "FolderView",
    "FsspecStore",
    "LocalStore",
    "StagedObject",
    "check_key",
    "check_new_object",
    "filesystem_for",
    "fsync_dir",
    "is_connection_error",
    "is_reserved",
    "is_s3",
    "local_path",
    "location_problem",
    "locations_overlap",
    "misspelled_url",
    "open_byte_store",
    "place",
    "refuse_overlapping",
    "s3_options",
    "unreachable_message",
    "url_scheme",
]
