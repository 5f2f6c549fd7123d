"""Errors raised by the capture store and the byte stores beneath it.

Backend exceptions (botocore, aiohttp, OS) are translated into these in one place.
Each message names the rollout or object involved and what to do next.
This module imports nothing beyond the standard library.
"""

from __future__ import annotations


class CaptureStoreError(Exception):
    """Base class for capture-store failures."""


class StoreUnavailableError(CaptureStoreError, OSError):
    """The storage endpoint could not be reached or refused the request; retrying may help."""


class CaptureFencedError(CaptureStoreError):
    """A write reached a rollout that is already frozen or retired."""


class CaptureRetiredError(CaptureFencedError):
    """The rollout's capture was retired after handoff; it cannot be written or frozen again."""


class CaptureConflictError(CaptureStoreError):
    """A call id was reused with a different payload; the rollout is now incomplete."""


class UnreadableCaptureError(CaptureStoreError):
    """A stored object is not a valid record for this reader (garbage, or a newer schema)."""


class HandoffConflictError(CaptureStoreError):
    """A destination object already exists with other content; it is never overwritten."""


class RetirementFailedError(CaptureStoreError):
    """Some captures of a handed-off batch could not be retired; they are kept, retry later."""


class TransientStoreError(CaptureStoreError):
    """A batch met a storage failure that a retry may fix; nothing of it was handed off."""


def is_transient(exc: BaseException) -> bool:
    """Whether retrying might help: unreachable storage and I/O hiccups, not bad data or access."""
    if isinstance(exc, (StoreUnavailableError, TransientStoreError, ConnectionError, TimeoutError)):
        return True
    permanent = (PermissionError, FileNotFoundError, IsADirectoryError, NotADirectoryError)
    return isinstance(exc, OSError) and not isinstance(exc, permanent)
