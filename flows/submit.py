"""Submit rollout files: place each into the inbox and announce it with a Prefect event.

A file is placed create-only and durably under its own name (fsync and an exclusive link on
a local disk; one conditional PUT on S3). The same content already there is accepted (a
resubmission), other content under that name is refused, naming the file: the inbox
finalizes one content per name. The event (`SUBMITTED`) starts the `finalize-inbox-file`
deployment's run of that file as soon as a worker is free; a file whose announcement did
not reach a server is still finalized by the inbox's scheduled pass. `submit_files` is the
call for harnesses; `tokcap submit` prints what it returns.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence
from typing import Any

from capture_core.run.inbox import InboxEntry, run_id_for_file
from capture_core.storage import filesystem_for, open_byte_store

SUBMITTED = "tokcap.inbox.file.submitted"
RESOURCE_PREFIX = "tokcap.inbox-file."
SUFFIX = ".jsonl"


class SubmitRefusedError(ValueError):
    """A file could not be placed into the inbox; the message names it and what to do."""


class Submitted(InboxEntry):
    """One submitted file: where it is now, the run it is finalized into, and whether this
    call placed it (False: the same content was already there) and announced it."""

    source: str
    placed: bool
    announced: bool
    event_id: str | None = None
    not_announced: str | None = None


def read_source(source: str, storage_options: Mapping[str, Any] | None) -> bytes:
    """The whole content of a rollout file, local or at an fsspec URL."""
    fs, path = filesystem_for(source, storage_options)
    try:
        return fs.cat_file(path)
    except FileNotFoundError:
        raise SubmitRefusedError(f"{source} does not exist; nothing was submitted") from None


def place_file(
    source: str, inbox: str, storage_options: Mapping[str, Any] | None = None
) -> tuple[str, bool]:
    """Place `source` into `inbox` under its own name; its inbox URL and whether it was
    placed now (False: the same bytes were already there).

    Other bytes under that name are never overwritten: the call raises `SubmitRefusedError`.
    """
    name = os.path.basename(source.rstrip("/"))
    if not name.endswith(SUFFIX) or name.startswith("."):
        raise SubmitRefusedError(
            f"{source}: inbox files are named *{SUFFIX} (and not hidden); rename it and submit "
            "again"
        )
    data = read_source(source, storage_options)
    if not data:
        raise SubmitRefusedError(f"{source} is empty; nothing was submitted")
    url = f"{inbox.rstrip('/')}/{name}"
    store = open_byte_store(inbox, storage_options)
    try:
        if store.create(name, data):
            return url, True
        there = store.get(name)
    finally:
        store.close()
    if there == data:
        return url, False
    theirs = hashlib.sha256(there or b"").hexdigest()[:12]
    raise SubmitRefusedError(
        f"{url} already holds other content (sha256 {theirs}, yours "
        f"{hashlib.sha256(data).hexdigest()[:12]}); the inbox finalizes one content per file "
        "name, so nothing was submitted. Submit the new rollouts under a new file name"
    )


def submitted_event(url: str, run_id: str, inbox: str) -> Any:
    """The event that announces a placed file; the `finalize-inbox-file` trigger expects it."""
    from prefect.events import Event

    return Event(
        event=SUBMITTED,
        resource={
            "prefect.resource.id": RESOURCE_PREFIX + run_id,
            "prefect.resource.name": url.rsplit("/", 1)[-1],
            "tokcap.inbox": inbox,
        },
        payload={"rollouts": url, "run_id": run_id, "inbox": inbox},
    )


def announce(url: str, run_id: str, inbox: str) -> str | None:
    """Post the file's event to the Prefect API; its id once the server accepted it.

    `None` when no server is configured (`PREFECT_API_URL`). The event is posted over HTTP,
    not queued, so an accepted id means the server has it; a refusal raises.
    """
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL

    if not PREFECT_API_URL.value():
        return None
    event = submitted_event(url, run_id, inbox)
    with get_client(sync_client=True) as client:
        client.request("POST", "/events", json=[event.model_dump(mode="json")])
    return str(event.id)


def submit_files(
    inbox: str, files: Sequence[str], storage_options: Mapping[str, Any] | None = None
) -> list[Submitted]:
    """Place each file into the inbox, then announce it; one `Submitted` per file, in order.

    A refused file raises `SubmitRefusedError` before later files are placed; files placed
    before it stay placed and announced (a resubmission of them is accepted). A file whose
    event did not reach a server stays placed, with `not_announced` saying why.
    """
    results = []
    for source in files:
        url, placed = place_file(source, inbox, storage_options)
        run_id = run_id_for_file(url)
        event_id, why = None, "PREFECT_API_URL is not set"
        try:
            event_id = announce(url, run_id, inbox)
        except Exception as exc:  # placed all the same: the scheduled pass finalizes it
            why = f"the server did not take the event ({type(exc).__name__}: {exc})"
        results.append(
            Submitted(
                source=source,
                url=url,
                run_id=run_id,
                placed=placed,
                announced=event_id is not None,
                event_id=event_id,
                not_announced=None if event_id else why,
            )
        )
    return results
