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
