"""Builder and terminal test helpers: captured calls spelled by their tokens, a deep rollout."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from capture_core.records import TokenEntry
from capture_core.testing.synthetic import RolloutShape, synthetic_rollout


def token_call(
    call_id: str,
    prompt: list[int],
    generation: list[int],
    *,
    rollout_id: str = "r",
    log_prob: float = -0.5,
    **fields: Any,
) -> TokenEntry:
    """A captured call with one `log_prob` per generated token; `fields` set any other field."""
    return TokenEntry(
        rollout_id=rollout_id,
        model_call_id=call_id,
        prompt_token_ids=prompt,
        generation_token_ids=generation,
        generation_log_probs=[log_prob] * len(generation),
        **fields,
    )


DEEP_TURNS = 1500


def deep_rollout() -> list[TokenEntry]:
    """A `DEEP_TURNS`-turn rollout `r`: ten times deeper than `shallow_stack` allows frames."""
    shape = RolloutShape(turns=DEEP_TURNS, prompt_tokens=16, generated_tokens=2, tool_tokens=1)
    return synthetic_rollout("r", shape)


@contextmanager
def shallow_stack(limit: int = 150) -> Iterator[None]:
    """Lower the recursion limit for the block, so a build that recurses per call fails."""
    previous = sys.getrecursionlimit()
    sys.setrecursionlimit(limit)
    try:
        yield
    finally:
        sys.setrecursionlimit(previous)


NEVER_GENERATED = [901, 902, 903]
"""Ids a foreign content item claims were generated (`with_foreign_item`); no call did."""


def with_foreign_item(entry: TokenEntry) -> TokenEntry:
    """`entry` with a reasoning item after its carrier holding token arrays of its own: the
    entry's whole sequence as prompt and `NEVER_GENERATED` with log probs, so a projection
    that copied them would stay prefix-contiguous and train them."""
    foreign = {
        "type": "reasoning",
        "summary": [],
        "prompt_token_ids": entry.prompt_token_ids + entry.generation_token_ids,
        "generation_token_ids": NEVER_GENERATED,
        "generation_log_probs": [-0.01, -0.02, -0.03],
    }
    return entry.model_copy(update={"output_items": [*entry.output_items, foreign]})
