"""Rollout identity and the training correlation prefix.

A rollout id is explicit (`_ng_rollout_id`) or derived from task, rollout and attempt indices.
Ids are validated, never sanitised: a rewritten id could not be looked up again.
Valid ids are safe path segments, so store keys built from them stay under the store root.
The correlation prefix `/ng-rollout/<id>/training-token-capture` uses the same pattern.
This module imports nothing beyond the standard library.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

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


def validate_rollout_id(rollout_id: Any) -> str:
    """Return `rollout_id` unchanged, or raise `ValueError` saying what a valid id looks like."""
    if not isinstance(rollout_id, str):
        raise ValueError(f"rollout id must be a string, got {type(rollout_id).__name__}")
    if len(rollout_id) > MAX_ROLLOUT_ID_LENGTH or not ROLLOUT_ID_PATTERN.fullmatch(rollout_id):
        raise ValueError(
            f"malformed rollout id {rollout_id!r}: use 1-{MAX_ROLLOUT_ID_LENGTH} ASCII letters, "
            "digits, '.', '_' or '-', starting with a letter or digit"
        )
    return rollout_id


def _field(body: Any, name: str) -> Any:
    """Read `name` from a mapping, an attribute, or a pydantic model's extra or private data."""
    if isinstance(body, Mapping):
        return body.get(name)
    value = getattr(body, name, None)
    if value is not None:
        return value
    for store in ("model_extra", "__pydantic_private__"):
        data = getattr(body, store, None)
        if isinstance(data, Mapping) and data.get(name) is not None:
            return data[name]
    return None


_DIGITS = re.compile(r"[0-9]+")


def _index(value: Any, name: str) -> str | None:
    """A task or rollout index as it appears in the id: an integer or a string of digits.

    A digit string is used verbatim (`"03"` stays `03`), exactly as NeMo Gym formats it.
    """
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return str(value)
    if isinstance(value, str) and _DIGITS.fullmatch(value):
        return value
    raise ValueError(f"{name} must be a non-negative integer or a string of digits, got {value!r}")


def _attempt(value: Any) -> int:
    """The attempt number: an integer, an integer-valued float, or a string of digits."""
    if value is None:
        return 0
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, float) and value.is_integer() and value >= 0:
        return int(value)
    if isinstance(value, str) and _DIGITS.fullmatch(value):
        return int(value)
    raise ValueError(
        "_ng_attempt_index must be a non-negative whole number (an integer, a float such as "
        f"1.0, or a string of digits), got {value!r}"
    )


def maybe_rollout_id_from_run_body(body: Any) -> str | None:
    """Return the rollout id of a run body (a dict or a pydantic model), or `None` if it has none.

    The base id is an explicit `_ng_rollout_id`, else `{task}-{rollout}` from the indices
    (either missing: `None`). Then, for either kind, an `_ng_attempt_index` above 0 appends
    `-a{n}`: NeMo Gym's writers key a re-dispatched attempt's capture that way, so reading
    the base id would finalize it from an earlier attempt's calls.
    A malformed explicit id, index, attempt or resulting id raises `ValueError`.
    """
    explicit = _field(body, "_ng_rollout_id")
    if explicit is not None:
        base = validate_rollout_id(explicit)
    else:
        task = _index(_field(body, "_ng_task_index"), "_ng_task_index")
        rollout = _index(_field(body, "_ng_rollout_index"), "_ng_rollout_index")
        if task is None or rollout is None:
            return None
        base = f"{task}-{rollout}"
    attempt = _attempt(_field(body, "_ng_attempt_index"))
    return validate_rollout_id(f"{base}-a{attempt}" if attempt > 0 else base)


def rollout_capture_prefix(rollout_id: str) -> str:
    """Return `/ng-rollout/<id>/training-token-capture` for a valid rollout id."""
    return f"{CAPTURE_PREFIX_ROOT}{validate_rollout_id(rollout_id)}{CAPTURE_PREFIX_LEAF}"


def rollout_id_from_capture_prefix(path: str) -> str | None:
    """Return the rollout id in a correlation path, or `None` when the path is not one."""
    match = _CAPTURE_PREFIX_PATTERN.fullmatch(path)
    if match is None or len(match.group(1)) > MAX_ROLLOUT_ID_LENGTH:
        return None
    return match.group(1)
