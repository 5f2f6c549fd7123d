"""Trajectories from a frozen snapshot: the builders, and the one entry point that names them.

`prefix_merging` links each call to the earlier call whose prompt-plus-generation is the
longest prefix of its prompt (`forest.CallForest`); `per_request` makes one chain per call.
Both are independent of capture order, and nothing here recurses, so rollouts of thousands
of turns build in one pass.
A terminal call anchors the build: the main chain is the path from its root to it.
The builder types live in `chain` and the projection into a response in `projection`; the
package `capture_core.builder` exports them with the builders, as NeMo Gym's API names them.
"""

from __future__ import annotations

from collections.abc import Iterable

from capture_core.builder.chain import BuildNotes, BuildOutput, Chain, ChainLink
from capture_core.builder.forest import CallForest, call_order, link_chain, main_first
from capture_core.builder.identical_calls import collapse_identical
from capture_core.builder.terminal import CHAIN_BROKEN, CHAIN_DELIVERED, CHAIN_NOT_CAPTURED
from capture_core.errors import InvalidInputError, WrongTypeError
from capture_core.records import TokenEntry

__all__ = ["BUILDERS", "per_request", "prefix_merging", "run_builder"]

BUILDERS = ("prefix_merging", "per_request")


def _notes(
    builder: str, calls: list[TokenEntry], chains: list[Chain], roots: int, empty: list[str]
) -> BuildNotes:
    """The counts of a build; the main chain (first) is what is delivered."""
    captured = sum(len(c.generation_token_ids) for c in calls)
    delivered = chains[0].generated_tokens if chains else 0
    return BuildNotes(
        builder=builder,
        roots=roots,
        chains=len(chains),
        generated_tokens_captured=captured,
        generated_tokens_delivered=delivered,
        delivered_fraction=round(delivered / captured, 4) if captured else 0.0,
        empty_generation_calls=empty,
    )


def per_request(entries: Iterable[TokenEntry]) -> BuildOutput:
    """One chain per call (`req-<n>`), ordered by (prompt length, call id)."""
    ordered = sorted(entries, key=call_order)
    chains = [
        Chain(f"req-{i}", [ChainLink(e, [])], list(e.prompt_token_ids))
        for i, e in enumerate(ordered)
    ]
    empty = [e.model_call_id for e in ordered if not e.generation_token_ids]
    return BuildOutput(chains, [], _notes("per_request", ordered, chains, len(chains), empty))


def prefix_merging(
    entries: Iterable[TokenEntry], terminal_call_id: str | None = None
) -> BuildOutput:
    """Merge calls into prefix-contiguous chains; the main chain comes first.

    With `terminal_call_id` the main chain is the path from its root to that call; calls
    off the path are excluded (`notes.excluded_calls`) and `notes.terminal_chain` says
    whether the path was delivered, is broken or was not captured.
    """
    all_calls = list(entries)
    calls = sorted((e for e in all_calls if e.generation_token_ids), key=call_order)
    empty = sorted(e.model_call_id for e in all_calls if not e.generation_token_ids)
    known = frozenset(e.model_call_id for e in all_calls)
    forest = CallForest(calls, known, collapse=terminal_call_id is not None)
    if terminal_call_id is not None:
        return _anchored(calls, forest, terminal_call_id, empty)
    unresolved = forest.resolve_retries()
    paths = main_first(calls, forest.chains())
    chains = [
        link_chain(calls, path, "main" if n == 0 else f"branch-{n - 1}")
        for n, path in enumerate(paths)
    ]
    live_roots = {path[0] for path in paths} | {
        r for r in forest.children[None] if r not in forest.quarantined
    }
    out = _forest_output(calls, forest, chains, len(live_roots), empty)
    out.notes.unresolved_retries = unresolved
    return out


def _forest_output(
    calls: list[TokenEntry], forest: CallForest, chains: list[Chain], roots: int, empty: list[str]
) -> BuildOutput:
    """A `prefix_merging` output: counts, plus what the forest quarantined and why."""
    notes = _notes("prefix_merging", calls, chains, roots, empty)
    notes.contradicted_calls = sorted(calls[i].model_call_id for i in forest.contradicted)
    notes.ambiguous_calls = sorted(calls[i].model_call_id for i in forest.ambiguous)
    notes.lost_parents = {calls[i].model_call_id: p for i, p in sorted(forest.lost_parents.items())}
    quarantined = sorted(calls[i].model_call_id for i in forest.quarantined)
    return BuildOutput(chains, quarantined, notes)


def _anchored(
    calls: list[TokenEntry], forest: CallForest, terminal: str, empty: list[str]
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
    chains = [link_chain(calls, path, "main")] if status == CHAIN_DELIVERED else []
    on_path = set(path) if chains else set()
    roots = sum(1 for r in forest.children[None] if r not in forest.quarantined)
    out = _forest_output(calls, forest, chains, roots, empty)
    out.notes.terminal_chain = status
    out.notes.excluded_calls = sorted(
        c.model_call_id for i, c in enumerate(calls) if i not in on_path
    )
    return out


def run_builder(
    entries: Iterable[TokenEntry],
    builder: str = "prefix_merging",
    terminal_call_id: str | None = None,
) -> BuildOutput:
    """Run the named builder over a frozen snapshot's entries.

    `terminal_call_id` anchors `prefix_merging` to an attributed terminal call (`per_request`
    refuses it: it has no chain to anchor). An unknown name is a `ValueError` listing the
    known ones; the arguments in the wrong order (the name first) are a `TypeError` saying so.
    """
    if isinstance(entries, str):
        raise WrongTypeError(
            f"run_builder(entries, builder) takes the entries first; got the builder name "
            f"{entries!r} as the first argument. Call run_builder(entries, builder={entries!r})"
        )
    if builder == "prefix_merging":
        return prefix_merging(entries, terminal_call_id)
    if builder == "per_request" and terminal_call_id is None:
        return per_request(entries)
    if builder == "per_request":
        raise InvalidInputError(
            "per_request builds one chain per call; a terminal call needs prefix_merging"
        )
    raise InvalidInputError(f"unknown builder {builder!r}; use one of {', '.join(BUILDERS)}")
