"""Linear-size stored entries: a call's prompt as a delta against the call it extends.

Stored schema 3 keeps every non-default `TokenEntry` field but the prompt, under short names
(extras under "e"), plus a prompt block: the parent call's key, the shared length, the new
tokens and a digest of the whole prompt (the first 128 bits of sha256 over its int64 bytes).
Every object also ends with a seal: the same digest over all of its other bytes, so the
delta, the generation, the log probs, routed experts and content items are all verified.
Readers (`prompt_rebuild`) check each seal, then rebuild full prompts (sharing token objects
with the parent) and check each prompt digest incrementally from the parent's, so both stay
linear.
A missing or altered parent makes the rollout incomplete; it never yields a wrong prompt.
Objects of stored schemas 1 and 2 carry no seal: their tokens cannot be verified, so they
are refused by name (the rollout masks). Older readers refuse schema 3 as newer.
"""

from __future__ import annotations

import binascii
import hashlib
import struct
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from capture_core.records import TOKEN_ENTRY_RECORD_SCHEMA_VERSION, TokenEntry, entry_fields
from capture_core.stored_json import encode_json

# Stored schema changelog:
#   1: a whole `TokenEntry` per object (no digest).
#   2: short names, prompt as a delta with a digest of the whole prompt.
#   3: schema 2 plus a seal over every byte of the object; the seal and the prompt digest
#      are required.
STORED_SCHEMA_VERSION = 3
# A digest is 128 bits in base64url without padding: 22 characters.
_DIGEST_CHARS = 22
_URLSAFE = bytes.maketrans(b"+/", b"-_")
# The seal is the object's last member: `,"s":"<digest>"}`.
_SEAL_HEAD, _SEAL_TAIL, _SEAL_CHARS = b',"s":"', b'"}', _DIGEST_CHARS
_SEAL_SIZE = len(_SEAL_HEAD) + _SEAL_CHARS + len(_SEAL_TAIL)
# Fields equal to these defaults are left out of stored schemas 2 and 3; readers restore them.
# A record's own older `schema_version` is kept (among the extras), so it reads back as written.
_DEFAULTS: dict[str, Any] = {
    "schema_version": TOKEN_ENTRY_RECORD_SCHEMA_VERSION,
    "model": "",
    "routed_experts": None,
    "output_items": [],
    "token_item_index": None,
    "created_at": 0.0,
    "response_id": None,
}


def _normalized(fields: dict[str, Any]) -> dict[str, Any]:
    """Fields without the prompt and without default-valued optional fields."""
    out = dict(fields)
    for key in ("prompt_token_ids", "prompt"):
        out.pop(key, None)
    for key, default in _DEFAULTS.items():
        if key in out and out[key] == default:
            del out[key]
    return out


# Stored schemas 2 and 3 spell field names short; unknown extra fields keep theirs under "e", so
# they can never collide. `schema_version` stays spelled out: older readers refuse it by name.
_SHORT = {
    "rollout_id": "r",
    "model_call_id": "c",
    "model": "m",
    "generation_token_ids": "g",
    "generation_log_probs": "l",
    "routed_experts": "x",
    "output_items": "o",
    "token_item_index": "k",
    "created_at": "t",
}
_LONG = {short: name for name, short in _SHORT.items()}
_EXTRAS, _PROMPT = "e", "p"


def _pack(fields: dict[str, Any]) -> dict[str, Any]:
    packed: dict[str, Any] = {}
    extras: dict[str, Any] = {}
    for key, value in fields.items():
        if key in _SHORT:
            packed[_SHORT[key]] = value
        else:
            extras[key] = value
    if extras:
        packed[_EXTRAS] = extras
    return packed


def unpack(stored: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Logical fields and the prompt block (`parent`, `shared`, `tail`, `sha256`)."""
    fields = {_LONG[key]: value for key, value in stored.items() if key in _LONG}
    extras = stored.get(_EXTRAS)
    if isinstance(extras, dict):
        fields.update(extras)
    block = stored.get(_PROMPT)
    if not isinstance(block, dict):
        raise ValueError("stored entry has no prompt block")
    prompt = {
        "parent": block.get("a"),
        "shared": block.get("n"),
        "tail": block.get("d"),
        "sha256": block.get("h"),
    }
    return fields, prompt


def _is_delta_schema(stored: dict[str, Any]) -> bool:
    return stored.get("schema_version") in (2, STORED_SCHEMA_VERSION) and _PROMPT in stored


def seal(body: bytes) -> bytes:
    """Append the seal (a digest of `body`) to a JSON object's bytes, as its last member."""
    digest = digest_text(hashlib.sha256(body)).encode("ascii")
    return body[:-1] + _SEAL_HEAD + digest + _SEAL_TAIL


def is_torn(data: bytes) -> bool:
    """Whether stored bytes are a write cut short: empty, or a JSON object whose bytes end
    (before any NUL fill) where the object has not. A local put writes its final name in
    place, so this is what a crash mid-put leaves, and what a reader sees while a put is in
    flight. Any other damage (a bad byte inside the object) is corruption, not a torn write.
    """
    if data.endswith(_SEAL_TAIL):
        return False  # whole, or damaged: the seal check decides
    body = data.rstrip(b"\x00")
    if not body:
        return True
    if not body.startswith(b"{"):
        return False
    try:
        orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        return exc.pos >= len(body)
    return False


def check_seal(data: bytes) -> str | None:
    """Why the sealed object `data` fails verification, or `None` when it is intact."""
    if (
        len(data) <= _SEAL_SIZE
        or not data.endswith(_SEAL_TAIL)
        or data[-_SEAL_SIZE : -_SEAL_CHARS - len(_SEAL_TAIL)] != _SEAL_HEAD
    ):
        return "it has no digest although its stored schema requires one (truncated or edited?)"
    hasher = hashlib.sha256(memoryview(data)[:-_SEAL_SIZE])
    hasher.update(b"}")
    stored = data[-_SEAL_CHARS - len(_SEAL_TAIL) : -len(_SEAL_TAIL)].decode("ascii", "replace")
    if digest_text(hasher) != stored:
        return "its bytes fail their digest check (altered or damaged after it was written)"
    return None


def digest_text(hasher: Any) -> str:
    """A prompt digest as stored: the first 128 bits of sha256, base64url without padding."""
    text = binascii.b2a_base64(hasher.digest()[:16], newline=False)[:_DIGEST_CHARS]
    return text.translate(_URLSAFE).decode("ascii")


def token_bytes(tokens: Sequence[int]) -> bytes | None:
    """Tokens as int64 little-endian bytes, or `None` for ids outside int64."""
    try:
        return struct.pack(f"<{len(tokens)}q", *tokens)
    except struct.error:
        return None


@dataclass(frozen=True)
class _Cumulative:
    """A stored call's prompt plus generation as int64 bytes (a private copy: one object the
    garbage collector never scans, and no hold on the caller's token objects), and the
    sha256 state after hashing them, so a child's prompt digest costs only its new tokens."""

    call_key: str
    tokens: bytes
    hasher: Any

    @property
    def length(self) -> int:
        return len(self.tokens) // 8


class RecentCumulatives:
    """A bounded per-process index of recently stored cumulative sequences, by rollout.

    Lookups never read storage; a miss just means the next put stores its full prompt.
    Bounded by rollouts, by candidates per rollout and by the tokens held in all.
    """

    def __init__(
        self, per_rollout: int = 4, rollouts: int = 4096, max_tokens: int = 4_000_000
    ) -> None:
        self.per_rollout, self.rollouts, self.max_tokens = per_rollout, rollouts, max_tokens
        self._index: OrderedDict[str, list[_Cumulative]] = OrderedDict()
        self._tokens = 0
        self._lock = threading.Lock()

    def longest_prefix_of(self, rollout_id: str, prompt_raw: bytes) -> _Cumulative | None:
        """The longest remembered sequence whose int64 bytes start `prompt_raw`, exactly.

        Equal int64 bytes are equal token ids, so this is an exact comparison (a memcmp
        over the whole shared prefix), never a sampled fingerprint.
        """
        with self._lock:
            known = list(self._index.get(rollout_id, ()))
        known.sort(key=_byte_length, reverse=True)
        for candidate in known:
            if prompt_raw.startswith(candidate.tokens):
                return candidate
        return None

    def remember(self, rollout_id: str, cumulative: _Cumulative) -> None:
        with self._lock:
            entries = self._index.setdefault(rollout_id, [])
            self._index.move_to_end(rollout_id)
            entries.append(cumulative)
            self._tokens += cumulative.length
            for old in entries[: -self.per_rollout]:
                self._tokens -= old.length
            del entries[: -self.per_rollout]
            while len(self._index) > 1 and (
                len(self._index) > self.rollouts or self._tokens > self.max_tokens
            ):
                _rollout, evicted = self._index.popitem(last=False)
                self._tokens -= sum(c.length for c in evicted)

    def forget(self, rollout_id: str) -> None:
        with self._lock:
            self._tokens -= sum(c.length for c in self._index.pop(rollout_id, ()))


@dataclass(frozen=True)
class EncodedEntry:
    """An entry's stored bytes, the parent it is a delta against, and the cumulative sequence
    to remember once it is stored. `identity` (fields but prompt, prompt digest) is computed
    only when needed: when an object already exists under the entry's key."""

    data: bytes
    fields: dict[str, Any]
    digest: str | None
    parent: str | None = None
    cumulative: _Cumulative | None = None

    @property
    def identity(self) -> tuple[bytes, str | None]:
        return encode_json(self.fields), self.digest


def encode(
    entry: TokenEntry, call_key: str, index: RecentCumulatives, use_parent: Any = None
) -> EncodedEntry:
    """Encode an entry as a delta against the longest known parent, or with its full prompt.

    A parent is used only when the prompt's int64 bytes start with exactly its tokens'
    (compared, not sampled); the prompt digest then continues the parent's sha256 over the
    new tokens only. `use_parent(call_key)` may veto a parent (for example one that no
    longer exists).
    """
    prompt = entry.prompt_token_ids
    rest = _normalized(entry_fields(entry))
    prompt_raw = token_bytes(prompt)
    gen_raw = token_bytes(entry.generation_token_ids)
    if prompt_raw is None or gen_raw is None:
        # Stored whole, never a parent. A prompt beyond int64 has no prompt digest; the seal
        # still covers it.
        digest = digest_text(hashlib.sha256(prompt_raw)) if prompt_raw is not None else None
        return EncodedEntry(_sealed(rest, digest, None, 0, prompt), rest, digest)
    parent = index.longest_prefix_of(entry.rollout_id, prompt_raw)
    if parent is not None and use_parent is not None and not use_parent(parent.call_key):
        parent = None
    shared = parent.length if parent is not None else 0
    hasher = parent.hasher.copy() if parent is not None else hashlib.sha256()
    hasher.update(memoryview(prompt_raw)[shared * 8 :])
    digest = digest_text(hasher)
    parent_key = parent.call_key if parent is not None else None
    data = _sealed(rest, digest, parent_key, shared, prompt[shared:] if shared else prompt)
    remember = None
    if prompt_raw or gen_raw:
        cumulative = hasher.copy()
        cumulative.update(gen_raw)
        remember = _Cumulative(call_key, prompt_raw + gen_raw, cumulative)
    return EncodedEntry(data, rest, digest, parent_key, remember)


def _sealed(
    rest: dict[str, Any], digest: str | None, parent: str | None, shared: int, tail: Any
) -> bytes:
    block = {"h": digest, "a": parent, "n": shared, "d": tail}
    body = encode_json({**_pack(rest), "schema_version": STORED_SCHEMA_VERSION, _PROMPT: block})
    return seal(body)


def _byte_length(cumulative: _Cumulative) -> int:
    return len(cumulative.tokens)


def stored_identity(data: bytes) -> tuple[bytes, str | None] | None:
    """The logical identity of stored bytes (either schema), or `None` if unreadable."""
    try:
        stored = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(stored, dict):
        return None
    if _is_delta_schema(stored):
        try:
            fields, block = unpack(stored)
        except ValueError:
            return None
        return encode_json(_normalized(fields)), block["sha256"]
    prompt = stored.get("prompt_token_ids")
    raw = token_bytes(prompt) if isinstance(prompt, list) else None
    digest = digest_text(hashlib.sha256(raw)) if raw is not None else None
    return encode_json(_normalized(stored)), digest
