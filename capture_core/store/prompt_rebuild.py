"""Reading stored schema 3 back: verify an object's seal, split its fields and prompt block,
and rebuild full prompts from deltas, parents first.

Each prompt digest is checked incrementally from its parent's sha256 state, so rebuilding
a rollout stays linear in its tokens. A prompt that cannot be rebuilt exactly is left out
with a reason; it never yields a wrong prompt. The format itself is described in `compact`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from capture_core.records import TOKEN_ENTRY_RECORD_SCHEMA_VERSION
from capture_core.store.compact import (
    STORED_SCHEMA_VERSION,
    check_seal,
    digest_text,
    feed,
    sha256_of,
    token_bytes,
    unpack,
)


@dataclass
class StoredEntry:
    """A parsed stored object before its prompt is rebuilt."""

    name: str
    fields: dict[str, Any]
    prompt: list[int] | None
    parent: str | None = None
    shared: int = 0
    tail: list[int] | None = None
    digest: str | None = None


def parse_stored(name: str, data: bytes, stored: dict[str, Any]) -> StoredEntry:
    """Verify a stored object's seal and split it into its fields and prompt parts.

    Raises `ValueError` naming the cause: a newer or digest-less (legacy) stored schema,
    a missing or failing seal, or a malformed prompt block.
    """
    version = stored.get("schema_version")
    if isinstance(version, int) and version > STORED_SCHEMA_VERSION:
        raise ValueError(
            f"stored schema_version {version} is newer than this reader supports "
            f"({STORED_SCHEMA_VERSION}); upgrade tokcap before reading it"
        )
    if version != STORED_SCHEMA_VERSION:
        raise ValueError(
            f"it was stored without a digest (stored schema {version}, written by an older "
            "tokcap), so its tokens cannot be verified and the rollout is masked; upgrade "
            "every writer of this store (the NeMo Gym sink too)"
        )
    problem = check_seal(data)
    if problem is not None:
        raise ValueError(problem)
    fields, block = unpack(stored)
    tail = block.get("tail")
    if not isinstance(tail, list):
        raise ValueError("stored prompt delta has no token list")
    parent = block.get("parent")
    return StoredEntry(
        name,
        {"schema_version": TOKEN_ENTRY_RECORD_SCHEMA_VERSION, **fields},
        tail if parent is None else None,
        parent,
        int(block.get("shared") or 0),
        tail,
        block.get("sha256"),
    )


def rebuild_prompts(entries: dict[str, StoredEntry]) -> list[str]:
    """Fill in every delta entry's full prompt, parents first; return reasons for failures.

    Entries whose prompt cannot be rebuilt exactly keep `prompt = None`.
    """
    children: dict[str, list[str]] = {}
    ready: list[str] = []
    for name, entry in entries.items():
        if entry.prompt is not None:
            ready.append(name)
        else:
            children.setdefault(entry.parent or "", []).append(name)
    hashers: dict[str, Any] = {}
    reasons: list[str] = []
    while ready:
        name = ready.pop()
        prompt_hasher = hashers.pop(name, None) or _verified_root(name, entries[name], reasons)
        if prompt_hasher is None:
            continue
        for child_name, child_hasher in _extend_children(
            name, entries, children.pop(name, ()), prompt_hasher, reasons
        ):
            hashers[child_name] = child_hasher
            ready.append(child_name)
    for parent, orphans in children.items():
        for orphan in orphans:
            reasons.append(
                f"call {orphan}: prompt refers to parent {parent or '?'}, which is "
                "missing or unreadable"
            )
    return reasons


def _verified_root(name: str, entry: StoredEntry, reasons: list[str]) -> Any:
    """The sha256 state over a whole stored prompt, once its digest checks; else `None`.

    A failed check clears the prompt and adds the reason. Ids beyond int64 have no prompt
    digest (the seal covers the prompt): `None`, with the prompt kept.
    """
    raw = token_bytes(entry.prompt or [])
    if raw is None:
        return None
    prompt_hasher = sha256_of(raw)
    if entry.digest is None:
        reasons.append(f"call {name}: stored prompt has no digest, which is required")
        entry.prompt = None
        return None
    if digest_text(prompt_hasher) != entry.digest:
        reasons.append(f"call {name}: stored prompt fails its digest check (altered?)")
        entry.prompt = None
        return None
    return prompt_hasher


def _extend_children(
    name: str,
    entries: dict[str, StoredEntry],
    child_names: Sequence[str],
    prompt_hasher: Any,
    reasons: list[str],
) -> list[tuple[str, Any]]:
    """Rebuild the prompts of `name`'s children; return each rebuilt child with its hasher."""
    entry = entries[name]
    generation = entry.fields.get("generation_token_ids") or []
    cumulative = prompt_hasher.copy()
    feed(cumulative, token_bytes(generation) or b"")
    parent_length = len(entry.prompt or []) + len(generation)
    rebuilt = []
    for child_name in child_names:
        child = entries[child_name]
        if child.shared != parent_length:
            reasons.append(
                f"call {child_name}: prompt delta shares {child.shared} tokens "
                f"but its parent {name} has {parent_length}"
            )
            continue
        child_hasher = cumulative.copy()
        feed(child_hasher, token_bytes(child.tail or []) or b"")
        if digest_text(child_hasher) != child.digest:
            reasons.append(
                f"call {child_name}: rebuilt prompt fails its digest check (parent {name} altered?)"
            )
            continue
        prompt = list(entry.prompt or [])
        prompt.extend(generation)
        prompt.extend(child.tail or [])
        child.prompt = prompt
        rebuilt.append((child_name, child_hasher))
    return rebuilt
