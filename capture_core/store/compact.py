"""Linear-size stored entries: a call's prompt as a delta against the call it extends.

Stored schema 3 keeps every non-default `TokenEntry` field but the prompt, under short names
(extras under "e"; per-token weight versions as runs `[[version, count], ...]`, which
readers expand), plus a prompt block: the parent call's key, the shared length, the new
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
import sys
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from capture_core.errors import InvalidRecordError
from capture_core.records import TOKEN_ENTRY_RECORD_SCHEMA_VERSION, TokenEntry, entry_fields
from capture_core.records.provenance import (
    PROVENANCE_FIELDS,
    RUNS_KEY,
    expand_runs,
    version_runs,
)
from capture_core.records.token_values import token_id_array
from capture_core.store.stored_json import encode_json
from capture_core.store.version_source import STAMPED_FIELD

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
_BIG_ENDIAN = sys.byteorder == "big"
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
    **dict.fromkeys(PROVENANCE_FIELDS),
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
    "start_weight_version": "ws",
    "end_weight_version": "we",
    RUNS_KEY: "wv",
    "weight_version_label": "wl",
    "replica": "rp",
}
_LONG = {short: name for name, short in _SHORT.items()}
_EXTRAS, _PROMPT = "e", "p"
_RUNS = _SHORT[RUNS_KEY]


def _pack(fields: dict[str, Any]) -> dict[str, Any]:
    packed: dict[str, Any] = {}
    extras: dict[str, Any] = {}
    for key, value in fields.items():
        if key in _SHORT:
            packed[_SHORT[key]] = value
        else:
            extras[key] = value
    if _RUNS in packed:
        packed[_RUNS] = version_runs(packed[_RUNS])
    if extras:
        packed[_EXTRAS] = extras
    return packed


def _expand_stored_runs(runs: Any, generation: Any) -> list[Any]:
    """Stored runs `[[version, count], ...]` as one version per generated token. Runs of any
    other shape, or counting other than the generation's tokens, are refused by name before
    anything is expanded (a count cannot make a reader allocate more than the generation)."""
    if (
        type(runs) is not list
        or not all(
            type(run) is list and len(run) == 2 and type(run[1]) is int and run[1] > 0
            for run in runs
        )
        or sum(run[1] for run in runs) != len(generation if type(generation) is list else ())
    ):
        raise InvalidRecordError(
            f"stored {RUNS_KEY} are not [version, count] runs with positive counts adding up "
            "to the generated tokens"
        )
    return expand_runs(runs)


def unpack(stored: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Logical fields and the prompt block (`parent`, `shared`, `tail`, `sha256`); per-token
    weight versions expanded from their runs."""
    fields = {_LONG[key]: value for key, value in stored.items() if key in _LONG}
    if RUNS_KEY in fields:
        fields[RUNS_KEY] = _expand_stored_runs(fields[RUNS_KEY], fields.get("generation_token_ids"))
    extras = stored.get(_EXTRAS)
    if isinstance(extras, dict):
        fields.update(extras)
    block = stored.get(_PROMPT)
    if not isinstance(block, dict):
        raise InvalidRecordError("stored entry has no prompt block")
    prompt = {
        "parent": block.get("a"),
        "shared": block.get("n"),
        "tail": block.get("d"),
        "sha256": block.get("h"),
    }
    return fields, prompt


def _is_delta_schema(stored: dict[str, Any]) -> bool:
    return stored.get("schema_version") in (2, STORED_SCHEMA_VERSION) and _PROMPT in stored


# hashlib releases the interpreter lock for every update of at least 2,048 bytes. Among 16
# writer threads each release is a handoff of the lock (futex wake-ups, context switches)
# that costs more than the hashing it frees; smaller updates keep the lock (docs/perf.md).
_HASH_CHUNK = 2040


def feed(hasher: Any, data: bytes | memoryview) -> Any:
    """Update `hasher` with `data` in slices small enough to keep the interpreter lock."""
    view = memoryview(data)
    if len(view) <= _HASH_CHUNK:
        hasher.update(view)
        return hasher
    for start in range(0, len(view), _HASH_CHUNK):
        hasher.update(view[start : start + _HASH_CHUNK])
    return hasher


def sha256_of(data: bytes | memoryview) -> Any:
    """A sha256 hasher over `data`, fed without releasing the interpreter lock."""
    return feed(hashlib.sha256(), data)


def seal(body: bytes) -> bytes:
    """Append the seal (a digest of `body`) to a JSON object's bytes, as its last member."""
    digest = digest_text(sha256_of(body)).encode("ascii")
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
    hasher = sha256_of(memoryview(data)[:-_SEAL_SIZE])
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
    """Tokens as int64 little-endian bytes, or `None` for ids outside int64.

    A list of valid ids (0 to 2**63 - 1) is packed as an array (`token_values.token_id_array`),
    in about half the time `struct` takes; anything else (negative ids, or ids beyond int64,
    in an object an older writer stored) by `struct`, to the same bytes or `None`.
    """
    packed = token_id_array(tokens)
    if packed is not None:
        return packed_bytes(packed)
    try:
        return struct.pack(f"<{len(tokens)}q", *tokens)
    except struct.error:
        return None


def packed_bytes(packed: array) -> bytes | None:
    """Ids packed as 64-bit integers (`token_values.token_id_array`) as `token_bytes` gives them:
    int64 little-endian bytes, or `None` when an id is outside int64 (an unsigned array)."""
    if _BIG_ENDIAN:
        packed = array(packed.typecode, packed)
        packed.byteswap()
    raw = packed.tobytes()
    return raw if raw[7::8].isascii() else None  # every top byte below 0x80


@dataclass(frozen=True, slots=True)
class Known:
    """What a put needs of a stored call to extend it: the length and stored digest of its
    prompt, the length and digest of its generation. Never its tokens, so a few dozen bytes
    whatever the context length."""

    call_key: str
    prompt_length: int
    prompt_digest: str
    generation_length: int
    generation_digest: bytes

    @property
    def length(self) -> int:
        """Tokens a child shares with this call: its prompt plus its generation."""
        return self.prompt_length + self.generation_length


def generation_digest(raw: bytes | memoryview) -> bytes:
    """The first 128 bits of sha256 over a generation's int64 bytes."""
    return sha256_of(raw).digest()[:16]


def known_of(
    call_key: str, prompt_length: int, digest: str | None, generation_raw: bytes | None
) -> Known | None:
    """A stored call as a parent candidate, or `None` when it cannot be one (ids beyond
    int64 have no prompt digest; a call with no tokens would be an empty prefix)."""
    if digest is None or generation_raw is None or prompt_length + len(generation_raw) == 0:
        return None
    generation_length = len(generation_raw) // 8
    return Known(
        call_key, prompt_length, digest, generation_length, generation_digest(generation_raw)
    )


@dataclass(frozen=True)
class EncodedEntry:
    """An entry's stored bytes, the parent it is a delta against, and what to remember of
    it once it is stored. `identity` (fields but prompt, prompt digest) is computed only
    when needed: when an object already exists under the entry's key."""

    data: bytes
    fields: dict[str, Any]
    digest: str | None
    parent: str | None = None
    known: Known | None = None

    @property
    def identity(self) -> tuple[bytes, str | None]:
        return encode_json(self.fields), self.digest


def encode(entry: TokenEntry, call_key: str, candidates: Sequence[Known] = ()) -> EncodedEntry:
    """Encode an entry as a delta against the longest candidate it extends, or whole."""
    draft = Draft(entry, call_key)
    return draft.encode(draft.match(candidates))


class Draft:
    """An entry being encoded: its tokens packed once, its prompt hashed in one pass.

    `match` picks the longest candidate whose tokens start the prompt: the digest of the
    prompt's first `prompt_length` tokens must equal its stored prompt digest and the next
    tokens must hash to its generation digest. The sha256 states at each prompt length asked
    for are kept, so matching more candidates later (after a listing) and the prompt's own
    digest continue the same pass instead of hashing the prompt again. The reader checks the
    same chain (`prompt_rebuild`), so a wrong choice could only mask, never rebuild a wrong
    prompt.
    """

    def __init__(self, entry: TokenEntry, call_key: str, prompt_ids: array | None = None) -> None:
        """`prompt_ids`: the prompt as a put checked it (`checked_entries.storable_entry`); its
        digest is taken from them, so a prompt changed since cannot pass its digest."""
        self.call_key = call_key
        self._prompt = entry.prompt_token_ids
        self._rest = _normalized(entry_fields(entry))
        self._prompt_raw = (
            token_bytes(self._prompt) if prompt_ids is None else packed_bytes(prompt_ids)
        )
        self._gen_raw = token_bytes(entry.generation_token_ids)
        self._view = memoryview(self._prompt_raw or b"")
        self._states: dict[int, Any] = {0: hashlib.sha256()}
        self._spans: dict[tuple[int, int], bytes] = {}

    @property
    def prompt_length(self) -> int:
        return len(self._prompt)

    def match(self, candidates: Sequence[Known]) -> Known | None:
        """The longest of `candidates` whose prompt plus generation starts the prompt."""
        if self._prompt_raw is None or self._gen_raw is None:
            return None  # stored whole, never a parent or a child
        total = len(self._prompt)
        fitting = [c for c in candidates if c.length <= total and c.call_key != self.call_key]
        for end in sorted({c.prompt_length for c in fitting}):
            self._state_at(end)  # ascending, so one pass over the prompt
        for candidate in sorted(fitting, key=_length, reverse=True):
            if digest_text(self._state_at(candidate.prompt_length)) == candidate.prompt_digest:
                span = (candidate.prompt_length * 8, candidate.length * 8)
                if span not in self._spans:
                    self._spans[span] = generation_digest(self._view[span[0] : span[1]])
                if self._spans[span] == candidate.generation_digest:
                    return candidate
        return None

    def encode(self, parent: Known | None) -> EncodedEntry:
        """The stored bytes as a delta against `parent` (one `match` chose), or whole."""
        rest, prompt = self._rest, self._prompt
        # A prompt beyond int64 has no prompt digest; the seal still covers it.
        digest = digest_text(self._state_at(len(prompt))) if self._prompt_raw is not None else None
        if digest is None or self._gen_raw is None:
            # Stored whole, never a parent.
            return EncodedEntry(_sealed(rest, digest, None, 0, prompt), rest, digest)
        shared = parent.length if parent is not None else 0
        parent_key = parent.call_key if parent is not None else None
        data = _sealed(rest, digest, parent_key, shared, prompt[shared:] if shared else prompt)
        known = known_of(self.call_key, len(prompt), digest, self._gen_raw)
        return EncodedEntry(data, rest, digest, parent_key, known)

    def _state_at(self, end: int) -> Any:
        """The sha256 state after the prompt's first `end` tokens, from the nearest one kept."""
        state = self._states.get(end)
        if state is None:
            start = max(n for n in self._states if n < end)
            state = self._states[start].copy()
            feed(state, self._view[start * 8 : end * 8])
            self._states[end] = state
        return state


def _length(candidate: Known) -> int:
    return candidate.length


def _sealed(
    rest: dict[str, Any], digest: str | None, parent: str | None, shared: int, tail: Any
) -> bytes:
    block = {"h": digest, "a": parent, "n": shared, "d": tail}
    body = encode_json({**_pack(rest), "schema_version": STORED_SCHEMA_VERSION, _PROMPT: block})
    return seal(body)


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
    digest = digest_text(sha256_of(raw)) if raw is not None else None
    return encode_json(_normalized(stored)), digest


def same_call(existing: bytes, identity: tuple[bytes, str | None], stamped: bool) -> bool:
    """Whether stored bytes hold the call of `identity`: the same fields and prompt, or, for a
    put the store stamped, the same but for the stamped end version (a retry stamped later
    is the same call: the first stamp stands)."""
    found = stored_identity(existing)
    if found == identity:
        return True
    if not stamped or found is None:
        return False
    return _unstamped(found) == _unstamped(identity)


def _unstamped(identity: tuple[bytes, str | None]) -> tuple[bytes, str | None]:
    fields = orjson.loads(identity[0])
    fields.pop(STAMPED_FIELD, None)
    return encode_json(fields), identity[1]
