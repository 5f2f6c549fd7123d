"""capture_core: the token-capture domain library (records, store, builder, finalize).

The top level holds the seed API and its vocabulary; the layers are `run`, `builder`,
`store` and `storage` (docs/architecture.md). A trainer can finalize through it directly.
It imports no Prefect, and loads s3fs/botocore only when an S3 URL is opened.
"""

from capture_core.errors import (
    CaptureConflictError,
    CaptureFencedError,
    CaptureRetiredError,
    CaptureStoreError,
    StoreUnavailableError,
    TokcapError,
    UnreadableCaptureError,
)
from capture_core.protocols import TokenCaptureSnapshot, TokenSink, TokenSource
from capture_core.records import TOKEN_ENTRY_RECORD_SCHEMA_VERSION, TokenEntry
from capture_core.store import CaptureStore, TokenCaptureStore, open_capture_store

__all__ = [
    "TOKEN_ENTRY_RECORD_SCHEMA_VERSION",
    "CaptureConflictError",
    "CaptureFencedError",
    "CaptureRetiredError",
    "CaptureStore",
    "CaptureStoreError",
    "StoreUnavailableError",
    "TokcapError",
    "TokenCaptureSnapshot",
    "TokenCaptureStore",
    "TokenEntry",
    "TokenSink",
    "TokenSource",
    "UnreadableCaptureError",
    "open_capture_store",
]
