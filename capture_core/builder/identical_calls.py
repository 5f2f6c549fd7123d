"""Calls with identical tokens: telling them apart and collapsing them to one.

Two calls with the same prompt and generation are interchangeable: a witness, a parent
decision or an envelope takes the smallest call id of them. Identical prompts or sequences
are found by cheap keys first (`prefix`) and verified by comparing whole token lists, so the
usual case, where every call differs, reads no token.
This module imports only `prefix` and `records`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from capture_core.builder.prefix import joined_key
from capture_core.records import TokenEntry


def same_sequence(a: TokenEntry, b: TokenEntry) -> bool:
    """Whether two calls have identical prompt and generation tokens (interchangeable)."""
    return a.generation_token_ids == b.generation_token_ids and (
        a.prompt_token_ids == b.prompt_token_ids
    )


def collapse_identical(candidates: Sequence[TokenEntry]) -> TokenEntry | None:
    """The smallest-id call when all candidates share one token sequence; else `None`."""
    if not candidates:
        return None
    first = candidates[0]
    if any(not same_sequence(first, other) for other in candidates[1:]):
        return None
    return min(candidates, key=lambda e: e.model_call_id)


def collapse_twins(calls: list[TokenEntry]) -> tuple[list[TokenEntry], dict[str, str]]:
    """Calls with pairwise different tokens (the smallest id of each identical set), and each
    left-out twin's representative. Twins train the same tokens: one of them is owned."""
    sizes = [(len(call.prompt_token_ids), len(call.generation_token_ids)) for call in calls]
    if len(set(sizes)) == len(sizes):
        return calls, {}  # twins have equal sizes: the usual case reads no token
    keys = [
        (len(call.prompt_token_ids), joined_key(call.prompt_token_ids, call.generation_token_ids))
        for call in calls
    ]
    twins: dict[str, str] = {}
    for members in clashes(keys, calls):
        for group in partition(members, same_sequence):
            keep = min(group, key=lambda c: c.model_call_id)
            twins.update((c.model_call_id, keep.model_call_id) for c in group if c is not keep)
    return [c for c in calls if c.model_call_id not in twins], twins


def clashes(keys: list[Any], items: list[Any]) -> list[list[Any]]:
    """The items sharing a key with another item, grouped by key in first-seen order.

    Keys are necessary for equality, never sufficient; the usual case (every key distinct)
    costs one set of the keys and no grouping.
    """
    if len(set(keys)) == len(keys):
        return []
    by_key: dict[Any, list[Any]] = defaultdict(list)
    for key, item in zip(keys, items, strict=True):
        by_key[key].append(item)
    return [members for members in by_key.values() if len(members) > 1]


def partition(members: Sequence[Any], same: Any) -> list[list[Any]]:
    """Members grouped by the equivalence `same`, in first-seen order."""
    groups: list[list[Any]] = []
    for member in members:
        for group in groups:
            if same(group[0], member):
                group.append(member)
                break
        else:
            groups.append([member])
    return groups
