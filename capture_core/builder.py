"""Trajectories from a frozen snapshot: chains of calls, and their projection into a response.

`prefix_merging` links each call to the earlier call whose prompt-plus-generation is the
longest prefix of its prompt; `per_request` makes one chain per call.
Both are independent of capture order, and nothing here recurses, so rollouts of thousands
of turns build in one pass.
Parents are found through an index keyed by cumulative length and sampled tokens, then
verified by comparing whole lists in C; no Python loop walks tokens one by one.
A terminal call anchors the build: the main chain is the path from its root to it.
This module imports only `records`, `lineage` and `terminal`.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from capture_core.lineage import (
    AMBIGUOUS,
    CONTRADICTED,
    MISSING_PARENT,
    decide_parent,
    inconsistent_records,
)
from capture_core.prefix import PrefixKey, joined_key, prefix_key
from capture_core.records import TOKEN_FIELDS, TokenEntry
from capture_core.terminal import (
    CHAIN_BROKEN,
    CHAIN_DELIVERED,
    CHAIN_NOT_CAPTURED,
    collapse_identical,
)

BUILDERS = ("prefix_merging", "per_request")
TOKEN_ONLY_ITEM = {"type": "message"}


@dataclass
class ChainLink:
    """One call in a chain and the prompt tokens added since the previous link (loss mask 0).

    The first link's `interstitial` is empty: its prompt is the chain's `root_prompt`.
    """

    entry: TokenEntry
    interstitial: list[int]


@dataclass
class Chain:
    """A path of calls from a root to a leaf; `chain_id` is `main`, `branch-<n>` or `req-<n>`."""

    chain_id: str
    links: list[ChainLink] = field(default_factory=list)
    root_prompt: list[int] = field(default_factory=list)

    @property
    def generated_tokens(self) -> int:
        return sum(len(link.entry.generation_token_ids) for link in self.links)

    def validate(self) -> None:
        """Raise `ValueError` unless every call has one log prob per generated token."""
        for link in self.links:
            entry = link.entry
            if len(entry.generation_token_ids) != len(entry.generation_log_probs):
                raise ValueError(
                    f"call {entry.model_call_id!r} has {len(entry.generation_token_ids)} tokens "
                    f"but {len(entry.generation_log_probs)} log probs; the chain is invalid"
                )


@dataclass
class BuildNotes:
    """What the builder saw; typed so a renamed metric fails loudly instead of reading as zero.

    `unresolved_retries` and `empty_generation_calls` are call ids. `contradicted_calls` are
    the calls whose writer-recorded lineage the tokens contradict (quarantined: evidence of
    a lost or misrecorded call, which the strict policy must not drop silently).
    `lost_parents` maps each call whose recorded parent is missing from the snapshot to that
    parent: a lost call, on the delivered path or not.
    """

    builder: str
    roots: int = 0
    chains: int = 0
    generated_tokens_captured: int = 0
    generated_tokens_delivered: int = 0
    delivered_fraction: float = 0.0
    unresolved_retries: list[str] = field(default_factory=list)
    empty_generation_calls: list[str] = field(default_factory=list)
    terminal_chain: str = ""
    excluded_calls: list[str] = field(default_factory=list)
    contradicted_calls: list[str] = field(default_factory=list)
    lost_parents: dict[str, str] = field(default_factory=dict)


@dataclass
class BuildOutput:
    """Chains of one build (main first), the quarantined call ids, and the notes."""

    chains: list[Chain]
    quarantined: list[str] = field(default_factory=list)
    notes: BuildNotes = field(default_factory=lambda: BuildNotes(builder=""))


def _order_key(entry: TokenEntry) -> tuple[int, str]:
    return (len(entry.prompt_token_ids), entry.model_call_id)


def _fraction(delivered: int, captured: int) -> float:
    return round(delivered / captured, 4) if captured else 0.0


def per_request(entries: Iterable[TokenEntry]) -> BuildOutput:
    """One chain per call (`req-<n>`), ordered by (prompt length, call id)."""
    ordered = sorted(entries, key=_order_key)
    chains = [
        Chain(f"req-{i}", [ChainLink(e, [])], list(e.prompt_token_ids))
        for i, e in enumerate(ordered)
    ]
    captured = sum(len(e.generation_token_ids) for e in ordered)
    delivered = chains[0].generated_tokens if chains else 0
    notes = BuildNotes(
        builder="per_request",
        roots=len(chains),
        chains=len(chains),
        generated_tokens_captured=captured,
        generated_tokens_delivered=delivered,
        delivered_fraction=_fraction(delivered, captured),
        empty_generation_calls=[e.model_call_id for e in ordered if not e.generation_token_ids],
    )
    return BuildOutput(chains, [], notes)


def _extends(child_prompt: Sequence[int], parent: TokenEntry) -> bool:
    """Whether the parent's prompt-plus-generation is a prefix of `child_prompt`."""
    p, g = parent.prompt_token_ids, parent.generation_token_ids
    cut = len(p)
    return child_prompt[:cut] == p and child_prompt[cut : cut + len(g)] == g


class _Forest:
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
            self.quarantined.add(i)
        elif parent is None:
            self.children[None].append(i)
        else:
            # By identity: call ids need not be unique, and an id lookup could link a cycle.
            j = next(j for j in matches if self.calls[j] is parent)
            self.parent[i] = j
            self.children[j].append(i)

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
        roots = sorted(self.children[None], key=lambda i: _order_key(self.calls[i]))
        for root in roots:
            if root in self.quarantined:
                continue
            stack: list[tuple[int, list[int]]] = [(root, [root])]
            while stack:
                node, path = stack.pop()
                kids = sorted(self.children.get(node, ()), key=lambda i: _order_key(self.calls[i]))
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


def _link_chain(calls: list[TokenEntry], path: list[int], chain_id: str) -> Chain:
    root = calls[path[0]]
    links = [ChainLink(root, [])]
    covered = len(root.prompt_token_ids) + len(root.generation_token_ids)
    for i in path[1:]:
        prompt = calls[i].prompt_token_ids
        links.append(ChainLink(calls[i], prompt[covered:]))
        covered = len(prompt) + len(calls[i].generation_token_ids)
    return Chain(chain_id, links, list(root.prompt_token_ids))


def _main_first(calls: list[TokenEntry], paths: list[list[int]]) -> list[list[int]]:
    """Order paths by leaf (prompt length, call id), then move the main one to the front.

    The main path starts at the root with the smallest (`created_at`, call id); among that
    root's leaves it is the first in leaf order. The others keep leaf order as branches.
    """
    if not paths:
        return []
    by_leaf = sorted(paths, key=lambda path: path[-1])
    main = min(by_leaf, key=lambda p: (calls[p[0]].created_at, calls[p[0]].model_call_id))
    return [main, *(path for path in by_leaf if path is not main)]


def prefix_merging(
    entries: Iterable[TokenEntry], terminal_call_id: str | None = None
) -> BuildOutput:
    """Merge calls into prefix-contiguous chains; the main chain comes first.

    With `terminal_call_id` the main chain is the path from its root to that call; calls
    off the path are excluded (`notes.excluded_calls`) and `notes.terminal_chain` says
    whether the path was delivered, is broken or was not captured.
    """
    all_calls = list(entries)
    calls = sorted((e for e in all_calls if e.generation_token_ids), key=_order_key)
    empty = [e.model_call_id for e in all_calls if not e.generation_token_ids]
    known = frozenset(e.model_call_id for e in all_calls)
    forest = _Forest(calls, known, collapse=terminal_call_id is not None)
    if terminal_call_id is not None:
        return _anchored(calls, forest, terminal_call_id, sorted(empty))
    unresolved = forest.resolve_retries()
    paths = _main_first(calls, forest.chains())
    chains = [
        _link_chain(calls, path, "main" if n == 0 else f"branch-{n - 1}")
        for n, path in enumerate(paths)
    ]
    live_roots = {path[0] for path in paths} | {
        r for r in forest.children[None] if r not in forest.quarantined
    }
    notes = _notes(calls, chains, len(live_roots), sorted(empty))
    notes.unresolved_retries = unresolved
    notes.contradicted_calls = sorted(calls[i].model_call_id for i in forest.contradicted)
    notes.lost_parents = {calls[i].model_call_id: p for i, p in sorted(forest.lost_parents.items())}
    quarantined = sorted(calls[i].model_call_id for i in forest.quarantined)
    return BuildOutput(chains, quarantined, notes)


def _notes(
    calls: list[TokenEntry], chains: list[Chain], roots: int, empty: list[str]
) -> BuildNotes:
    captured = sum(len(c.generation_token_ids) for c in calls)
    delivered = chains[0].generated_tokens if chains else 0
    return BuildNotes(
        builder="prefix_merging",
        roots=roots,
        chains=len(chains),
        generated_tokens_captured=captured,
        generated_tokens_delivered=delivered,
        delivered_fraction=_fraction(delivered, captured),
        empty_generation_calls=empty,
    )


def _anchored(
    calls: list[TokenEntry], forest: _Forest, terminal: str, empty: list[str]
) -> BuildOutput:
    """The root-to-terminal path as the only chain; retries on it are resolved by the path.

    A path through a quarantined call is broken and yields no chain, as does a terminal
    that is not among the calls with generated tokens. Several different calls carrying
    the terminal's id are ambiguous: broken too.
    """
    named = [c for c in calls if c.model_call_id == terminal]
    chosen = collapse_identical(named)
    position = next((i for i, c in enumerate(calls) if c is chosen), None)
    path = forest.path_to(position) if position is not None else []
    if not named:
        status = CHAIN_NOT_CAPTURED
    elif position is None or any(i in forest.quarantined for i in path):
        status = CHAIN_BROKEN
    else:
        status = CHAIN_DELIVERED
    chains = [_link_chain(calls, path, "main")] if status == CHAIN_DELIVERED else []
    on_path = set(path) if chains else set()
    roots = sum(1 for r in forest.children[None] if r not in forest.quarantined)
    notes = _notes(calls, chains, roots, empty)
    notes.terminal_chain = status
    notes.contradicted_calls = sorted(calls[i].model_call_id for i in forest.contradicted)
    notes.lost_parents = {calls[i].model_call_id: p for i, p in sorted(forest.lost_parents.items())}
    notes.excluded_calls = sorted(c.model_call_id for i, c in enumerate(calls) if i not in on_path)
    quarantined = sorted(calls[i].model_call_id for i in forest.quarantined)
    return BuildOutput(chains, quarantined, notes)


def run_builder(
    entries: Iterable[TokenEntry],
    builder: str = "prefix_merging",
    *,
    terminal_call_id: str | None = None,
) -> BuildOutput:
    """Run the named builder over a frozen snapshot's entries.

    `terminal_call_id` anchors `prefix_merging` to an attributed terminal call (`per_request`
    refuses it: it has no chain to anchor). An unknown name is a `ValueError` listing the
    known ones; the arguments in the wrong order (the name first) are a `TypeError` saying so.
    """
    if isinstance(entries, str):
        raise TypeError(
            f"run_builder(entries, builder) takes the entries first; got the builder name "
            f"{entries!r} as the first argument. Call run_builder(entries, builder={entries!r})"
        )
    if builder == "prefix_merging":
        return prefix_merging(entries, terminal_call_id)
    if builder == "per_request" and terminal_call_id is None:
        return per_request(entries)
    if builder == "per_request":
        raise ValueError(
            "per_request builds one chain per call; a terminal call needs prefix_merging"
        )
    raise ValueError(f"unknown builder {builder!r}; use one of {', '.join(BUILDERS)}")


def _carrier_index(entry: TokenEntry) -> int:
    items = entry.output_items
    if entry.token_item_index is not None:
        return entry.token_item_index
    for i, item in enumerate(items):
        if any(f in item for f in TOKEN_FIELDS):
            return i
    return len(items) - 1


def project_chain_to_output_items(chain: Chain) -> list[dict[str, Any]]:
    """Emit each call's content items; the carrier item gets the cumulative prompt and tokens.

    A link's prompt is the cumulative prefix so far (the builder verified it), so the
    entry's own list is reused rather than copied. An invalid chain raises `ValueError`.
    """
    chain.validate()
    output: list[dict[str, Any]] = []
    for link in chain.links:
        entry = link.entry
        items = [dict(item) for item in entry.output_items] or [dict(TOKEN_ONLY_ITEM)]
        carrier = items[_carrier_index(entry) if entry.output_items else 0]
        carrier["prompt_token_ids"] = entry.prompt_token_ids
        carrier["generation_token_ids"] = entry.generation_token_ids
        carrier["generation_log_probs"] = entry.generation_log_probs
        if entry.routed_experts is not None:
            carrier["routed_experts"] = entry.routed_experts
        else:
            carrier.pop("routed_experts", None)
        output.extend(items)
    return output


def _main_chain(out: BuildOutput) -> Chain:
    return next((c for c in out.chains if c.chain_id == "main"), out.chains[0])


def project_main_chain_response(rollout_id: str, out: BuildOutput, model: str = "") -> dict:
    """The main chain as a Responses payload `{id, model, object, output, usage}`.

    `model` is used as given, also when empty. Raises `ValueError` when there is no chain,
    when `per_request` produced several, or when no token was generated.
    """
    if not out.chains:
        raise ValueError("no safe trainable chain")
    if out.notes.builder == "per_request" and len(out.chains) > 1:
        raise ValueError(
            f"per_request built {len(out.chains)} chains; a single response needs exactly one"
        )
    main = _main_chain(out)
    if main.generated_tokens == 0:
        raise ValueError("the main chain generated no tokens")
    output = project_chain_to_output_items(main)
    generated = [item for item in output if item.get("generation_token_ids")]
    return {
        "id": f"proj-{rollout_id}",
        "model": model,
        "object": "response",
        "output": output,
        "usage": {
            "input_tokens": len(generated[0]["prompt_token_ids"]),
            "output_tokens": sum(len(item["generation_token_ids"]) for item in generated),
        },
    }


def assert_prefix_contiguity(response: Mapping[str, Any]) -> None:
    """Raise `AssertionError` unless every generated item's prompt extends all tokens before it.

    Takes the whole response; every output item with `generation_token_ids` is checked.
    """
    if not isinstance(response, Mapping):
        raise TypeError(
            "assert_prefix_contiguity takes the whole response dict (with its `output` list), "
            f"not {type(response).__name__}"
        )
    seen_prompt: list[int] = []
    seen_generation: list[int] = []
    for position, item in enumerate(response.get("output") or []):
        if not isinstance(item, Mapping) or item.get("generation_token_ids") is None:
            continue
        generation = item["generation_token_ids"]
        prompt = item.get("prompt_token_ids") or []
        prompt = prompt if isinstance(prompt, list) else list(prompt)
        cut = len(seen_prompt)
        if (
            len(prompt) < cut + len(seen_generation)
            or prompt[:cut] != seen_prompt
            or prompt[cut : cut + len(seen_generation)] != seen_generation
        ):
            raise AssertionError(
                f"output item {position} breaks prefix contiguity: its prompt does not extend "
                "the tokens of the items before it"
            )
        seen_prompt = prompt
        seen_generation = generation if isinstance(generation, list) else list(generation)
