"""Retry settling for multi-trace delivery: which tries of one prompt were used, which abandoned.

Calls with one prompt form a retry group. A try is used when it is the scored call, when a
later call extends it, or when the scored transcript names its own items and no other try's.
Tries that said the same thing as the transcript are told apart only by a later turn of the
transcript made on top of one: an extension alone (a summary of the kept try, a judge of a
rejected one) is no evidence there. The other tries of a settled group are abandoned, with
every call built on them; a group where no try is used is unsettled: left out when a scored
call elsewhere is attributed, else returned to the caller, which masks the rollout.
This module imports only `call_content`, `forest`, `identical_calls`, `prefix` and `records`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from capture_core.builder.call_content import ContentReader
from capture_core.builder.forest import CallForest
from capture_core.builder.identical_calls import clashes, partition
from capture_core.builder.prefix import prefix_key
from capture_core.records import TokenEntry

ABANDONED_TRY = "abandoned_try"
ON_ABANDONED_TRY = "built_on_abandoned_try"
UNSETTLED_TRY = "unsettled_try"


def settle_retry_groups(
    calls: list[TokenEntry],
    forest: CallForest,
    excluded: dict[int, str],
    scored: int | None,
    reader: ContentReader,
    response: Mapping[str, Any] | None,
) -> list[list[str]]:
    """Leave out every group's abandoned tries in `excluded`; return the unsettled groups.

    `scored` is the attributed scored call's position and `response` the scored response,
    when the record gives them. Deepest groups first, so whether a try was extended is final
    when it is read. An unsettled group is returned (its call ids, sorted) only without a
    scored call; with one, its tries are left out as `UNSETTLED_TRY`.
    """
    children = forest.children
    groups = same_prompt_groups(calls)
    reading = _transcript_reading(reader, response) if groups else ()
    own = lambda i: reader.own(calls[i])  # noqa: E731
    unsettled: list[list[str]] = []
    for group in groups:
        live = [i for i in group if i not in excluded]
        if len(live) < 2:
            continue
        if scored in live:
            used = [scored]
        elif _tied(own, live, reading):
            used = [i for i in live if _continues(forest, own, i, reading)]
        else:
            used = [i for i in live if children.get(i) or _named(own, i, live, reading)]
        if used:
            for i in live:
                if i not in used:
                    _abandon(forest, excluded, i)
        elif scored is not None:
            excluded.update(dict.fromkeys(live, UNSETTLED_TRY))
        else:
            unsettled.append(sorted(calls[i].model_call_id for i in live))
    return unsettled


def _abandon(forest: CallForest, excluded: dict[int, str], i: int) -> None:
    excluded[i] = ABANDONED_TRY
    for j in forest.descendants(i):
        excluded.setdefault(j, ON_ABANDONED_TRY)


def _transcript_reading(reader: ContentReader, response: Mapping[str, Any] | None) -> tuple:
    """The scored response's model-authored items, in order; empty when there is none."""
    if response is None:
        return ()
    try:
        return reader.readings(response)[0]
    except Exception:  # an unreadable transcript names nothing
        return ()


def _continues(forest: CallForest, own_of: Callable[[int], tuple], i: int, reading: tuple) -> bool:
    """Whether a later turn of the scored transcript was made on top of call `i`."""
    for j in forest.descendants(i):
        own = own_of(j)
        if own and _runs_in(own, reading):
            return True
    return False


def same_prompt_groups(calls: list[TokenEntry]) -> list[list[int]]:
    """Positions of calls sharing one prompt (two or more), deepest prompts first.

    Calls are in call order, shortest prompt first, and one prompt has one length: only runs
    of calls with equal prompt lengths are read, and distinct lengths (the usual case) read
    no token.
    """
    lengths = [len(c.prompt_token_ids) for c in calls]
    if len(set(lengths)) == len(lengths):
        return []
    groups: list[list[int]] = []
    start = 0
    for end in range(1, len(calls) + 1):
        if end < len(calls) and lengths[end] == lengths[start]:
            continue
        if end - start > 1:
            groups += _identical_prompts(calls, list(range(start, end)))
        start = end
    groups.sort(key=lambda g: (-lengths[g[0]], g[0]))
    return groups


def _identical_prompts(calls: list[TokenEntry], members: list[int]) -> list[list[int]]:
    """The groups (two or more, in call order) of `members`, calls of one prompt length, whose
    prompts are identical; more than two members are first told apart by their prefix keys."""
    same = lambda i, j: calls[i].prompt_token_ids == calls[j].prompt_token_ids  # noqa: E731
    if len(members) == 2:
        return [members] if same(*members) else []
    length = len(calls[members[0]].prompt_token_ids)
    keys = [prefix_key(calls[i].prompt_token_ids, length) if length else (0,) for i in members]
    found = clashes(keys, members)
    return [group for clash in found for group in partition(clash, same) if len(group) > 1]


def _named(own_of: Callable[[int], tuple], i: int, group: list[int], reading: tuple) -> bool:
    """Whether the scored transcript holds this try's own items, and no other try's."""
    own = own_of(i)
    if not own or not _runs_in(own, reading):
        return False
    return all(own_of(j) != own for j in group if j != i)


def _tied(own_of: Callable[[int], tuple], group: list[int], reading: tuple) -> bool:
    """Whether two tries said the same thing and the scored transcript holds it.

    Then either may be the one the transcript shows, and a later call extending one (a
    summary of the kept try, or a judge of a rejected one) says nothing about which.
    """
    seen: set[tuple] = set()
    for i in group:
        own = own_of(i)
        if own and own in seen and _runs_in(own, reading):
            return True
        seen.add(own)
    return False


def _runs_in(part: tuple, whole: tuple) -> bool:
    """Whether `part` occurs in `whole` as a contiguous run."""
    n = len(part)
    return any(whole[k : k + n] == part for k in range(len(whole) - n + 1))
