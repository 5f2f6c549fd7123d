"""The files of NeMo Gym's file store, and recognising a directory that holds them.

Each rollout has `<id>.tokens.jsonl`, `.intents`, `.incomplete`, `.state.json` and `.lock`.
The JSONL is indexed by the state's `entry_digests` up to `indexed_size`; the tail is reconciled.
A directory is NeMo Gym's when it holds such files; one that also holds tokcap's layout is refused.
Recognition scans the directory once per process and then rechecks only what can change it.
It imports `storage` only for location parsing; it opens no byte store and no backend.
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
import time
from typing import Any

import orjson
from pydantic import ValidationError

from capture_core.errors import (
    CaptureConflictError,
    InvalidRecordError,
    MixedLayoutError,
    UnreadableCaptureError,
)
from capture_core.ids import ROLLOUT_ID_PATTERN
from capture_core.records import TokenEntry, describe_validation_error
from capture_core.storage import TMP_DIR, local_path
from capture_core.store.capture_layout import EVENT_KINDS, FROZEN, RETIRED

logger = logging.getLogger(__name__)

JSONL = ".tokens.jsonl"
INTENTS = ".tokens.intents"
INCOMPLETE = ".tokens.incomplete"
STATE = ".tokens.state.json"
LOCK = ".tokens.lock"
SUFFIXES = (JSONL, INTENTS, INCOMPLETE, STATE, LOCK)
STATE_TEMP_PREFIX = ".tokens-state-"
# A folder holding only tokcap's attempt marker (`ATTEMPT`) is no capture: tokcap's clear of a
# directory in neither layout writes one, and NeMo Gym may take the directory afterwards.
TOKCAP_MARKERS = (*EVENT_KINDS, FROZEN, RETIRED)
RACY_SECONDS = 2.0


def empty_state() -> dict[str, Any]:
    """The state NeMo Gym assumes when a rollout has no state file."""
    return {
        "frozen": False,
        "retired": False,
        "incomplete": False,
        "snapshot_id": "",
        "version": 0,
        "entry_digests": {},
        "indexed_size": 0,
    }


def line_digest(line: bytes) -> str:
    """The digest NeMo Gym indexes a JSONL line by: sha256 hex of the line without newline."""
    return hashlib.sha256(line).hexdigest()


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class _TornLine(Exception):
    """A JSONL line that does not parse."""


def _call_id(path: str, offset: int, payload: bytes) -> str:
    try:
        parsed = orjson.loads(payload)
    except orjson.JSONDecodeError as exc:
        raise _TornLine(str(exc)) from exc
    call_id = parsed.get("model_call_id") if isinstance(parsed, dict) else None
    if not isinstance(call_id, str):
        raise UnreadableCaptureError(
            f"{path}: line at byte {offset} is not a token entry (no model_call_id)"
        )
    return call_id


def reconcile_tail(path: str, rollout_id: str, state: dict[str, Any]) -> bool:
    """Index JSONL lines beyond `indexed_size` into `state`; return whether it changed.

    Call it under the exclusive lock. A torn final line (never acknowledged) is truncated
    away; a bad line followed by more content raises `UnreadableCaptureError`. A known call
    id with another digest sets `incomplete`, bumps the version and raises
    `CaptureConflictError`; the caller writes that state before re-raising.
    """
    try:
        size = os.stat(path).st_size
    except FileNotFoundError:
        size = 0
    stored, indexed = state.get("entry_digests"), state.get("indexed_size")
    legacy = not isinstance(stored, dict) or not _is_int(indexed)
    digests = dict(stored) if isinstance(stored, dict) else {}
    indexed = indexed if _is_int(indexed) else 0
    if indexed < 0 or indexed > size:
        raise UnreadableCaptureError(
            f"rollout {rollout_id}: state indexes {indexed} bytes of {path}, which has {size}; "
            "the capture was modified outside NeMo Gym's protocol, inspect it"
        )
    if indexed == size and not legacy:
        return False
    recovered = 0
    if size:
        with open(path, "rb") as handle:
            handle.seek(indexed)
            tail = handle.read()
        recovered, size = _index_tail(path, rollout_id, state, digests, indexed, tail)
    state["entry_digests"] = digests
    state["indexed_size"] = size
    if recovered and not legacy:
        state["version"] = int(state.get("version", 0)) + recovered
    return True


def _index_tail(
    path: str,
    rollout_id: str,
    state: dict[str, Any],
    digests: dict[str, str],
    indexed: int,
    tail: bytes,
) -> tuple[int, int]:
    """Add the tail's lines to `digests`; return how many, and the file's size afterwards."""
    recovered, position = 0, 0
    while position < len(tail):
        newline = tail.find(b"\n", position)
        end = len(tail) if newline == -1 else newline
        payload = tail[position:end].strip()
        if payload:
            try:
                call_id = _call_id(path, indexed + position, payload)
            except _TornLine as exc:
                rest = tail[end + 1 :] if newline != -1 else b""
                if rest.strip():
                    raise UnreadableCaptureError(
                        f"{path}: line at byte {indexed + position} is not JSON ({exc}) and "
                        "more content follows it: the capture is corrupt, inspect it"
                    ) from exc
                os.truncate(path, indexed + position)
                logger.warning(
                    "dropped %d torn trailing bytes (a never-acknowledged write) from %s",
                    len(tail) - position,
                    path,
                )
                return recovered, indexed + position
            digest = line_digest(payload)
            if digests.get(call_id, digest) != digest:
                state["incomplete"] = True
                state["version"] = int(state.get("version", 0)) + 1
                raise CaptureConflictError(
                    f"rollout {rollout_id}: call {call_id!r} has two different durable payloads "
                    f"in {path}; the rollout is marked incomplete and will be masked"
                )
            digests[call_id] = digest
            recovered += 1
        position = end + 1
    return recovered, indexed + len(tail)


def read_line(payload: bytes) -> TokenEntry:
    """What a reader reads of one entry line: the line validated in full (other systems'
    provenance names mapped). A put passes the line it is about to append through it too.
    Raises `orjson.JSONDecodeError`, or `InvalidRecordError` naming every problem."""
    try:
        return TokenEntry.model_validate(orjson.loads(payload))
    except ValidationError as exc:
        raise InvalidRecordError(describe_validation_error(exc)) from exc


def read_jsonl_entries(
    path: str, rollout_id: str, digests: dict[str, str] | None = None
) -> list[TokenEntry]:
    """Every entry line of a rollout's JSONL, validated; a bad line raises naming the file.

    With `digests` (the state's index, reconciled) every line must match its call's indexed
    sha256, and every indexed call must be there: an edit that keeps the file valid JSON
    lines would otherwise deliver altered tokens, or a rollout without one of its calls.
    """
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        return []
    entries = []
    for number, line in enumerate(data.split(b"\n"), start=1):
        payload = line.strip()
        if not payload:
            continue
        try:
            entry = read_line(payload)
        except orjson.JSONDecodeError as exc:
            raise UnreadableCaptureError(f"{path}: line {number} is not JSON ({exc})") from exc
        except InvalidRecordError as exc:
            raise UnreadableCaptureError(
                f"{path}: line {number} is not a readable token entry: {exc}"
            ) from exc
        if digests is not None and digests.get(entry.model_call_id) != line_digest(payload):
            raise UnreadableCaptureError(
                f"{path}: line {number} (call {entry.model_call_id!r}) fails its digest check "
                "against the state's index: it was altered after it was written; inspect it"
            )
        if entry.rollout_id != rollout_id:
            raise UnreadableCaptureError(
                f"{path}: line {number} holds call {entry.model_call_id!r} of rollout "
                f"{entry.rollout_id!r}; it was copied into the wrong file"
            )
        entries.append(entry)
    missing = sorted(set(digests or ()) - {entry.model_call_id for entry in entries})
    if missing:
        raise UnreadableCaptureError(
            f"{path}: the state indexes calls {missing[:5]} that the file no longer holds: "
            "it was altered after they were written; inspect it"
        )
    return entries


def read_lines(path: str) -> list[str]:
    """The lines of an intents or incomplete file (an empty line stays an empty id)."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        return []
    lines = data.decode("utf-8", errors="replace").split("\n")
    return lines[:-1] if lines and lines[-1] == "" else lines


def rollouts_with_state(root: str) -> list[str]:
    """Rollout ids that have a state file in `root`."""
    names = os.listdir(root)
    ids = (name[: -len(STATE)] for name in names if name.endswith(STATE))
    return sorted(i for i in ids if ROLLOUT_ID_PATTERN.fullmatch(i))


# -- recognition ------------------------------------------------------------------------

_seen: dict[str, tuple[int, int, bool]] = {}  # root -> (mtime_ns, nlink, is NeMo Gym's)


def local_directory(location: str | os.PathLike[str]) -> str | None:
    """The absolute local path of a location (plain, `file://`, `local://`), else `None`."""
    text = local_path(location)
    if text is None or not os.path.isabs(text):
        return None
    return os.path.normpath(text)


def _is_gym_file(name: str) -> bool:
    if name.startswith(STATE_TEMP_PREFIX):
        return True
    return any(
        name.endswith(suffix) and ROLLOUT_ID_PATTERN.fullmatch(name[: -len(suffix)]) is not None
        for suffix in SUFFIXES
    )


def _is_tokcap_dir(entry: os.DirEntry[str]) -> bool:
    if entry.name == TMP_DIR:
        return True
    if not ROLLOUT_ID_PATTERN.fullmatch(entry.name):
        return False
    return any(os.path.lexists(os.path.join(entry.path, name)) for name in TOKCAP_MARKERS)


def _classify(root: str) -> bool:
    """Whether `root` is in NeMo Gym's layout; refuse a mix of both layouts."""
    gym: str | None = None
    ours: str | None = None
    with os.scandir(root) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                if ours is None and _is_tokcap_dir(entry):
                    ours = entry.name
            elif gym is None and _is_gym_file(entry.name):
                gym = entry.name
            if gym and ours:
                raise MixedLayoutError(
                    f"capture directory {root} holds both NeMo Gym's file-store files (such as "
                    f"{gym!r}) and tokcap's own store layout (such as {ours + '/'!r}), so it is "
                    "not clear which captures are authoritative. Give each layout its own "
                    "directory: move tokcap's rollout folders and .tmp/ to another store root"
                )
    if gym:
        logger.info(
            "capture directory %s is NeMo Gym's file store (found %s); using it in place "
            "through its flock protocol",
            root,
            gym,
        )
    return gym is not None


def nemo_gym_root(location: str | os.PathLike[str]) -> str | None:
    """The directory's absolute path when `location` is a local directory in NeMo Gym's layout.

    Raises `MixedLayoutError` for a directory holding both layouts. An empty or missing
    directory is not NeMo Gym's. Once recognised, a directory is rescanned only when it
    gains a folder (its link count changes) or tokcap's `.tmp/`; any other result is
    rescanned whenever the directory changes.
    """
    root = local_directory(location)
    if root is None:
        return None
    try:
        info = os.stat(root)
    except OSError:
        return None
    if not stat.S_ISDIR(info.st_mode):
        return None
    seen = _seen.get(root)
    if seen is not None and seen[2]:
        unchanged = seen[1] == info.st_nlink and not os.path.lexists(os.path.join(root, TMP_DIR))
        is_gym = unchanged or _classify(root)
    elif seen is not None and seen[0] == info.st_mtime_ns and not _racy(info):
        is_gym = False
    else:
        is_gym = _classify(root)
    _seen[root] = (info.st_mtime_ns, info.st_nlink, is_gym)
    return root if is_gym else None


def _racy(info: os.stat_result) -> bool:
    """Whether the directory changed so recently that a same-tick change could hide behind it."""
    return time.time() - info.st_mtime < RACY_SECONDS
