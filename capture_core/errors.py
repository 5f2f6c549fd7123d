"""Every error capture_core raises, under one root; each message names the thing and what to do.

Backend exceptions (botocore, aiohttp, OS) are translated into these in one place (storage).
A second base (`OSError`, `ValueError`, `RuntimeError`) keeps older `except` clauses working.
This module imports nothing beyond the standard library.

    TokcapError
    ├── CaptureStoreError                 a capture or byte store failed
    │   ├── StoreUnavailableError         (OSError) endpoint unreachable or refusing; retry
    │   ├── CaptureFencedError            a write reached a frozen or retired rollout
    │   │   └── CaptureRetiredError       the capture was retired after handoff
    │   ├── CaptureConflictError          a call id reused with another payload
    │   ├── UnreadableCaptureError        a stored object is not a valid record
    │   ├── MixedLayoutError              (ValueError) NeMo Gym's and tokcap's layout in one dir
    │   ├── HandoffConflictError          a destination object exists with other content
    │   ├── UnreadableReceiptError        a receipt exists but cannot be read
    │   ├── PartMismatchError             a handed-off part no longer matches its receipt
    │   ├── RetirementFailedError         some captures of a handed-off batch were not retired
    │   └── TransientStoreError           a batch met a storage failure a retry may fix
    ├── OverlappingLocationsError         (ValueError) two locations that must be apart overlap
    ├── RunIdInUseError                   (ValueError) the run id holds another input
    ├── UnreadableManifestError           (ValueError) a run's manifest is torn or edited
    └── ClaimLostError                    (RuntimeError) a pass lost its claim on a run
"""

from __future__ import annotations


class TokcapError(Exception):
    """The root of every error capture_core raises."""


class CaptureStoreError(TokcapError):
    """Base class for capture-store and byte-store failures."""


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


class MixedLayoutError(CaptureStoreError, ValueError):
    """A capture directory holds both NeMo Gym's file-store files and tokcap's own layout."""


class HandoffConflictError(CaptureStoreError):
    """A destination object already exists with other content; it is never overwritten."""


class UnreadableReceiptError(CaptureStoreError):
    """A receipt object exists but cannot be read; it is never taken for a missing receipt."""


class PartMismatchError(CaptureStoreError):
    """A handed-off part no longer matches its receipt; no capture of its batch is retired."""


class RetirementFailedError(CaptureStoreError):
    """Some captures of a handed-off batch could not be retired; they are kept, retry later."""


class TransientStoreError(CaptureStoreError):
    """A batch met a storage failure that a retry may fix; nothing of it was handed off."""


class OverlappingLocationsError(TokcapError, ValueError):
    """Two locations that must be separate are the same place, or one lies inside the other."""


class RunIdInUseError(TokcapError, ValueError):
    """The run id already holds another input or other settings; nothing of this run ran."""


class UnreadableManifestError(TokcapError, ValueError):
    """A run's manifest exists but is not one (torn or edited): its input cannot be told."""


class ClaimLostError(TokcapError, RuntimeError):
    """A pass no longer holds its claim on a run; it stops before writing anything more there."""


def is_transient(exc: BaseException) -> bool:
    """Whether retrying might help: unreachable storage and I/O hiccups, not bad data or access."""
    if isinstance(exc, (StoreUnavailableError, TransientStoreError, ConnectionError, TimeoutError)):
        return True
    permanent = (PermissionError, FileNotFoundError, IsADirectoryError, NotADirectoryError)
    return isinstance(exc, OSError) and not isinstance(exc, permanent)
