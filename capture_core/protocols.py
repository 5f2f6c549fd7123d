"""The capture protocols: what a writer (`TokenSink`) and a finalizer (`TokenSource`) need.

A sink is what a model server writes captured calls into.
A source is what finalization freezes and, after durable handoff, retires; a source that
retires a whole batch better than rollout by rollout is also a `BatchTokenSource`.
`TokenCaptureStore` and `NemoGymFileStore` are both; a training framework may bring its own.
Each method's docstring says whether a repeat is safe and what must fail.
`load_capture_class` builds a configured sink or source class and checks its protocol.
This module imports only `records` and `errors`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from capture_core.errors import InvalidInputError, error_text
from capture_core.records import TokenEntry


@dataclass(frozen=True)
class TokenCaptureSnapshot:
    """A frozen rollout capture: the entries a finalizer consumes and the version it consumed.

    `incomplete` means a call was lost or conflicted; such a snapshot must be masked.
    `incomplete_reasons` says why, for the record's error and the run report.
    `attempt_marked` means the dispatch-time clear's attempt marker was there: the capture
    was emptied before this attempt, so it holds no earlier attempt's calls. A source that
    keeps no marker leaves it `False`; `all_traces` then delivers one trace at most.
    Entry order carries no meaning.
    """

    rollout_id: str
    entries: tuple[TokenEntry, ...]
    incomplete: bool
    snapshot_id: str
    version: int
    incomplete_reasons: tuple[str, ...] = field(default=())
    attempt_marked: bool = False


@runtime_checkable
class TokenSink(Protocol):
    """Where a model server records calls while a rollout runs."""

    async def put(self, entry: Any) -> None:
        """Record one call durably.

        A byte-identical repeat is a no-op; a different payload for the same call id raises
        and marks the rollout incomplete. A put after freeze raises or changes the version.
        """

    async def mark_incomplete(self, rollout_id: str, model_call_id: str = "") -> None:
        """Durably record that a call was lost. Repeats add evidence; they never clear it."""

    async def close(self) -> None:
        """Release resources. Safe to repeat."""


@runtime_checkable
class TokenSource(Protocol):
    """Where finalization reads a rollout's capture and retires it after handoff."""

    async def freeze(self, rollout_id: str) -> TokenCaptureSnapshot:
        """Fence and read a rollout's capture.

        Idempotent: with no change in between, a repeat returns the same snapshot id,
        version and entries. A rollout with no records yields an empty snapshot.
        """

    async def drop(self, rollout_id: str, *, snapshot_id: str, version: int) -> bool:
        """Retire exactly the consumed snapshot.

        Returns `False` and deletes nothing when anything changed since that freeze.
        Only call it after the finalized record was durably handed off.
        """

    async def close(self) -> None:
        """Release resources. Safe to repeat."""


@dataclass(frozen=True)
class DropRequest:
    """One rollout of a batch to retire: exactly the snapshot its handed-off record consumed."""

    rollout_id: str
    snapshot_id: str
    version: int


DropCheckpoint = Callable[[str], None] | None
"""Told `DECIDED` and `DELETED` as a batch retirement passes them (None: nobody is)."""
DropResults = list[bool | Exception]
"""Per request, in order: what `drop` returned for that rollout, or the exception it raised."""

# What `BatchTokenSource.drop_many` tells its `checkpoint` (crash tests kill the process there).
DECIDED = "decided"
"""Every retirement decision of the batch is durable (a two-phase source deleted none yet)."""
DELETED = "deleted"
"""One more retired rollout's capture is deleted."""


@runtime_checkable
class BatchTokenSource(TokenSource, Protocol):
    """A source that retires a batch at once (optional: finalization drops one by one else)."""

    async def drop_many(
        self, drops: Sequence[DropRequest], *, concurrency: int, checkpoint: DropCheckpoint = None
    ) -> DropResults:
        """Retire each consumed snapshot as `drop` would; one result per request, in order.

        A result is what `drop` returns for that rollout, or the exception it raised (one
        failing rollout never stops the others). No capture is deleted before its own
        retirement decision is durable. At most `concurrency` store operations run at once.
        `checkpoint` is called with `DECIDED` and `DELETED` as those moments pass.
        Only call it after the finalized records were durably handed off.
        """


def load_capture_class(spec: str, kwargs: Mapping[str, Any] | None, protocol: type) -> Any:
    """Build `module.path:ClassName(**kwargs)` and check that it satisfies `protocol`.

    Each failure (bad spec, import, missing class, construction, wrong protocol) raises a
    `ValueError` that names the class and what to fix.
    """
    module_name, sep, class_name = spec.partition(":")
    if not sep or not module_name or not class_name:
        raise InvalidInputError(f"capture class {spec!r} must look like 'module.path:ClassName'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise InvalidInputError(
            f"cannot import module {module_name!r} for capture class {spec!r}: {exc}; "
            "install the package that provides it"
        ) from exc
    cls = getattr(module, class_name, None)
    if cls is None:
        raise InvalidInputError(
            f"module {module_name!r} has no class {class_name!r} (from {spec!r})"
        )
    try:
        instance = cls(**dict(kwargs or {}))
    except Exception as exc:
        raise InvalidInputError(
            f"cannot construct {spec} with keyword arguments {sorted(kwargs or {})}: "
            + error_text(exc)
        ) from exc
    if not isinstance(instance, protocol):
        raise InvalidInputError(
            f"{spec} does not satisfy {protocol.__name__}: it needs the methods "
            f"{sorted(_protocol_methods(protocol))}"
        )
    return instance


def _protocol_methods(protocol: type) -> set[str]:
    return {
        name
        for name in vars(protocol)
        if not name.startswith("_") and callable(vars(protocol)[name])
    }
