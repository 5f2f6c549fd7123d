"""Parent links between the calls of one snapshot, found by prefix, without recursion.

Each call's parent is the earlier call whose prompt-plus-generation is the longest prefix of
its prompt; several such calls with one sequence make it ambiguous (quarantined under the
first, so none of them is a leaf). Candidates come from an index keyed by `prefix.prefix_key`
and are verified by comparing whole lists in C; no Python loop walks tokens one by one.
Writer-recorded lineage settles or contradicts the token evidence (`lineage.decide_parent`).
A call the evidence cannot settle is quarantined: no chain passes through it.
This module imports only `chain`, `lineage`, `prefix` and `records`.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Sequence

from capture_core.builder.chain import Chain, ChainLink
from capture_core.builder.lineage import (
    AMBIGUOUS,
    CONTRADICTED,
    MISSING_PARENT,
    decide_parent,
    inconsistent_records,
)
from capture_core.builder.prefix import PrefixKey, joined_key, prefix_key
from capture_core.records import TokenEntry


def call_order(entry: TokenEntry) -> tuple[int, str]:
    """The order of calls, chains and branches: (prompt length, call id)."""
    return (len(entry.prompt_token_ids), entry.model_call_id)


def _extends(child_prompt: Sequence[int], parent: TokenEntry) -> bool:
    """Whether the parent's prompt-plus-generation is a prefix of `child_prompt`."""
    p, g = parent.prompt_token_ids, parent.generation_token_ids
    cut = len(p)
    return child_prompt[:cut] == p and child_prompt[cut : cut + len(g)] == g


class CallForest:
    """Parent links between calls (indices into `calls`), found without recursion."""

    def __init__(
        self,
        calls: list[TokenEntry],
        known_ids: frozenset[str] = frozenset(),
        collapse: bool = False,
    ) -> None:
        """`known_ids`: every call id of the snapshot; `collapse`: identical parents may merge."""
        self.calls = calls
        self.parent: list[int | None] = [None] * len(calls)
        self.contradicted: set[int] = inconsistent_records(calls)
        self.quarantined: set[int] = set(self.contradicted)
        self.ambiguous: set[int] = set()
        self.lost_parents: dict[int, str] = {}
        self.children: dict[int | None, list[int]] = defaultdict(list)
        self._position = {call.model_call_id: i for i, call in enumerate(calls)}
        self._known_ids = known_ids
        self._collapse = collapse
        index: dict[PrefixKey, list[int]] = defaultdict(list)
        for i, call in enumerate(calls):
            index[joined_key(call.prompt_token_ids, call.generation_token_ids)].append(i)
        lengths = sorted({key[0] for key in index})
        for i, call in enumerate(calls):
            self._link(i, call.prompt_token_ids, index, lengths)

    def _link(self, i: int, prompt: Sequence[int], index: dict, lengths: list[int]) -> None:
        """Attach call `i` to its longest-prefix parent; unsettled evidence quarantines it."""
        matches: list[int] = []
        for pos in range(bisect.bisect_right(lengths, len(prompt)) - 1, -1, -1):
            candidates = index.get(prefix_key(prompt, lengths[pos]), ())
            matches = [j for j in candidates if j != i and _extends(prompt, self.calls[j])]
            if matches:
                break
        parent = decide_parent(
            self.calls[i],
            [self.calls[j] for j in matches],
            self._position,
            self._known_ids,
            self._collapse,
        )
        if parent is MISSING_PARENT:
            self.lost_parents[i] = str((self.calls[i].__pydantic_extra__ or {})["parent_call_id"])
        if parent is CONTRADICTED or parent is MISSING_PARENT:
            self.contradicted.add(i)
            self.quarantined.add(i)
        elif parent is AMBIGUOUS:
            # Quarantined under its first candidate, as in NeMo Gym: that candidate was
            # extended, so it is no leaf, and no chain silently ends before this call.
            self.ambiguous.add(i)
            self.quarantined.add(i)
            self._attach(i, matches[0])
        elif parent is None:
            self.children[None].append(i)
        else:
            # By identity: call ids need not be unique, and an id lookup could link a cycle.
            self._attach(i, next(j for j in matches if self.calls[j] is parent))

    def _attach(self, i: int, j: int) -> None:
        self.parent[i] = j
        self.children[j].append(i)

    def position(self, call_id: str) -> int | None:
        """The index of the call with this id (the last one, should ids repeat), or `None`."""
        return self._position.get(call_id)

    def descendants(self, root: int) -> list[int]:
        """`root`'s descendants, without `root`, without recursion."""
        found, todo = [], list(self.children.get(root, ()))
        while todo:
            node = todo.pop()
            found.append(node)
            todo.extend(self.children.get(node, ()))
        return found

    def path_to(self, i: int) -> list[int]:
        """The calls from `i`'s root down to `i`, without recursion."""
        path = [i]
        while (up := self.parent[path[-1]]) is not None:
            path.append(up)
        return path[::-1]

    def resolve_retries(self) -> list[str]:
        """Quarantine redundant retries; return the call ids of unresolved retry groups.

        Deepest groups first, so a group's children already have their final status.
        """
        unresolved: list[str] = []
        groups: list[list[int]] = []
        for siblings in self.children.values():
            by_prompt: dict[tuple[int, ...], list[int]] = defaultdict(list)
            for i in siblings:
                prompt = self.calls[i].prompt_token_ids
                by_prompt[prefix_key(prompt, len(prompt)) if prompt else (0,)].append(i)
            for same_key in by_prompt.values():
                groups.extend(g for g in _split_identical(self.calls, same_key) if len(g) > 1)
        groups.sort(key=lambda g: -len(self.calls[g[0]].prompt_token_ids))
        for group in groups:
            extended = [i for i in group if self._has_live_child(i)]
            if not extended:
                keep = min(group, key=lambda i: self.calls[i].model_call_id)
                unresolved.extend(sorted(self.calls[i].model_call_id for i in group))
                extended = [keep]
            self.quarantined.update(i for i in group if i not in extended)
        return unresolved

    def _has_live_child(self, i: int) -> bool:
        return any(c not in self.quarantined for c in self.children.get(i, ()))

    def chains(self) -> list[list[int]]:
        """Every root-to-leaf path avoiding quarantined calls, depth first, without recursion."""
        paths: list[list[int]] = []
        roots = sorted(self.children[None], key=lambda i: call_order(self.calls[i]))
        for root in roots:
            if root in self.quarantined:
                continue
            stack: list[tuple[int, list[int]]] = [(root, [root])]
            while stack:
                node, path = stack.pop()
                kids = sorted(self.children.get(node, ()), key=lambda i: call_order(self.calls[i]))
                if not kids:
                    paths.append(path)
                for kid in reversed(kids):
                    if kid not in self.quarantined:
                        stack.append((kid, [*path, kid]))
        return paths


def _split_identical(calls: list[TokenEntry], members: list[int]) -> list[list[int]]:
    """Partition calls whose index keys collide into groups with truly identical prompts."""
    groups: list[list[int]] = []
    for i in sorted(members, key=lambda i: calls[i].model_call_id):
        for group in groups:
            if calls[group[0]].prompt_token_ids == calls[i].prompt_token_ids:
                group.append(i)
                break
        else:
            groups.append([i])
    return groups


def link_chain(calls: list[TokenEntry], path: list[int], chain_id: str) -> Chain:
    """The chain of a root-to-leaf path; each link holds the prompt tokens it adds."""
    root = calls[path[0]]
    links = [ChainLink(root, [])]
    covered = len(root.prompt_token_ids) + len(root.generation_token_ids)
    for i in path[1:]:
        prompt = calls[i].prompt_token_ids
        links.append(ChainLink(calls[i], prompt[covered:]))
        covered = len(prompt) + len(calls[i].generation_token_ids)
    return Chain(chain_id, links, list(root.prompt_token_ids))


def main_first(calls: list[TokenEntry], paths: list[list[int]]) -> list[list[int]]:
    """Order paths by leaf (prompt length, call id), then move the main one to the front.

    The main path starts at the root with the smallest (`created_at`, call id); among that
    root's leaves it is the first in leaf order. The others keep leaf order as branches.
    """
    if not paths:
        return []
    by_leaf = sorted(paths, key=lambda path: path[-1])
    main = min(by_leaf, key=lambda p: (calls[p[0]].created_at, calls[p[0]].model_call_id))
    return [main, *(path for path in by_leaf if path is not main)]
