"""capture_core: the token-capture domain library (records, store, builder, finalize).

It is usable without Prefect: a trainer can finalize through it directly.
It imports no Prefect, and loads s3fs/botocore only when an S3 URL is opened.
"""

from capture_core.errors import (
    CaptureConflictError,
    CaptureFencedError,
    CaptureRetiredError,
    CaptureStoreError,
    StoreUnavailableError,
    UnreadableCaptureError,
)
from capture_core.protocols import TokenCaptureSnapshot, TokenSink, TokenSource
from capture_core.records import TOKEN_ENTRY_RECORD_SCHEMA_VERSION, TokenEntry
from capture_core.store import TokenCaptureStore

__all__ = [
    "TOKEN_ENTRY_RECORD_SCHEMA_VERSION",
    "CaptureConflictError",
    "CaptureFencedError",
    "CaptureRetiredError",
    "CaptureStoreError",
    "StoreUnavailableError",
    "TokenCaptureSnapshot",
    "TokenCaptureStore",
    "TokenEntry",
    "TokenSink",
    "TokenSource",
    "UnreadableCaptureError",
]
