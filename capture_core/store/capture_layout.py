"""The capture store's key layout: where each event of a rollout lives under the root.

`<rollout>/e/<call>` entries, `<rollout>/i/<call>` intents, `<rollout>/x/<id>` incomplete
markers, `<rollout>/ATTEMPT` (the dispatch-time clear's attempt marker), `<rollout>/FROZEN`
(the freeze claim) and `<rollout>/RETIRED` (the retirement decision).
Call ids are free-form, so they are keyed by `call_key`.
A snapshot's version is the number of event objects (entries, intents, markers).
"""

from __future__ import annotations

import base64
import hashlib

from capture_core.errors import UnreadableCaptureError

ENTRY, INTENT, MARKER = "e", "i", "x"
EVENT_KINDS = (ENTRY, INTENT, MARKER)
FROZEN, RETIRED, ATTEMPT = "FROZEN", "RETIRED", "ATTEMPT"
MAX_PLAIN_CALL_KEY = 160
CAPTURE_NAMES = frozenset((*EVENT_KINDS, FROZEN, RETIRED))
"""What a rollout's folder holds once anything of its capture exists: events, its freeze
claim or its tombstone. The dispatch-time clear's attempt marker alone is no capture."""
CAPTURED, CLEARED, ABSENT = "captured", "cleared", "absent"
"""What a rollout's folder shows (`folder_state`): a capture, only the attempt marker of a
dispatch-time clear (nothing captured since), or nothing."""


def call_key(model_call_id: str) -> str:
    """A filesystem-safe, case-insensitive, reversible key for a free-form call id.

    Very long ids are keyed by their digest; the entry itself still holds the exact id.
    """
    encoded = base64.b32encode(model_call_id.encode("utf-8")).decode("ascii").rstrip("=").lower()
    if len(encoded) <= MAX_PLAIN_CALL_KEY:
        return "c" + encoded
    return "h" + hashlib.sha256(model_call_id.encode("utf-8")).hexdigest()


def event_key(rollout_id: str, kind: str, name: str) -> str:
    """The key of one event object (`kind` is one of `EVENT_KINDS`)."""
    return f"{rollout_id}/{kind}/{name}"


def entry_key(rollout_id: str, name: str) -> str:
    return event_key(rollout_id, ENTRY, name)


def entry_folder(rollout_id: str) -> str:
    """The folder of a rollout's entries (listed by a put looking for its parent)."""
    return f"{rollout_id}/{ENTRY}"


def intent_key(rollout_id: str, name: str) -> str:
    return event_key(rollout_id, INTENT, name)


def marker_key(rollout_id: str, name: str) -> str:
    return event_key(rollout_id, MARKER, name)


def frozen_key(rollout_id: str) -> str:
    return f"{rollout_id}/{FROZEN}"


def retired_key(rollout_id: str) -> str:
    return f"{rollout_id}/{RETIRED}"


def attempt_key(rollout_id: str) -> str:
    """The attempt marker: the dispatch-time clear ran, and every object was written after it."""
    return f"{rollout_id}/{ATTEMPT}"


def folder_state(children: list[str]) -> str:
    """`CAPTURED`, `CLEARED` or `ABSENT`, from the names a rollout's folder lists."""
    if not CAPTURE_NAMES.isdisjoint(children):
        return CAPTURED
    return CLEARED if ATTEMPT in children else ABSENT


def group_events(rollout_id: str, keys: list[str]) -> dict[str, list[str]]:
    """Group a rollout's listed keys by event kind; unknown objects are refused loudly."""
    events: dict[str, list[str]] = {kind: [] for kind in EVENT_KINDS}
    prefix = f"{rollout_id}/"
    for key in keys:
        rest = key[len(prefix) :]
        if rest in (FROZEN, RETIRED, ATTEMPT):
            continue
        kind, _, name = rest.partition("/")
        if kind not in events or not name or "/" in name:
            raise UnreadableCaptureError(
                f"rollout {rollout_id}: object {key} does not belong to the capture layout; "
                "move it out of the store root"
            )
        events[kind].append(name)
    return events


def version_of(events: dict[str, list[str]]) -> int:
    """A snapshot's version: how many event objects it saw."""
    return sum(len(names) for names in events.values())
