"""Reading a rollout's events back: parse and verify entries, rebuild prompts, read markers.

Every object that cannot be read is refused by name (rollout and key); a torn entry (a put
that never returned) is a lost call, reported as a reason, never silently skipped.
"""

from __future__ import annotations

import orjson
from pydantic import ValidationError

from capture_core.errors import CaptureStoreError, InvalidRecordError, UnreadableCaptureError
from capture_core.records import TokenEntry, describe_validation_error, entry_fields
from capture_core.storage import ByteStore
from capture_core.store import compact
from capture_core.store.capture_layout import ENTRY, INTENT, MARKER, call_key, event_key
from capture_core.store.checked_entries import construct_sealed_entry
from capture_core.store.prompt_rebuild import StoredEntry, parse_stored, rebuild_prompts
from capture_core.store.stored_json import encode_json


def encode_entry(entry: TokenEntry) -> bytes:
    """Canonical stored-schema-1 bytes (whole prompt, no digest), as older versions wrote them.

    Readers refuse these objects (their tokens cannot be verified); kept for benchmarks and
    tests that need the legacy form.
    """
    return encode_json(entry_fields(entry))


def read_entries(
    byte_store: ByteStore, rollout_id: str, names: list[str]
) -> tuple[list[TokenEntry], list[str]]:
    """Parse, rebuild and validate entries; return them and why any could not be rebuilt."""
    keys = [event_key(rollout_id, ENTRY, name) for name in names]
    stored: dict[str, StoredEntry] = {}
    torn: list[str] = []
    for name, (key, data) in zip(names, byte_store.iter_many(keys), strict=True):
        if data is None:
            raise CaptureStoreError(
                f"rollout {rollout_id}: object {key} vanished while freezing (a concurrent "
                "clear?); freeze again, the result is idempotent"
            )
        if compact.is_torn(data):
            torn.append(
                f"call {name}: object {key} is torn, a put that never returned (a crash "
                "mid-write, or a put still running during the freeze): the call is lost"
            )
            continue
        stored[name] = parse_stored_entry(rollout_id, key, name, data)
    reasons = torn + rebuild_prompts(stored)
    entries = [
        finish_entry(rollout_id, event_key(rollout_id, ENTRY, name), item)
        for name, item in stored.items()
        if item.prompt is not None
    ]
    return entries, reasons


def incomplete_reasons(
    byte_store: ByteStore,
    rollout_id: str,
    events: dict[str, list[str]],
    entries: list[TokenEntry],
) -> list[str]:
    """Why the capture is incomplete: its markers, and intents that have no entry."""
    reasons = []
    if events[MARKER]:
        keys = [event_key(rollout_id, MARKER, name) for name in events[MARKER]]
        for key, data in sorted(byte_store.get_many(keys).items()):
            reasons.append(_marker_reason(key, data))
    captured = {call_key(e.model_call_id) for e in entries} if events[INTENT] else set()
    for name in events[INTENT]:
        if name not in captured:
            reasons.append(f"call began but was never captured (intent {name})")
    return reasons


def conflict_reason(model_call_id: str, existing: bytes) -> tuple[str, str]:
    """Why an object already held a call's key, and what to do: a torn put or another payload."""
    if compact.is_torn(existing):
        reason = f"an earlier put of call {model_call_id!r} was interrupted (torn object)"
        return reason, "the call is lost; the rollout must be collected again"
    reason = f"call {model_call_id!r} was captured twice with different payloads"
    return reason, "use a fresh model_call_id for every call"


def _unreadable(rollout_id: str, key: str, detail: str) -> UnreadableCaptureError:
    return UnreadableCaptureError(
        f"rollout {rollout_id}: object {key} is not a readable token entry: {detail}"
    )


def parse_stored_entry(rollout_id: str, key: str, name: str, data: bytes) -> StoredEntry:
    """Parse and verify a stored entry, refusing garbage, damage and legacy objects by name."""
    try:
        stored = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise _unreadable(rollout_id, key, str(exc)) from exc
    if not isinstance(stored, dict):
        raise _unreadable(rollout_id, key, "not a JSON object")
    try:
        return parse_stored(name, data, stored)
    except (ValueError, TypeError) as exc:
        raise _unreadable(rollout_id, key, str(exc)) from exc


def finish_entry(rollout_id: str, key: str, stored: StoredEntry) -> TokenEntry:
    """The entry of a sealed, rebuilt object (`read_entry`), refusing newer schemas, invalid
    fields and misplaced records by name."""
    try:
        entry = read_entry(stored)
    except InvalidRecordError as exc:
        raise _unreadable(rollout_id, key, str(exc)) from exc
    if entry.rollout_id != rollout_id or call_key(entry.model_call_id) != stored.name:
        raise UnreadableCaptureError(
            f"rollout {rollout_id}: object {key} holds call {entry.model_call_id!r} of rollout "
            f"{entry.rollout_id!r}; it was copied into the wrong place"
        )
    return entry


def read_entry(stored: StoredEntry) -> TokenEntry:
    """What a reader reads of a sealed object whose prompt is rebuilt: the one judgement of
    stored fields, which a put also passes the bytes it is about to store through.

    Its seal verified its bytes, so it is built without re-validating every token
    (`construct_sealed_entry`); otherwise (another system's provenance name, a field of an
    unexpected type) it is validated in full. A delta's tail is validated with its fields
    and its prefix belongs to its parent, so the rebuilt prompt is attached without
    re-checking every token. Raises `InvalidRecordError` naming every problem.
    """
    entry = construct_sealed_entry({**stored.fields, "prompt_token_ids": stored.prompt})
    if entry is not None:
        return entry
    delta = stored.tail is not None and stored.prompt is not stored.tail
    fields = {**stored.fields, "prompt_token_ids": stored.tail if delta else stored.prompt}
    try:
        entry = TokenEntry.model_validate(fields)
    except ValidationError as exc:
        raise InvalidRecordError(describe_validation_error(exc)) from exc
    if delta:
        entry.prompt_token_ids = stored.prompt  # type: ignore[assignment]
    return entry


def _marker_reason(key: str, data: bytes | None) -> str:
    if data is None:
        return f"incomplete marker {key} vanished"
    try:
        return str(orjson.loads(data).get("reason") or "a call was lost")
    except (orjson.JSONDecodeError, AttributeError):
        return f"unreadable incomplete marker {key}"
