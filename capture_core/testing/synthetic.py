"""Synthetic agentic rollouts for the demo, the tests and the benchmarks.

A rollout starts from a prompt of S tokens; each turn generates G tokens and appends I tool
tokens before the next call, the shape of a tool-using agent.
Options add a retried call, an auxiliary call with its own prompt, and calls without output.
Everything is deterministic for a given seed. This module imports only `records`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from capture_core.records import TokenEntry

__all__ = ["VOCAB", "RolloutShape", "interleaved", "rollout_record", "synthetic_rollout"]

VOCAB = 151_000


@dataclass(frozen=True)
class RolloutShape:
    """How to generate one rollout's capture."""

    turns: int = 4
    prompt_tokens: int = 64
    generated_tokens: int = 16
    tool_tokens: int = 8
    retried_turn: int | None = None
    auxiliary_call: bool = False
    model: str = "synthetic-policy"


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(VOCAB) for _ in range(n)]


def _call(
    rollout_id: str,
    call_id: str,
    prompt: list[int],
    gen: list[int],
    rng: random.Random,
    created_at: float,
    model: str,
    text: str,
) -> TokenEntry:
    return TokenEntry(
        rollout_id=rollout_id,
        model_call_id=call_id,
        model=model,
        prompt_token_ids=prompt,
        generation_token_ids=gen,
        generation_log_probs=[round(-rng.random() * 3, 6) for _ in gen],
        output_items=[
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": text}],
            }
        ],
        token_item_index=0,
        created_at=created_at,
    )


def synthetic_rollout(rollout_id: str, shape: RolloutShape, seed: int = 0) -> list[TokenEntry]:
    """The capture of one agent episode, in call order.

    A retried turn adds a failed attempt with the same prompt that nothing extends, which
    the builder resolves. An auxiliary call (a summariser, say) is a second root, which masks.
    """
    rng = random.Random(f"{rollout_id}:{seed}")
    entries: list[TokenEntry] = []
    prompt = _tokens(rng, shape.prompt_tokens)
    for turn in range(shape.turns):
        if turn == shape.retried_turn:
            failed = _tokens(rng, shape.generated_tokens)
            entries.append(
                _call(
                    rollout_id,
                    f"call-{turn:05d}-attempt-0",
                    prompt,
                    failed,
                    rng,
                    1000.0 + turn,
                    shape.model,
                    f"turn {turn}, dropped attempt",
                )
            )
        gen = _tokens(rng, shape.generated_tokens)
        entries.append(
            _call(
                rollout_id,
                f"call-{turn:05d}",
                prompt,
                gen,
                rng,
                1000.0 + turn + 0.5,
                shape.model,
                f"turn {turn}",
            )
        )
        prompt = prompt + gen + _tokens(rng, shape.tool_tokens)
    if shape.auxiliary_call:
        entries.append(_auxiliary_call(rollout_id, shape, rng))
    return entries


def interleaved(rollouts: list[list[TokenEntry]]) -> list[TokenEntry]:
    """Every rollout's calls in the order a busy model server writes them: each rollout's
    first call, then each one's second, and so on (calls of one rollout stay in order)."""
    longest = max((len(entries) for entries in rollouts), default=0)
    return [entries[i] for i in range(longest) for entries in rollouts if i < len(entries)]


def _auxiliary_call(rollout_id: str, shape: RolloutShape, rng: random.Random) -> TokenEntry:
    """A call with a prompt of its own (a summariser): a second root in the rollout."""
    aux_prompt = _tokens(rng, max(8, shape.prompt_tokens // 4))
    return _call(
        rollout_id,
        "aux-summary",
        aux_prompt,
        _tokens(rng, 8),
        rng,
        1000.0 + shape.turns,
        shape.model,
        "auxiliary summary",
    )


def rollout_record(task_index: int, rollout_index: int, reward: float = 1.0) -> dict:
    """A finished rollout record as a harness writes it: ids, reward, a token-free response."""
    return {
        "_ng_task_index": task_index,
        "_ng_rollout_index": rollout_index,
        "reward": reward,
        "verifier": {"passed": reward > 0},
        "response": {
            "id": f"resp-{task_index}-{rollout_index}",
            "model": "synthetic-policy",
            "object": "response",
            "output": [
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "final answer"}],
                }
            ],
        },
    }
