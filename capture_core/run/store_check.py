"""Refusing a capture store that holds nothing of a run's input, before the run touches it.

A store given by mistake (the folder of the rollout files, a fresh directory, another
bucket prefix) would otherwise have a capture frozen in it for every rollout and the run
completed, every rollout masked: tokcap would write its layout into a folder that is no
capture store, and the run id would be used up. So a run looks for the capture of each input
rollout, in input order, and stops at the first it finds: one listing for a store that
holds the run's captures. A store without any is refused by name, before anything is
frozen, written or claimed; one that shows the rollouts were cleared (only the dispatch-time
clear's attempt markers) says so, since a clear run after the rollouts deleted their
captures. A NeMo Gym file store (recognised by its files) and a source class are what
they say they are and are not checked; a run id already claimed was checked when it was
claimed, so re-running it stays safe after its tombstones were swept.
This module does not import Prefect.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from itertools import islice
from typing import Any

from capture_core.errors import InvalidInputError
from capture_core.ids import maybe_rollout_id_from_run_body, validate_rollout_id
from capture_core.run.capture_source import is_class_spec
from capture_core.run.finalize import malformed_token_arrays, rollout_carries_token_ids
from capture_core.run.rollout_io import read_records
from capture_core.run.run_layout import RunLayout
from capture_core.storage import open_byte_store
from capture_core.storage.io_pool import io_pool
from capture_core.store import TokenCaptureStore, open_capture_store
from capture_core.store.capture_layout import CAPTURED, CLEARED

CHUNK = 64
"""Rollouts looked up at once (one listing each, overlapped on the I/O pool)."""


class NotACaptureStoreError(InvalidInputError):
    """The store holds no capture of any rollout of the input: it is not the run's store."""


def check_store_for_run(
    rollouts: str,
    store: str,
    dest: str,
    run_id: str,
    storage_options: Mapping[str, Any] | None = None,
) -> None:
    """`check_store_holds_captures`, unless the run id is already claimed at `dest` (its
    store was checked then, and the claim refuses another store)."""
    layout = RunLayout(open_byte_store(dest, storage_options), run_id)
    if layout.read_manifest() is None:
        check_store_holds_captures(rollouts, store, storage_options)


def check_store_holds_captures(
    rollouts: str, store: str, storage_options: Mapping[str, Any] | None = None
) -> None:
    """Raise `NotACaptureStoreError`, naming the store and what it looked for, when a store
    in tokcap's layout holds no capture of any rollout of `rollouts` that names one.

    Rollouts whose records carry valid token ids need no capture and are not looked for.
    An input without such rollouts, a NeMo Gym file store and a source class pass.
    """
    if is_class_spec(store):
        return
    source = open_capture_store(store, storage_options)
    if not isinstance(source, TokenCaptureStore):
        return
    try:
        found = _look_up(source, _rollout_ids(rollouts, storage_options))
    finally:
        source.close_now()
    if found.looked and not found.captured:
        raise NotACaptureStoreError(_refusal(store, rollouts, found))


@dataclass
class _Found:
    """What the lookup saw: how many ids it looked up and the first, whether any had a
    capture, and how many showed only a dispatch-time clear's attempt marker (and the first)."""

    looked: int = 0
    example: str = ""
    captured: bool = False
    cleared: int = 0
    cleared_example: str = ""


def _look_up(source: TokenCaptureStore, ids: Iterator[str]) -> _Found:
    """Each id's folder state, `CHUNK` at a time (one listing each), stopping at the chunk
    that finds a capture."""
    found = _Found()
    while chunk := list(islice(ids, CHUNK)):
        found.looked, found.example = found.looked + len(chunk), found.example or chunk[0]
        states = list(io_pool().map(source.capture_state, chunk))
        if CAPTURED in states:
            found.captured = True
            return found
        cleared = [rid for rid, state in zip(chunk, states, strict=True) if state == CLEARED]
        found.cleared += len(cleared)
        found.cleared_example = found.cleared_example or next(iter(cleared), "")
    return found


def _refusal(store: str, rollouts: str, found: _Found) -> str:
    """Why the store is refused: cleared for these rollouts (`tokcap clear` deleted their
    captures, or nothing reached the store since), or no trace of them at all."""
    opening = (
        f"store {store} holds no capture of any of the {found.looked} rollouts of {rollouts} "
        "that carry no token ids of their own"
    )
    if found.cleared:
        share = f"all {found.looked}" if found.cleared == found.looked else str(found.cleared)
        return (
            f"{opening}, but it was cleared for {share} of them: their folders "
            f"(such as {found.cleared_example}/) hold only the attempt marker (ATTEMPT) "
            "`tokcap clear` leaves, and no captured call since. `tokcap clear` deletes the "
            "captures of the rollouts it names: it runs before the rollouts are dispatched, "
            "never after they finish. If it ran after these rollouts finished, their captures "
            "are gone: clear their ids, dispatch the rollouts again and finalize the new file. "
            "If it ran before, none of their calls reached this store: check that the model "
            "servers capture into it. Nothing was frozen, written or claimed"
        )
    return (
        f"{opening}: it looked for each rollout's folder (such as {found.example}/) holding "
        "captured calls (e/, i/, x/), a freeze (FROZEN) or a tombstone (RETIRED), and found "
        "none. It is not the capture store the model servers wrote these rollouts to. Nothing "
        "was frozen, written or claimed; give the store they capture into (their "
        "token_id_capture location) and finalize again"
    )


def carries_own_tokens(record: dict[str, Any]) -> bool:
    """Whether the record carries valid token ids of its own, so it needs no capture to be
    delivered (finalize hands it off as a redundant capture)."""
    return rollout_carries_token_ids(record) and malformed_token_arrays(record) is None


def _rollout_ids(rollouts: str, storage_options: Mapping[str, Any] | None) -> Iterator[str]:
    """The distinct rollout ids of the input that a store can hold and whose records need a
    capture (they carry no token ids of their own), in input order."""
    seen: set[str] = set()
    for parsed in read_records(rollouts, storage_options):
        try:
            record = parsed.record or {}
            rollout_id = maybe_rollout_id_from_run_body(record)
            if rollout_id is None or rollout_id in seen or carries_own_tokens(record):
                continue
            validate_rollout_id(rollout_id)
        except ValueError:
            continue
        seen.add(rollout_id)
        yield rollout_id
