"""Who may write, and how much: the API key, the session path's rollout id, body limits.

Whoever reaches a gateway can put tokens under any rollout id, so a gateway that listens
beyond loopback requires a key, compared in constant time on every request (`hmac`). A path
under `/ng-rollout/` must be a session path with a valid rollout id (`capture_core.ids`):
anything else is refused before a byte is written, never forwarded uncaptured.
This module imports only `errors`, `ids` and the standard library.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

from capture_core.errors import InvalidInputError, TokcapError
from capture_core.ids import CAPTURE_PREFIX_LEAF, CAPTURE_PREFIX_ROOT, validate_rollout_id

_SESSION = re.compile(
    re.escape(CAPTURE_PREFIX_ROOT) + r"([^/]*)" + re.escape(CAPTURE_PREFIX_LEAF) + r"(/.*)?"
)


class BodyTooLargeError(TokcapError):
    """A request body passed the gateway's limit (a 413 naming it)."""


@dataclass(frozen=True)
class Session:
    """A session path: the rollout id and the engine path after the correlation prefix."""

    rollout_id: str
    engine_path: str


def session_of(path: str) -> Session | None:
    """The session a path names, `None` for a path outside `/ng-rollout/`.

    Raises `InvalidInputError` (a 400) for a path under `/ng-rollout/` that is not a session
    path or whose rollout id is not valid, naming it.
    """
    if not path.startswith(CAPTURE_PREFIX_ROOT):
        return None
    match = _SESSION.fullmatch(path)
    if match is None:
        raise InvalidInputError(
            f"{path[:120]!r} is not a session path; use "
            f"{CAPTURE_PREFIX_ROOT}<rollout_id>{CAPTURE_PREFIX_LEAF}/v1 as the base URL"
        )
    rollout_id = validate_rollout_id(match.group(1))
    return Session(rollout_id, match.group(2) or "/")


def key_matches(headers: Mapping[str, str], key: str) -> bool:
    """Whether the request carries `key` as `Authorization: Bearer <key>` (or `x-api-key`),
    compared in constant time."""
    given = headers.get("authorization", "")
    token = given[7:].strip() if given[:7].lower() == "bearer " else headers.get("x-api-key", "")
    return hmac.compare_digest(token.encode("utf-8", "replace"), key.encode("utf-8"))


async def read_bounded(chunks: AsyncIterator[bytes], declared: str | None, limit: int) -> bytes:
    """A request body of at most `limit` bytes; raises `BodyTooLargeError` naming the limit,
    from the declared length when there is one, before reading past it otherwise."""
    too_large = BodyTooLargeError(
        f"the request body passes the gateway's limit of {limit} bytes (--max-body-bytes); "
        "send a shorter conversation or raise the limit"
    )
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large
    parts, size = [], 0
    async for part in chunks:
        size += len(part)
        if size > limit:
            raise too_large
        parts.append(part)
    return b"".join(parts)
