"""Refusing a capture store that holds nothing of a run's input, before the run touches it.

A store given by mistake (the folder of the rollout files, a fresh directory, another
bucket prefix) would otherwise have a capture frozen in it for every rollout and the run
completed, every rollout masked: tokcap would write its layout into a folder that is no
capture store, and the run id would be used up. So a run looks for the capture of each input
rollout, in input order, and stops at the first it finds: one listing for a store that
holds the run's captures. A store without any is refused by name, before anything is
frozen, written or claimed. A NeMo Gym file store (recognised by its files) and a source
class are what they say they are and are not checked; a run id already claimed was checked
when it was claimed, so re-running it stays safe after its tombstones were swept.
This module does not import Prefect.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
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
        looked, example, found = _look_up(source, _rollout_ids(rollouts, storage_options))
    finally:
        source.close_now()
    if looked and not found:
        raise NotACaptureStoreError(
            f"store {store} holds no capture of any of the {looked} rollouts of {rollouts} "
            f"that carry no token ids of their own: it looked for each rollout's folder "
            f"(such as {example}/) holding captured calls (e/, i/, x/), a freeze (FROZEN) "
            "or a tombstone (RETIRED), and found none. It is not the capture store the model "
            "servers wrote these rollouts to. Nothing was frozen, written or claimed; give "
            "the store they capture into (their token_id_capture location) and finalize again"
        )


def _look_up(source: TokenCaptureStore, ids: Iterator[str]) -> tuple[int, str, bool]:
    """How many ids were looked up, the first of them, and whether the store holds the
    capture of any: `CHUNK` at a time, stopping at the chunk that finds one."""
    looked, first = 0, ""
    while chunk := list(islice(ids, CHUNK)):
        looked, first = looked + len(chunk), first or chunk[0]
        if any(io_pool().map(source.holds_capture, chunk)):
            return looked, first, True
    return looked, first, False


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
