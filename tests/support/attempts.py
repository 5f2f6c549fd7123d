"""Captures that mix two attempts of one rollout id, as a dispatch loop without its clear leaves.

`write_mixed_attempts` captures an earlier attempt (never finalized nor cleared: calls
`old-*`, made earlier) and then the current attempt (`new-*`) under one rollout id, with no
dispatch-time clear between or before them. Each attempt is one chain of three calls.
`captured_keys` lists what a clear removes: a rollout's objects but its attempt marker.
"""

from __future__ import annotations

import random
from typing import Any

from capture_core.records import TokenEntry
from tests.support.token_calls import token_call

VOCAB = 50_000


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(1, VOCAB) for _ in range(n)]


def attempt_calls(
    rollout_id: str, tag: str, first_prompt: list[int], created_at: float
) -> list[TokenEntry]:
    """One attempt: a chain of three calls `tag-0..2`, captured from `created_at` on."""
    rng = random.Random(f"{rollout_id}:{tag}")
    calls, prompt = [], first_prompt
    for turn in range(3):
        generation = _tokens(rng, 6)
        calls.append(
            token_call(
                f"{tag}-{turn}",
                prompt,
                generation,
                rollout_id=rollout_id,
                created_at=created_at + turn,
            )
        )
        prompt = prompt + generation + _tokens(rng, 4)
    return calls


def write_mixed_attempts(store: Any, rollout_id: str, *, shared_first_prompt: bool) -> None:
    """Capture the earlier attempt, then the current one, with no clear: six calls, two chains.

    `shared_first_prompt`: both attempts start from the same prompt (the task's), as a
    re-dispatch of one task does; otherwise the earlier attempt's first prompt differs.
    """
    rng = random.Random(rollout_id)
    current = _tokens(rng, 12)
    earlier = current if shared_first_prompt else _tokens(rng, 12)
    calls = attempt_calls(rollout_id, "old", earlier, 1_000.0)
    calls += attempt_calls(rollout_id, "new", current, 2_000.0)
    for call in calls:
        store.put_now(call)


def captured_keys(byte_store: Any, rollout_id: str) -> list[str]:
    """A rollout's stored objects other than the attempt marker the dispatch-time clear
    leaves: empty once the rollout was cleared and nothing was captured since."""
    return [key for key in byte_store.list_prefix(rollout_id) if key != f"{rollout_id}/ATTEMPT"]
