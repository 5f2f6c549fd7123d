"""NeMo Gym's own file store, finalized in place through its lock protocol.

A NeMo Gym `token_id_capture.dir` holds flat files per rollout: `<id>.tokens.jsonl` and friends.
`NemoGymFileStore` reads, freezes, retires, clears and sweeps them as NeMo Gym's writers do.
Every operation holds `flock` on `<id>.tokens.lock`, so a live NeMo Gym writer stays correct.
It never creates objects of tokcap's own layout in such a directory.
`nemo_gym_store_for` recognises the layout; a directory holding both layouts is refused.
`flock` is node-local: this interoperates only on the host that owns the directory.
It imports `storage` only for `fsync_dir` (and `version_source`); it opens no byte store.
"""

from __future__ import annotations

import fcntl
import logging
import os
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

import orjson
from pydantic_core import PydanticSerializationError

from capture_core.errors import (
    CaptureConflictError,
    CaptureFencedError,
    CaptureRetiredError,
    InvalidRecordError,
    LocationMissingError,
    LocationNotWritableError,
    UnreadableCaptureError,
)
from capture_core.ids import validate_rollout_id
from capture_core.protocols import TokenCaptureSnapshot
from capture_core.records import TokenEntry
from capture_core.storage import fsync_dir
from capture_core.store import nemo_gym_layout as layout
from capture_core.store.base import CaptureStore
from capture_core.store.capture_layout import ATTEMPT
from capture_core.store.nemo_gym_layout import nemo_gym_root, read_jsonl_entries, reconcile_tail
from capture_core.store.version_source import STAMPED_FIELD, WeightVersionSource

logger = logging.getLogger(__name__)


def _append_line(path: str, line: bytes) -> int:
    """Append one line and fsync it; return the file's new size."""
    with open(path, "ab") as handle:
        handle.write(line)
        handle.flush()
        os.fsync(handle.fileno())
        return handle.tell()


def _is_file_at(fd: int, path: str) -> bool:
    """Whether the open file `fd` is still the file at `path` (not unlinked or replaced)."""
    try:
        current = os.stat(path)
    except FileNotFoundError:
        return False
    opened = os.fstat(fd)
    return (opened.st_dev, opened.st_ino) == (current.st_dev, current.st_ino)


def _unlink(path: str) -> None:
    with suppress(FileNotFoundError):
        os.unlink(path)


def _remove_attempt_marker(folder: str) -> None:
    """Remove tokcap's attempt marker from a real folder `<root>/<id>`, then the folder if
    that emptied it; a link, a file or any other content is left alone."""
    if not os.path.isdir(folder) or os.path.islink(folder):
        return
    marker = os.path.join(folder, ATTEMPT)
    if os.path.isfile(marker) and not os.path.islink(marker):
        _unlink(marker)
    with suppress(OSError):
        os.rmdir(folder)


class NemoGymFileStore(CaptureStore):
    """NeMo Gym's file store at a local directory: a `TokenSink` and a `TokenSource`.

    Writes (`put`, `begin_call`, `mark_incomplete`) produce NeMo Gym's own files, so NeMo
    Gym reads them too. Failures raise tokcap's capture errors with the same meaning as
    `TokenCaptureStore`. `weight_version_source` stamps puts as there
    (`version_source`). Async methods run the blocking file work on a thread.
    """

    shared_across_hosts = False
    keeps_loss_reasons = False

    def __init__(
        self,
        root: str | os.PathLike[str],
        weight_version_source: str | os.PathLike[str] | None = None,
    ) -> None:
        self.root = os.path.abspath(os.fspath(root))
        if weight_version_source is not None:
            self.weight_version_source = WeightVersionSource(weight_version_source)

    def __repr__(self) -> str:
        return f"NemoGymFileStore({self.root!r})"

    def __reduce__(self) -> tuple[type[NemoGymFileStore], tuple[str, str | None]]:
        return (NemoGymFileStore, (self.root, self.weight_version_location))

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, NemoGymFileStore)
            and self.root == other.root
            and self.weight_version_location == other.weight_version_location
        )

    def __hash__(self) -> int:
        return hash(("nemo-gym", self.root))

    def path_for(self, rollout_id: str, suffix: str) -> str:
        """The path of one of a rollout's files; the id is validated, so it stays in the root."""
        return os.path.join(self.root, validate_rollout_id(rollout_id) + suffix)

    def probe(self, must_exist: bool = True) -> None:
        """Raise a clear error when the directory is missing or not writable."""
        if not os.path.isdir(self.root):
            raise LocationMissingError(f"NeMo Gym capture directory {self.root} does not exist")
        if not os.access(self.root, os.W_OK):
            raise LocationNotWritableError(
                f"NeMo Gym capture directory {self.root} is not writable"
            )

    @contextmanager
    def _locked(self, rollout_id: str, *, shared: bool = False) -> Iterator[None]:
        """Hold `flock` on the lock file that is at its path once the lock is granted.

        The sweep unlinks a retired rollout's lock file while holding it; an operation that
        was waiting on that file would otherwise hold a lock nobody else takes. It reopens.
        """
        path = self.path_for(rollout_id, layout.LOCK)
        while True:
            with open(path, "a+b") as handle:
                fcntl.flock(handle.fileno(), fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
                if not _is_file_at(handle.fileno(), path):
                    continue
                try:
                    yield
                finally:
                    fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
                return

    # -- state ----------------------------------------------------------------------------

    def _read_state(self, rollout_id: str) -> dict[str, Any]:
        path = self.path_for(rollout_id, layout.STATE)
        try:
            with open(path, "rb") as handle:
                data = handle.read()
        except FileNotFoundError:
            return layout.empty_state()
        try:
            state = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise UnreadableCaptureError(
                f"rollout {rollout_id}: {path} is not a NeMo Gym state object ({exc}); "
                "inspect it before clearing the rollout"
            ) from exc
        if not isinstance(state, dict):
            raise UnreadableCaptureError(
                f"rollout {rollout_id}: {path} is not a JSON object; inspect it before "
                "clearing the rollout"
            )
        return state

    def _write_state(self, rollout_id: str, state: dict[str, Any], *, durable: bool) -> None:
        """Replace the state atomically: a `.tokens-state-*` temp file, `os.replace`, root fsync."""
        payload = orjson.dumps(state, option=orjson.OPT_SORT_KEYS | orjson.OPT_APPEND_NEWLINE)
        fd, temporary = tempfile.mkstemp(dir=self.root, prefix=layout.STATE_TEMP_PREFIX)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(payload)
                handle.flush()
                if durable:
                    os.fsync(handle.fileno())
            os.replace(temporary, self.path_for(rollout_id, layout.STATE))
            if durable:
                fsync_dir(self.root)
        finally:
            _unlink(temporary)

    def _reconcile(self, rollout_id: str, state: dict[str, Any]) -> bool:
        """Index the JSONL tail; a conflict marks the rollout incomplete, then raises."""
        try:
            return reconcile_tail(self.path_for(rollout_id, layout.JSONL), rollout_id, state)
        except CaptureConflictError:
            self._write_state(rollout_id, state, durable=True)
            raise

    @staticmethod
    def _refuse(rollout_id: str, state: dict[str, Any], *, frozen_too: bool, what: str) -> None:
        if state.get("retired"):
            raise CaptureRetiredError(
                f"rollout {rollout_id} was retired after handoff; {what}. Clear it with "
                "delete() before reusing the id"
            )
        if frozen_too and state.get("frozen"):
            raise CaptureFencedError(f"rollout {rollout_id} is already frozen; {what}")

    # -- writes ---------------------------------------------------------------------------

    def put_now(self, entry: Any) -> None:
        """Append one call durably (the line is fsynced before this returns).

        A byte-identical repeat is a no-op; a different payload for the same call id raises
        `CaptureConflictError` and marks the rollout incomplete. After freeze or retirement
        every put raises, as NeMo Gym's writer does.
        """
        record, prompt_ids, stamped = self.storable(entry)
        if prompt_ids is not None:  # the prompt as checked, in plain integers
            record = record.model_copy(update={"prompt_token_ids": prompt_ids.tolist()})
        rollout_id = validate_rollout_id(record.rollout_id)
        try:
            canonical = orjson.dumps(record.wire_dump(), option=orjson.OPT_SORT_KEYS)
        except (TypeError, ValueError, PydanticSerializationError) as exc:  # not encodable
            raise self.refused(record, InvalidRecordError(f"cannot be encoded: {exc}")) from exc
        try:  # the line as a freeze will read it, after mapping and stamping: never unreadable
            layout.read_line(canonical)
        except InvalidRecordError as exc:
            raise self.unreadable(record, exc) from exc
        digest = layout.line_digest(canonical)
        with self._locked(rollout_id):
            state = self._read_state(rollout_id)
            what = f"call {record.model_call_id!r} arrived too late and was not recorded"
            self._refuse(rollout_id, state, frozen_too=True, what=what)
            changed = self._reconcile(rollout_id, state)
            known = state["entry_digests"].get(record.model_call_id)
            if known is not None and stamped and known != digest:
                digest = self._stamped_repeat(rollout_id, record, known) or digest
            if known == digest:
                if changed:
                    self._write_state(rollout_id, state, durable=False)
                return
            if known is not None:
                state["incomplete"] = True
                state["version"] = int(state.get("version", 0)) + 1
                self._write_state(rollout_id, state, durable=True)
                raise CaptureConflictError(
                    f"rollout {rollout_id}: call {record.model_call_id!r} was captured twice "
                    "with different payloads; the rollout is marked incomplete and will be "
                    "masked. Use a fresh model_call_id for every call"
                )
            size = _append_line(self.path_for(rollout_id, layout.JSONL), canonical + b"\n")
            state["indexed_size"] = size
            state["entry_digests"][record.model_call_id] = digest
            state["version"] = int(state.get("version", 0)) + 1
            self._write_state(rollout_id, state, durable=False)

    def _stamped_repeat(self, rollout_id: str, record: TokenEntry, known: str) -> str | None:
        """The stored line's digest when it holds `record` but for the end version the store
        stamped (a retry stamped later is the same call: the first stamp stands), else None."""
        path = self.path_for(rollout_id, layout.JSONL)
        ours = record.wire_dump()
        ours.pop(STAMPED_FIELD, None)
        for line in layout.read_lines(path):
            raw = line.encode()
            if layout.line_digest(raw) != known:
                continue
            stored = orjson.loads(raw)
            stored.pop(STAMPED_FIELD, None)
            return known if stored == orjson.loads(orjson.dumps(ours)) else None
        return None

    def _writes_closed(self, rollout_id: str) -> bool:
        """Whether the rollout's state says frozen or retired (read under the shared lock)."""
        with self._locked(rollout_id, shared=True):
            state = self._read_state(rollout_id)
        return bool(state.get("frozen") or state.get("retired"))

    def begin_call_now(self, rollout_id: str, model_call_id: str) -> None:
        """Record the intent to make a call; after freeze or retirement it raises."""
        with self._locked(rollout_id):
            state = self._read_state(rollout_id)
            what = f"call {model_call_id!r} must not start"
            self._refuse(rollout_id, state, frozen_too=True, what=what)
            _append_line(self.path_for(rollout_id, layout.INTENTS), model_call_id.encode() + b"\n")

    def mark_incomplete_now(
        self, rollout_id: str, model_call_id: str = "", reason: str = ""
    ) -> None:
        """Durably record a lost call; it changes the version even after a freeze.

        NeMo Gym's layout keeps only the call id, so `reason` is logged, not stored.
        Raises `CaptureRetiredError` when the rollout was already retired.
        """
        with self._locked(rollout_id):
            state = self._read_state(rollout_id)
            what = f"the loss of call {model_call_id!r} was reported too late"
            self._refuse(rollout_id, state, frozen_too=False, what=what)
            state["incomplete"] = True
            state["version"] = int(state.get("version", 0)) + 1
            self._write_state(rollout_id, state, durable=True)
            line = model_call_id.encode() + b"\n"
            _append_line(self.path_for(rollout_id, layout.INCOMPLETE), line)
            fsync_dir(self.root)
        if reason:
            logger.warning("rollout %s: call %r lost: %s", rollout_id, model_call_id, reason)

    # -- freeze ---------------------------------------------------------------------------

    def freeze_now(self, rollout_id: str) -> TokenCaptureSnapshot:
        """Fence a rollout and return its snapshot; idempotent while nothing changes.

        A retired rollout raises `CaptureRetiredError`; a corrupt line raises
        `UnreadableCaptureError` naming the file.
        """
        with self._locked(rollout_id):
            state = self._read_state(rollout_id)
            self._refuse(rollout_id, state, frozen_too=False, what="it cannot be frozen again")
            changed = self._reconcile(rollout_id, state)
            if not state.get("frozen"):
                state["frozen"] = True
                state["snapshot_id"] = uuid.uuid4().hex
                state["version"] = int(state.get("version", 0)) + 1
                self._write_state(rollout_id, state, durable=True)
            elif changed:
                self._write_state(rollout_id, state, durable=True)
            entries = read_jsonl_entries(
                self.path_for(rollout_id, layout.JSONL), rollout_id, state["entry_digests"]
            )
            reasons = self._incomplete_reasons(rollout_id, state, entries)
            return TokenCaptureSnapshot(
                rollout_id=rollout_id,
                entries=tuple(entries),
                incomplete=bool(reasons),
                snapshot_id=str(state["snapshot_id"]),
                version=int(state["version"]),
                incomplete_reasons=tuple(reasons),
            )

    def _incomplete_reasons(
        self, rollout_id: str, state: dict[str, Any], entries: list[TokenEntry]
    ) -> list[str]:
        lost = layout.read_lines(self.path_for(rollout_id, layout.INCOMPLETE))
        reasons = [f"call {call!r} was lost" if call else "a call was lost" for call in lost]
        if state.get("incomplete") and not reasons:
            reasons.append("the capture state marks the rollout incomplete")
        captured = {entry.model_call_id for entry in entries}
        for call in layout.read_lines(self.path_for(rollout_id, layout.INTENTS)):
            if call and call not in captured:
                reasons.append(f"call {call!r} began but was never captured")
        return reasons

    def read_entries(self, rollout_id: str) -> list[TokenEntry]:
        """Read a rollout's entries under the shared lock, without freezing (diagnostics)."""
        with self._locked(rollout_id, shared=True):
            return read_jsonl_entries(self.path_for(rollout_id, layout.JSONL), rollout_id)

    # -- retire, delete, sweep -------------------------------------------------------------

    def drop_now(self, rollout_id: str, snapshot_id: str, version: int) -> bool:
        """Retire exactly the consumed snapshot; `False`, deleting nothing, if it changed.

        The state file and the lock stay as the tombstone, so a late writer still fails.
        """
        with self._locked(rollout_id):
            state = self._read_state(rollout_id)
            if (
                not state.get("frozen")
                or state.get("snapshot_id") != snapshot_id
                or int(state.get("version", 0)) != version
            ):
                return False
            for suffix in (layout.JSONL, layout.INCOMPLETE, layout.INTENTS):
                _unlink(self.path_for(rollout_id, suffix))
            state.update(indexed_size=0, entry_digests={}, retired=True)
            self._write_state(rollout_id, state, durable=True)
            fsync_dir(self.root)
            return True

    def delete(self, rollout_id: str) -> None:
        """Remove a rollout's capture and state so the id can be reused; the lock file stays.

        NeMo Gym's layout keeps no attempt marker, so a dispatch-time clear here is this
        delete. It also removes the marker tokcap's clear left under the id while the
        directory held neither layout (before NeMo Gym's first write), and nothing else.
        """
        with self._locked(rollout_id):
            for suffix in (layout.JSONL, layout.INCOMPLETE, layout.INTENTS, layout.STATE):
                _unlink(self.path_for(rollout_id, suffix))
            _remove_attempt_marker(os.path.join(self.root, rollout_id))
            fsync_dir(self.root)

    def sweep_retired(self, older_than_seconds: float) -> int:
        """Remove retired tombstones whose state is older than the cutoff; return how many.

        A rollout whose state cannot be read is named in a warning and skipped.
        """
        cutoff = time.time() - older_than_seconds
        removed = 0
        for rollout_id in layout.rollouts_with_state(self.root):
            try:
                removed += self._sweep_one(rollout_id, cutoff)
            except (OSError, UnreadableCaptureError) as exc:
                logger.warning("sweep skipped rollout %s in %s: %s", rollout_id, self.root, exc)
        return removed

    def _sweep_one(self, rollout_id: str, cutoff: float) -> int:
        state_path = self.path_for(rollout_id, layout.STATE)
        with self._locked(rollout_id):
            try:
                if os.stat(state_path).st_mtime > cutoff:
                    return 0
            except FileNotFoundError:
                return 0
            if not self._read_state(rollout_id).get("retired"):
                return 0
            for suffix in (layout.STATE, layout.INTENTS, layout.INCOMPLETE, layout.LOCK):
                _unlink(self.path_for(rollout_id, suffix))
            fsync_dir(self.root)
            return 1

    def close_now(self) -> None:
        """Nothing to release: every operation opens and closes its own files."""


def nemo_gym_store_for(
    location: str | os.PathLike[str],
    weight_version_source: str | os.PathLike[str] | None = None,
) -> NemoGymFileStore | None:
    """A `NemoGymFileStore` when `location` is a local directory in NeMo Gym's layout, else `None`.

    Raises `MixedLayoutError` for a directory holding both layouts (see `nemo_gym_root`).
    """
    root = nemo_gym_root(location)
    return None if root is None else NemoGymFileStore(root, weight_version_source)
