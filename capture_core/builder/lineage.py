"""Writer-recorded parents as evidence: checked against the tokens, never trusted blindly.

NeMo Gym 0.7.0's writer stamps each entry with `parent_call_id`, `parent_resolution`
(`root`, `resolved`, `unresolved`), `cum_len` and `digest`; they arrive as extra fields.
A recorded parent is used only when the tokens confirm it; a contradiction is ambiguity.
Records without these fields get their parent from the tokens alone.
This module imports only `identical_calls` and `records`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from capture_core.builder.identical_calls import collapse_identical, same_sequence
from capture_core.records import TokenEntry

AMBIGUOUS = object()
"""The decision for a call whose parent the tokens cannot settle: quarantine it."""
CONTRADICTED = object()
"""The decision for a call whose recorded parent the tokens deny."""
MISSING_PARENT = object()
"""The decision for a call whose recorded parent the snapshot lacks: that parent was lost."""


@dataclass(frozen=True)
class WriterParent:
    """The parent decision a writer recorded at request time."""

    resolution: str
    parent_call_id: str | None


def _extra(entry: TokenEntry, name: str) -> Any:
    return (entry.__pydantic_extra__ or {}).get(name)


def writer_parent(entry: TokenEntry) -> WriterParent | None:
    """The recorded decision, or `None` when the record carries none (or an unreadable one)."""
    resolution = _extra(entry, "parent_resolution")
    if resolution not in ("root", "resolved"):
        return None
    parent = _extra(entry, "parent_call_id")
    if resolution == "resolved" and not (isinstance(parent, str) and parent):
        return None
    return WriterParent(resolution, parent if resolution == "resolved" else None)


def inconsistent_records(calls: Sequence[TokenEntry]) -> set[int]:
    """Calls whose own lineage fields contradict their tokens.

    A `cum_len` other than prompt plus generation length, or a `digest` shared with a call
    whose token sequence differs, means the record does not describe the tokens it holds.
    """
    bad: set[int] = set()
    by_digest: dict[str, list[int]] = defaultdict(list)
    for i, call in enumerate(calls):
        cum_len = _extra(call, "cum_len")
        expected = len(call.prompt_token_ids) + len(call.generation_token_ids)
        if cum_len is not None and cum_len != expected:
            bad.add(i)
        digest = _extra(call, "digest")
        if isinstance(digest, str) and digest:
            by_digest[digest].append(i)
    for members in by_digest.values():
        first = calls[members[0]]
        if any(not same_sequence(first, calls[j]) for j in members[1:]):
            bad.update(members)
    return bad


def decide_parent(
    child: TokenEntry,
    candidates: Sequence[TokenEntry],
    buildable_ids: Collection[str],
    known_ids: Collection[str],
    collapse: bool,
) -> TokenEntry | object | None:
    """The parent of `child` among its token-verified longest-prefix `candidates`.

    Returns the parent, `None` for a root, `CONTRADICTED`, `MISSING_PARENT` or `AMBIGUOUS`.
    A recorded parent must be one of the candidates; one the tokens deny contradicts the
    record, one missing from the snapshot is a lost call. A recorded parent that is in the
    snapshot without generated tokens leaves the decision to the tokens. Without a record,
    one candidate is the parent; several are ambiguous unless `collapse` is set and they
    share one token sequence (interchangeable: the smallest call id).
    """
    recorded = writer_parent(child)
    if recorded is not None and recorded.resolution == "resolved":
        named = [c for c in candidates if c.model_call_id == recorded.parent_call_id]
        if named:
            return named[0]
        if recorded.parent_call_id not in known_ids:
            return MISSING_PARENT
        if recorded.parent_call_id in buildable_ids:
            return CONTRADICTED
    elif recorded is not None:
        return CONTRADICTED if candidates else None
    if len(candidates) <= 1:
        return candidates[0] if candidates else None
    if collapse:
        chosen = collapse_identical(candidates)
        if chosen is not None:
            return chosen
    return AMBIGUOUS
