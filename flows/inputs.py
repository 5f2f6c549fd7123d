"""`tokcap make-inputs`: seeded captures in a store and rollout files ready to finalize or submit.

The rollouts have the demo's shapes (`main_chain`: its scripted cases, then the seeded agent
captures) or the episodes multi-trace delivery is for (`all_traces`: `testing.trace_shapes`).
Their content depends on the seed only; their ids carry a prefix unique to the invocation
(`<prefix>-<task>-<rollout>`, as `_ng_rollout_id`), so the files of several invocations can
be submitted to one inbox against one store. Nothing is overwritten: a capture of one of the
ids or a file of one of the names already there refuses the whole invocation before it
writes. The captures are written first, as model servers would (an intent per call, then
its entry; a lost call leaves only its intent), and the files only after them, each
create-only, so a file in a watched inbox never names a capture that is not there yet.
This module does not import Prefect.
"""

from __future__ import annotations

import dataclasses
import secrets
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson
from pydantic import BaseModel

from capture_core.builder.trace_envelope import ALL_TRACES
from capture_core.errors import InvalidInputError
from capture_core.ids import validate_rollout_id
from capture_core.run.capture_source import clear_captures
from capture_core.storage import open_byte_store
from capture_core.store import TokenCaptureStore, open_capture_store
from capture_core.testing.agent_captures import AgentRollout, write_capture
from capture_core.testing.trace_shapes import SHAPES, Episode, episode
from tokcap.flows.demo import demo_rollouts

SUFFIX = ".jsonl"
MAX_PREFIX = 64
WRITERS_LOCAL, WRITERS_REMOTE = 4, 32
"""Rollouts captured at once: a local disk gains little from more (each write is fsynced);
an object store hides its round trips behind many."""


class InputsRefusedError(InvalidInputError):
    """The inputs cannot be written as asked; the message names what is in the way."""


class InputFile(BaseModel):
    """One rollout file written: where it is and how many rollouts it holds."""

    url: str
    rollouts: int


class InputsWritten(BaseModel):
    """What one invocation wrote: its id prefix, the files in order, the store."""

    prefix: str
    store: str
    out: str
    delivery: str
    seed: int
    files: list[InputFile]
    rollout_ids: list[str]


def new_prefix() -> str:
    """An id prefix unique to this invocation: the UTC time and a random suffix."""
    return time.strftime("inputs-%Y%m%d-%H%M%S-", time.gmtime()) + secrets.token_hex(2)


def check_prefix(prefix: str) -> str:
    """A prefix is a rollout-id start of at most `MAX_PREFIX` characters."""
    validate_rollout_id(prefix)
    if len(prefix) > MAX_PREFIX:
        raise InvalidInputError(f"id prefix {prefix!r} is longer than {MAX_PREFIX} characters")
    return prefix


Rollout = AgentRollout | Episode


def shaped_rollouts(count: int, seed: int, delivery: str) -> list[Rollout]:
    """`count` rollouts of the delivery's shapes, ids `<task>-<rollout>` (seeded)."""
    if delivery == ALL_TRACES:
        return [episode(i, SHAPES[i % len(SHAPES)], seed=seed) for i in range(count)]
    return list(demo_rollouts(count, seed=seed))


def renamed(rollout: Rollout, prefix: str) -> Rollout:
    """The rollout under id `<prefix>-<id>`: its entries and its record's `_ng_rollout_id`."""
    rollout_id = f"{prefix}-{rollout.rollout_id}"
    entries = [e.model_copy(update={"rollout_id": rollout_id}) for e in rollout.entries]
    record = {**rollout.record, "_ng_rollout_id": rollout_id}
    return dataclasses.replace(rollout, rollout_id=rollout_id, entries=entries, record=record)


def file_names(prefix: str, files: int) -> list[str]:
    """`<prefix>-01.jsonl`, `<prefix>-02.jsonl`, ...: one per file, in order."""
    width = max(2, len(str(files)))
    return [f"{prefix}-{n:0{width}d}{SUFFIX}" for n in range(1, files + 1)]


def split(items: Sequence[Any], parts: int) -> list[Sequence[Any]]:
    """`items` cut into `parts` consecutive runs whose sizes differ by at most one."""
    return [items[len(items) * i // parts : len(items) * (i + 1) // parts] for i in range(parts)]


def make_inputs(
    store: str,
    out: str,
    rollouts: int,
    files: int = 1,
    seed: int = 0,
    delivery: str = "main_chain",
    prefix: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> InputsWritten:
    """Write `rollouts` captures into `store` and their records into `files` files in `out`.

    Raises `InputsRefusedError`, having written nothing, when a file name or a capture of
    one of the ids is already there, or when `files` exceeds `rollouts`.
    """
    if files > rollouts:
        raise InputsRefusedError(f"{files} files cannot hold {rollouts} rollouts; ask for fewer")
    prefix = check_prefix(prefix or new_prefix())
    made = [renamed(r, prefix) for r in shaped_rollouts(rollouts, seed, delivery)]
    capture_store = open_capture_store(store, storage_options)
    if not isinstance(capture_store, TokenCaptureStore):
        raise InputsRefusedError(
            f"{store} is a NeMo Gym file-store directory; make-inputs writes tokcap's own "
            "layout, so give it a new or a tokcap store"
        )
    folder = open_byte_store(out, storage_options)
    names = file_names(prefix, files)
    try:
        refuse_existing(capture_store, folder, out, [r.rollout_id for r in made], names)
        capture_all(capture_store, made)
        written = write_files(folder, out, names, split(made, files))
    finally:
        folder.close()
        capture_store.close_now()
    asked = {"prefix": prefix, "store": store, "out": out, "delivery": delivery, "seed": seed}
    return InputsWritten(**asked, files=written, rollout_ids=[r.rollout_id for r in made])


def _writers(store: TokenCaptureStore) -> int:
    return WRITERS_REMOTE if store.byte_store.round_trips else WRITERS_LOCAL


def refuse_existing(
    store: TokenCaptureStore, folder: Any, out: str, rollout_ids: list[str], names: list[str]
) -> None:
    """Raise `InputsRefusedError` naming a file or a capture (any object of the rollout,
    tombstones included) that is already there."""
    for name in names:
        if folder.exists(name):
            raise InputsRefusedError(
                f"{out.rstrip('/')}/{name} already exists; nothing was written. Leave "
                "--id-prefix out (each invocation then makes its own) or give another"
            )
    with ThreadPoolExecutor(_writers(store)) as pool:
        listed = pool.map(store.byte_store.list_prefix, rollout_ids)
        taken = next((rid for rid, keys in zip(rollout_ids, listed, strict=True) if keys), None)
    if taken is not None:
        raise InputsRefusedError(
            f"the store {store.root} already holds a capture of rollout {taken}; nothing was "
            "written. Leave --id-prefix out (each invocation then makes its own) or give another"
        )


def capture_all(store: TokenCaptureStore, rollouts: list[Rollout]) -> None:
    """Dispatch and capture every rollout, several at once; the first error raises.

    Each is cleared first, as a dispatch loop does: the clear's attempt marker is what lets
    `all_traces` train several traces of one rollout (docs/traces.md).
    """
    with ThreadPoolExecutor(_writers(store)) as pool:
        for done in [pool.submit(_dispatch, store, r) for r in rollouts]:
            done.result()


def _dispatch(store: TokenCaptureStore, rollout: Rollout) -> None:
    clear_captures(store, [rollout.rollout_id])
    write_capture(store, rollout)


def write_files(
    folder: Any, out: str, names: list[str], parts: list[Sequence[Rollout]]
) -> list[InputFile]:
    """Create each file create-only; one that appeared meanwhile raises, naming it."""
    written = []
    for name, part in zip(names, parts, strict=True):
        data = b"".join(orjson.dumps(r.record) + b"\n" for r in part)
        url = f"{out.rstrip('/')}/{name}"
        if not folder.create(name, data):
            raise InputsRefusedError(
                f"{url} appeared while the inputs were written and was left as it is; the "
                f"files before it are written and every capture is in the store"
            )
        written.append(InputFile(url=url, rollouts=len(part)))
    return written
