"""Captured model calls for builder and terminal tests, spelled by their tokens alone."""

from __future__ import annotations

from typing import Any

from capture_core.records import TokenEntry


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
