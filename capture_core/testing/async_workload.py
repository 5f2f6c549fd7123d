"""A seeded asynchronous RL workload: episodes of very different lengths sampled while the
trainer updates the weights, each call carrying the versions that sampled it.

Episodes run their calls one after another on a simulated clock and all finish shortly
before the trainer reads them; the trainer publishes version `v` at time `v * update_every`
(in generated tokens of simulated time). A call is admitted at one version and may finish
at a later one: with `per_token` its tokens carry the version current when each was sampled
(a generation that spans an update, as interruptible generation makes), else the weights
change only between calls (`start == end`). Long episodes are the stalest, as in real
asynchronous training. Everything is deterministic for a seed. This module imports only
`capture_core.records` and `capture_core.testing.synthetic`.
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass

from capture_core.records import TokenEntry
from capture_core.records.provenance import PROVENANCE_FIELDS
from capture_core.testing.synthetic import RolloutShape, rollout_record, synthetic_rollout


@dataclass(frozen=True)
class AsyncWorkload:
    """How many episodes, their length range in turns, and how often the weights change."""

    episodes: int = 64
    turns: tuple[int, int] = (1, 24)
    generated_tokens: int = 256
    prompt_tokens: int = 512
    tool_tokens: int = 128
    update_every: int = 2048
    """Simulated time (generated tokens, all episodes together) between weight updates."""
    per_token: bool = True
    """Whether a generation may span an update (per-token versions) or only calls may."""
    finish_version: int = 8
    """The trainer's version when it reads the batch: every episode finished just before."""


@dataclass
class AsyncEpisode:
    """One episode: its calls with provenance, its rollout record, and its length."""

    rollout_id: str
    turns: int
    entries: list[TokenEntry]
    record: dict


def async_episodes(workload: AsyncWorkload, seed: int = 0) -> list[AsyncEpisode]:
    """The workload's episodes, each call stamped with the versions that sampled it.

    Every episode finishes within one update interval before the trainer reads the batch
    (at version `workload.finish_version`), so a long episode started long before: its
    first tokens are the stalest of the batch, as in a trainer that consumes what finished.
    """
    rng = random.Random(f"async:{seed}")
    episodes = []
    finish_by = workload.finish_version * workload.update_every
    for index in range(workload.episodes):
        turns = rng.randint(*workload.turns)
        shape = RolloutShape(
            turns=turns,
            prompt_tokens=workload.prompt_tokens,
            generated_tokens=workload.generated_tokens,
            tool_tokens=workload.tool_tokens,
        )
        rollout_id = f"{index}-0"
        plain = synthetic_rollout(rollout_id, shape, seed=seed)
        gaps = [rng.uniform(0, workload.tool_tokens) for _ in plain]
        took = sum(len(e.generation_token_ids) for e in plain) + sum(gaps)
        clock = max(0.0, finish_by - rng.uniform(0, workload.update_every) - took)
        stamped = []
        for entry, gap in zip(plain, gaps, strict=True):
            versions = _sampled_at(clock, len(entry.generation_token_ids), workload)
            clock += len(entry.generation_token_ids) + gap
            stamped.append(with_versions(entry, versions, workload.per_token))
        record = rollout_record(index, 0, reward=float(index % 2))
        episodes.append(AsyncEpisode(rollout_id, turns, stamped, record))
    return episodes


def _sampled_at(clock: float, tokens: int, workload: AsyncWorkload) -> list[int]:
    """The version current when each of `tokens` tokens from `clock` on was sampled."""
    if not workload.per_token:
        return [int(clock // workload.update_every)] * tokens
    return [int((clock + n) // workload.update_every) for n in range(tokens)]


def with_versions(entry: TokenEntry, versions: list[int], per_token: bool) -> TokenEntry:
    """The entry with its provenance: start and end, and per-token versions when they
    differ within the call and `per_token` asks for them."""
    start, end = (versions[0], versions[-1]) if versions else (0, 0)
    fields: dict = {"start_weight_version": start, "end_weight_version": end}
    fields["replica"] = f"replica-{zlib.crc32(entry.model_call_id.encode()) % 4}"
    if per_token and start != end:
        fields["generation_weight_versions"] = versions
    return TokenEntry.model_validate({**entry.wire_dump(), **fields})


def without_versions(episodes: list[AsyncEpisode]) -> list[list[TokenEntry]]:
    """The same calls without any provenance: the baseline of every figure."""
    return [[_plain(entry) for entry in episode.entries] for episode in episodes]


def _plain(entry: TokenEntry) -> TokenEntry:
    fields = entry.wire_dump()
    return TokenEntry.model_validate(
        {k: v for k, v in fields.items() if k not in PROVENANCE_FIELDS}
    )
