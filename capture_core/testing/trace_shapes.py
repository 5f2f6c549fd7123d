"""Seeded agent episodes of the shapes multi-trace delivery is for, with what must train.

Shapes: `thinking` (the chat template drops earlier reasoning, so every call is a root),
`compaction` (a summary replaces the history and a new root continues), `subagent` (an
independent root whose answer feeds the main agent), `fork` (two continuations off a middle
call), `parallel` (two samples from one prompt, both continued), `plain` (one chain with a
resolved retry), `abandoned` (a final call retried, the scored try named by its served id)
and `lost` (a call whose intent never completed: nothing of the rollout may train).
Each episode knows which calls the policy sampled for the episode (`used`) and which are
abandoned tries. Everything is deterministic for a seed.
This module imports only `capture_core.records`, `capture_core.run.capture_source` (the
dispatch-time clear), `capture_core.testing.seeded_writer` (the calls' entries) and
`capture_core.testing.synthetic` (the vocabulary size).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from capture_core.records import TokenEntry
from capture_core.run.capture_source import clear_captures
from capture_core.testing.seeded_writer import SeededWriter, assistant_message
from capture_core.testing.synthetic import VOCAB

SHAPES = ("thinking", "compaction", "subagent", "fork", "parallel", "plain", "abandoned", "lost")


@dataclass
class Episode:
    """One generated rollout: its capture, its finished record and the truth about its calls."""

    rollout_id: str
    shape: str
    entries: list[TokenEntry]
    record: dict[str, Any]
    used: set[str] = field(default_factory=set)
    abandoned: set[str] = field(default_factory=set)
    lost_call_ids: list[str] = field(default_factory=list)

    @property
    def healthy(self) -> bool:
        return not self.lost_call_ids

    def sampled_tokens(self) -> int:
        """Generated tokens of the calls that must train (0 for an unhealthy episode)."""
        if not self.healthy:
            return 0
        return sum(
            len(e.generation_token_ids) for e in self.entries if e.model_call_id in self.used
        )


class _Writer(SeededWriter):
    """Serves calls of one episode and records them as a model server's writer would."""

    def __init__(self, rollout_id: str, rng: random.Random, scale: int) -> None:
        super().__init__(rollout_id, rng)
        self.scale = scale

    def tokens(self, low: int, high: int) -> list[int]:
        return self.rng.choices(range(VOCAB), k=self.rng.randint(low, high) * self.scale)

    def serve(self, prompt: list[int], generation: list[int], text: str) -> TokenEntry:
        self.tick()
        call_id = self.call_id()  # drawn before the log probs and the text, as ever
        log_probs = self.log_probs(generation)
        items = [assistant_message(self.words(text))]
        return self.record(call_id, prompt, generation, log_probs, items)

    def turn(self, prompt: list[int], text: str = "turn") -> TokenEntry:
        return self.serve(prompt, self.tokens(8, 40), text)


def _chain(w: _Writer, prompt: list[int], turns: int) -> list[TokenEntry]:
    calls = []
    for _ in range(turns):
        call = w.turn(prompt)
        calls.append(call)
        prompt = prompt + call.generation_token_ids + w.tokens(10, 60)
    return calls


def _next_prompt(w: _Writer, call: TokenEntry) -> list[int]:
    return call.prompt_token_ids + call.generation_token_ids + w.tokens(10, 60)


def _thinking(w: _Writer, turns: int) -> list[TokenEntry]:
    """Generation = reasoning + answer; the next prompt keeps the answer only."""
    prompt, calls = w.tokens(60, 200), []
    for _ in range(turns):
        reasoning, answer = w.tokens(20, 120), w.tokens(8, 40)
        call = w.serve(prompt, reasoning + answer, "answer")
        calls.append(call)
        prompt = prompt + answer + w.tokens(10, 60)
    return calls


def _compaction(w: _Writer, turns: int) -> list[TokenEntry]:
    """A chain, a summary call over its history, a new root holding only the summary."""
    first = _chain(w, w.tokens(60, 200), turns)
    summary = w.turn(_next_prompt(w, first[-1]), "summary")
    fresh = w.tokens(20, 40) + summary.generation_token_ids + w.tokens(10, 30)
    return [*first, summary, *_chain(w, fresh, turns)]


def _subagent(w: _Writer, turns: int) -> list[TokenEntry]:
    """A sub-agent's own chain; its last answer arrives in the main agent's next prompt."""
    head = _chain(w, w.tokens(60, 200), max(1, turns // 2))
    sub = _chain(w, w.tokens(40, 120), w.rng.randint(1, 3))
    prompt = _next_prompt(w, head[-1]) + sub[-1].generation_token_ids + w.tokens(5, 10)
    return [*head, *sub, *_chain(w, prompt, max(1, turns - len(head)))]


def _fork(w: _Writer, turns: int) -> list[TokenEntry]:
    """Two continuations off a middle call, each with its own tool output."""
    head = _chain(w, w.tokens(60, 200), max(1, turns // 2))
    left = _chain(w, _next_prompt(w, head[-1]), max(1, turns - len(head)))
    right = _chain(w, _next_prompt(w, head[-1]), w.rng.randint(1, 3))
    return [*head, *left, *right]


def _parallel(w: _Writer, turns: int) -> list[TokenEntry]:
    """Two samples from one prompt, each continued (best-of-n explored, both used)."""
    head = _chain(w, w.tokens(60, 200), max(1, turns // 2))
    prompt = _next_prompt(w, head[-1])
    samples = [w.turn(prompt, "sample"), w.turn(prompt, "sample")]
    tails = [_chain(w, _next_prompt(w, s), w.rng.randint(1, 3)) for s in samples]
    return [*head, *samples, *tails[0], *tails[1]]


def _retried_chain(w: _Writer, turns: int, episode: Episode) -> list[TokenEntry]:
    """A chain with one middle call retried: the abandoned try is extended by nothing."""
    prompt, calls = w.tokens(60, 200), []
    retry_at = w.rng.randrange(max(1, turns - 1))
    for turn in range(turns):
        if turn == retry_at:
            episode.abandoned.add(w.turn(prompt, "retry").model_call_id)
        call = w.turn(prompt)
        calls.append(call)
        prompt = prompt + call.generation_token_ids + w.tokens(10, 60)
    return calls


def _abandoned_final(w: _Writer, turns: int, episode: Episode) -> list[TokenEntry]:
    """A chain whose final call was retried; the record's response id names the kept try."""
    calls = _chain(w, w.tokens(60, 200), turns)
    final = calls[-1]
    episode.abandoned.add(w.turn(final.prompt_token_ids, "retry").model_call_id)
    return calls


def episode(index: int, shape: str, *, seed: int = 0, scale: int = 1) -> Episode:
    """One episode of `shape`; `scale` multiplies every token count (longer rollouts)."""
    rollout_id = f"{index // 8}-{index % 8}"
    rng = random.Random(f"{seed}:{shape}:{rollout_id}")
    w = _Writer(rollout_id, rng, scale)
    turns = rng.randint(2, 10)
    ep = Episode(rollout_id, shape, [], {})
    builders = {
        "thinking": _thinking,
        "compaction": _compaction,
        "subagent": _subagent,
        "fork": _fork,
        "parallel": _parallel,
    }
    if shape in builders:
        used = builders[shape](w, turns)
    elif shape == "abandoned":
        used = _abandoned_final(w, turns, ep)
    else:
        used = _retried_chain(w, turns, ep)
    terminal = used[-1]
    ep.used = {c.model_call_id for c in used}
    if shape == "lost":
        victim = rng.choice(w.entries)
        ep.lost_call_ids = [victim.model_call_id]
    ep.entries = [e for e in w.entries if e.model_call_id not in ep.lost_call_ids]
    ep.record = {
        "_ng_task_index": index // 8,
        "_ng_rollout_index": index % 8,
        "reward": round(rng.random(), 3),
        "response": {
            "id": terminal.response_id,
            "model": "policy",
            "object": "response",
            "output": [{"type": "message", "role": "user", "content": "task"}]
            + [dict(item) for item in terminal.output_items],
        },
    }
    return ep


def episodes(n_per_shape: int, *, seed: int = 0, scale: int = 1) -> list[Episode]:
    """`n_per_shape` episodes of every shape, rollout ids unique across the whole list."""
    return [
        episode(k * n_per_shape + i, shape, seed=seed, scale=scale)
        for k, shape in enumerate(SHAPES)
        for i in range(n_per_shape)
    ]


def write_episode(store: Any, ep: Episode) -> None:
    """Dispatch and capture an episode: the dispatch-time clear of its rollout id (which marks
    the attempt), then, as a model server would, an intent per call and its entry."""
    clear_captures(store, [ep.rollout_id])
    for call_id in ep.lost_call_ids:
        store.begin_call_now(ep.rollout_id, call_id)
    for entry in ep.entries:
        store.begin_call_now(ep.rollout_id, entry.model_call_id)
        store.put_now(entry)
