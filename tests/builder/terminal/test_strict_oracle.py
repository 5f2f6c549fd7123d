"""Without a terminal the strict build is NeMo Gym's: checked against an oracle.

The oracle below is a brute-force reading of the prefix-merging rules (longest-prefix
parent, identical candidates quarantine the child under the first of them, retries kept by
extension, chains root to leaf), written independently of the builder. Captures are random,
with a tiny vocabulary so that shared prefixes, retries, ties and repeated call ids are common.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from capture_core.builder import prefix_merging
from capture_core.records import TokenEntry


@st.composite
def captures(draw: st.DrawFn) -> list[TokenEntry]:
    entries: list[TokenEntry] = []
    tokens = st.lists(st.integers(0, 2), max_size=3)
    for k in range(draw(st.integers(1, 9))):
        prompt = draw(tokens)
        if entries and draw(st.booleans()):
            base = draw(st.sampled_from(entries))
            whole = base.prompt_token_ids + base.generation_token_ids
            prompt = whole[: draw(st.integers(0, len(whole)))] + prompt
        generation = draw(tokens)
        entries.append(
            TokenEntry(
                rollout_id="r",
                model_call_id=f"c{draw(st.integers(0, k + 1))}",
                prompt_token_ids=prompt or [0],
                generation_token_ids=generation,
                generation_log_probs=[-0.5] * len(generation),
                created_at=draw(st.sampled_from([0.0, 1.0])),
                response_id=draw(st.sampled_from([None, "resp_1"])),
            )
        )
    return entries


def oracle(entries: list[TokenEntry]) -> tuple[list[tuple[int, ...]], list[str], list[str], int]:
    """Chains (as entry positions), quarantined ids, unresolved retry ids, live roots."""
    calls = sorted(
        (e for e in entries if e.generation_token_ids),
        key=lambda e: (len(e.prompt_token_ids), e.model_call_id),
    )
    whole = [c.prompt_token_ids + c.generation_token_ids for c in calls]
    children: dict[int | None, list[int]] = {None: []}
    quarantined: set[int] = set()
    for i, c in enumerate(calls):
        prompt = c.prompt_token_ids
        prefixes = [j for j in range(len(calls)) if j != i and prompt[: len(whole[j])] == whole[j]]
        longest = [j for j in prefixes if len(whole[j]) == max(len(whole[k]) for k in prefixes)]
        if len(longest) > 1:
            quarantined.add(i)  # under the first candidate, as in NeMo Gym: it is no leaf
        children.setdefault(longest[0] if longest else None, []).append(i)
    groups = [
        [i for i in kids if tuple(calls[i].prompt_token_ids) == prompt]
        for kids in children.values()
        for prompt in {tuple(calls[i].prompt_token_ids) for i in kids}
    ]
    unresolved: list[str] = []
    for group in sorted((g for g in groups if len(g) > 1), key=lambda g: -len(whole[g[0]])):
        kept = [i for i in group if any(k not in quarantined for k in children.get(i, []))]
        if not kept:
            kept = [min(group, key=lambda i: calls[i].model_call_id)]
            unresolved += [calls[i].model_call_id for i in group]
        quarantined.update(i for i in group if i not in kept)
    chains: list[tuple[int, ...]] = []
    stack = [(r,) for r in children[None] if r not in quarantined]
    while stack:
        path = stack.pop()
        kids = children.get(path[-1], [])
        chains += [path] if not kids else []
        stack += [(*path, k) for k in kids if k not in quarantined]
    ids = sorted(calls[i].model_call_id for i in quarantined)
    roots = sum(1 for r in children[None] if r not in quarantined)
    return sorted(chains), ids, sorted(unresolved), roots


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(captures())
def test_the_strict_build_matches_the_oracle(entries: list[TokenEntry]) -> None:
    built = prefix_merging(entries)
    calls = sorted(
        (e for e in entries if e.generation_token_ids),
        key=lambda e: (len(e.prompt_token_ids), e.model_call_id),
    )
    position = {id(c): n for n, c in enumerate(calls)}
    chains = sorted(tuple(position[id(link.entry)] for link in c.links) for c in built.chains)
    got = (chains, built.quarantined, sorted(built.notes.unresolved_retries), built.notes.roots)
    assert got == oracle(entries)
