"""Every error capture_core raises, under one root; each message names the thing and what to do.

Backend exceptions (botocore, aiohttp, OS) are translated into these in one place (storage).
A second base (the builtin raised before: `ValueError`, `OSError`...) keeps every older `except`
clause working, and `error_text` names an error by it in recorded results. No capture_core
module raises a builtin exception class directly (tests/test_layering.py checks it). This
module imports nothing beyond the standard library.

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
    │   ├── RowsNotWrittenError           a handed-off batch has no trainer-rows part
    │   ├── UnreadableAcknowledgementError  a row consumer's ack is torn or names other bytes
    │   ├── AlreadyAcknowledgedError      another lifetime of a row consumer acked the part
    │   ├── RetirementFailedError         some captures of a handed-off batch were not retired
    │   └── TransientStoreError           a batch met a storage failure a retry may fix
    ├── LocationError                     (OSError) a store root, capture dir or input file unusable
    │   ├── LocationMissingError          (FileNotFoundError) it does not exist
    │   ├── LocationNotWritableError      (PermissionError) it cannot be written
    │   └── LocationNotADirectoryError    (NotADirectoryError) it is a file, not a directory
    ├── InvalidInputError                 (ValueError) an argument, setting, name or id is not valid
    │   └── InvalidRecordError            (ValueError) a token record or stored entry is malformed
    ├── WrongTypeError                    (TypeError) an argument has the wrong type or place
    ├── PrefixContiguityError             (AssertionError) a rebuilt response breaks prefix order
    ├── OverlappingLocationsError         (ValueError) two locations that must be apart overlap
    ├── RunIdInUseError                   (ValueError) the run id holds another input
    ├── UnreadableManifestError           (ValueError) a run's manifest is torn or edited
    ├── ClaimLostError                    (RuntimeError) a pass lost its claim on a run
    └── EngineAnswerError                 (ValueError) an engine's answer lacks exact ids (gateway)
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


class RowsNotWrittenError(CaptureStoreError):
    """A handed-off batch has no rows part (its run was finalized without rows)."""


class UnreadableAcknowledgementError(CaptureStoreError):
    """An ack object is not one, or acknowledges other bytes than its receipt certifies."""


class AlreadyAcknowledgedError(CaptureStoreError):
    """Another lifetime or process of the row consumer acknowledged the part first."""


class RetirementFailedError(CaptureStoreError):
    """Some captures of a handed-off batch could not be retired; they are kept, retry later."""


class TransientStoreError(CaptureStoreError):
    """A batch met a storage failure that a retry may fix; nothing of it was handed off."""


class LocationError(TokcapError, OSError):
    """A store root, capture directory or input file cannot be used as it is."""


class LocationMissingError(LocationError, FileNotFoundError):
    """The location does not exist; nothing is created in its place."""


class LocationNotWritableError(LocationError, PermissionError):
    """The location exists but this process cannot write there."""


class LocationNotADirectoryError(LocationError, NotADirectoryError):
    """The location names a file where a directory is needed."""


class InvalidInputError(TokcapError, ValueError):
    """An argument, setting, name or id the caller gave is not valid; the message says the fix."""


class InvalidRecordError(InvalidInputError):
    """A token record, response item or stored entry is malformed or newer than this reader."""


class WrongTypeError(TokcapError, TypeError):
    """An argument has the wrong type, or arguments came in the wrong order."""


class PrefixContiguityError(TokcapError, AssertionError):
    """A rebuilt response has an item whose prompt does not extend the tokens before it."""


class OverlappingLocationsError(TokcapError, ValueError):
    """Two locations that must be separate are the same place, or one lies inside the other."""


class RunIdInUseError(TokcapError, ValueError):
    """The run id already holds another input or other settings; nothing of this run ran."""


class UnreadableManifestError(TokcapError, ValueError):
    """A run's manifest exists but is not one (torn or edited): its input cannot be told."""


class ClaimLostError(TokcapError, RuntimeError):
    """A pass no longer holds its claim on a run; it stops before writing anything more there."""


class EngineAnswerError(TokcapError, ValueError):
    """An engine's answer cannot be captured exactly: an id field is missing or malformed.

    The gateway fails the call to the client with it; the message names the field and the
    engine setting that returns it.
    """


def error_text(exc: BaseException) -> str:
    """`Kind: message` for a recorded result; an error that replaced a builtin is named by it.

    Results recorded before these classes existed said `ValueError: ...`; they keep that wording.
    """
    kind = type(exc)
    if isinstance(exc, _NAMED_BY_BUILTIN):
        kind = next(base for base in kind.__mro__ if base.__module__ == "builtins")
    return f"{kind.__name__}: {exc}"


_NAMED_BY_BUILTIN = (LocationError, InvalidInputError, WrongTypeError, PrefixContiguityError)


def is_transient(exc: BaseException) -> bool:
    """Whether retrying might help: unreachable storage and I/O hiccups, not bad data or access."""
    if isinstance(exc, (StoreUnavailableError, TransientStoreError, ConnectionError, TimeoutError)):
        return True
    permanent = (PermissionError, FileNotFoundError, IsADirectoryError, NotADirectoryError)
    return isinstance(exc, OSError) and not isinstance(exc, permanent)
