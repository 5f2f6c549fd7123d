"""Rollout identity and the training correlation prefix.

A rollout id is explicit (`_ng_rollout_id`) or derived from task, rollout and attempt indices,
exactly as NeMo Gym's writers derive the key they store a capture under.
Ids are validated, never sanitised: a rewritten id could not be looked up again.
An id that is not a path segment is a `ValueError` here (no writer can key a capture by it).
An id too long for tokcap's stores is still an id: the store refuses it where it is stored,
with a reason that masks the rollout (`validate_rollout_id`).
The correlation prefix `/ng-rollout/<id>/training-token-capture` uses the same pattern.
This module imports nothing beyond the standard library, pydantic and `errors`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from capture_core.errors import InvalidInputError

ROLLOUT_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
MAX_ROLLOUT_ID_LENGTH = 200
CAPTURE_PREFIX_ROOT = "/ng-rollout/"
CAPTURE_PREFIX_LEAF = "/training-token-capture"

_CAPTURE_PREFIX_PATTERN = re.compile(
    re.escape(CAPTURE_PREFIX_ROOT)
    + f"({ROLLOUT_ID_PATTERN.pattern})"
    + re.escape(CAPTURE_PREFIX_LEAF)
    + r"(?:/.*)?"
)


def _path_segment(rollout_id: Any) -> str:
    """Return `rollout_id` unchanged if it is a safe path segment, else raise `ValueError`."""
    if not isinstance(rollout_id, str):
        raise InvalidInputError(f"rollout id must be a string, got {type(rollout_id).__name__}")
    if not ROLLOUT_ID_PATTERN.fullmatch(rollout_id):
        raise InvalidInputError(
            f"malformed rollout id {rollout_id!r}: use 1-{MAX_ROLLOUT_ID_LENGTH} ASCII letters, "
            "digits, '.', '_' or '-', starting with a letter or digit"
        )
    return rollout_id


def validate_rollout_id(rollout_id: Any) -> str:
    """Return `rollout_id` unchanged if a store can hold it, or raise `ValueError` saying why.

    Stores call this on every id they key objects by: a safe path segment of at most
    `MAX_ROLLOUT_ID_LENGTH` characters (file names and object keys carry suffixes).
    """
    _path_segment(rollout_id)
    if len(rollout_id) > MAX_ROLLOUT_ID_LENGTH:
        raise InvalidInputError(
            f"malformed rollout id {rollout_id[:40]!r}... ({len(rollout_id)} characters): "
            f"tokcap's stores hold ids of at most {MAX_ROLLOUT_ID_LENGTH} characters, so no "
            "capture can be stored or read under it; use a shorter _ng_rollout_id"
        )
    return rollout_id


def _field(body: Mapping[str, Any] | BaseModel, name: str) -> Any:
    """Read `name` from a mapping, or a pydantic model's attribute, extra or private data."""
    if isinstance(body, Mapping):
        return body.get(name)
    if name == "_ng_rollout_id" and hasattr(body, "capture_rollout_id"):
        return body.capture_rollout_id
    value = getattr(body, name, None)
    if value is not None:
        return value
    for store in ("model_extra", "__pydantic_private__"):
        data = getattr(body, store, None)
        if isinstance(data, Mapping) and data.get(name) is not None:
            return data[name]
    return None


def _attempt(value: Any) -> int:
    """The attempt number as NeMo Gym reads it: `int(value)` (so `1.5` is 1, `True` is 1)."""
    if value is None:
        return 0
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidInputError(
            f"_ng_attempt_index must be a whole number (an integer, a float or a string of "
            f"digits), got {value!r}"
        ) from exc


def maybe_rollout_id_from_run_body(body: Any) -> str | None:
    """Return the rollout id of a run body (a mapping or a pydantic model), or `None`.

    The base id is an explicit `_ng_rollout_id`, else `{task}-{rollout}` formatted from the
    indices as they are (either missing: `None`). Then, for either kind, an
    `_ng_attempt_index` above 0 appends `-a{n}`: NeMo Gym's writers key a re-dispatched
    attempt's capture that way, so reading the base id would finalize it from an earlier
    attempt's calls. Any other object has no id (`None`), as in NeMo Gym.
    A malformed explicit id or attempt, or a resulting id that is not a safe path segment,
    raises `ValueError`; an id too long for the stores does not (the store refuses it).
    """
    if not isinstance(body, (Mapping, BaseModel)):
        return None
    explicit = _field(body, "_ng_rollout_id")
    if explicit is not None:
        base = _path_segment(explicit)
    else:
        task, rollout = _field(body, "_ng_task_index"), _field(body, "_ng_rollout_index")
        if task is None or rollout is None:
            return None
        base = f"{task}-{rollout}"
    attempt = _attempt(_field(body, "_ng_attempt_index"))
    return _path_segment(f"{base}-a{attempt}" if attempt > 0 else base)


def rollout_capture_prefix(rollout_id: str) -> str:
    """Return `/ng-rollout/<id>/training-token-capture` for a rollout id."""
    return f"{CAPTURE_PREFIX_ROOT}{_path_segment(rollout_id)}{CAPTURE_PREFIX_LEAF}"


def rollout_id_from_capture_prefix(path: str) -> str | None:
    """Return the rollout id in a correlation path, or `None` when the path is not one."""
    match = _CAPTURE_PREFIX_PATTERN.fullmatch(path)
    return None if match is None else match.group(1)


TASK_INDEX_KEY = "_ng_task_index"


_INDEX = re.compile(r"\s*-?[0-9]{1,18}\s*")
"""An index written as text: ASCII digits, one optional minus, within int64."""


def index_value(value: Any) -> int | None:
    """A task, rollout or attempt index as an integer (integer-valued strings too), else None.

    A bool is not an index, nor is a float: the trainer rows' `task_index` column reads
    indices the same way, so a group's task index is the one its rows carry.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and _INDEX.fullmatch(value):
        return int(value)
    return None
