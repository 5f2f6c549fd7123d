"""A seeded policy's calls, recorded as a model server's writer would: one place makes entries.

`SeededWriter` keeps one rollout's clock and its captured entries, and draws from the
rollout's own `random.Random` everything a served call gets: its time, its call id, its
sampling log probs, a label of its text and the id of the response it was served under.
Each draw is a separate step, so a generator keeps the order its seeds were drawn in and
every seeded capture stays what it was. `agent_captures` and `trace_shapes` build on it.
This module imports only `capture_core.records`.
"""

from __future__ import annotations

import random
from typing import Any

from capture_core.records import TokenEntry


def assistant_message(text: str) -> dict[str, Any]:
    """An assistant message output item holding `text`."""
    return {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text}],
    }


class SeededWriter:
    """Serves one rollout's calls from a seeded policy and keeps what its writer captured."""

    def __init__(self, rollout_id: str, rng: random.Random) -> None:
        self.rollout_id, self.rng = rollout_id, rng
        self.entries: list[TokenEntry] = []
        self.clock = 1_000.0

    def tick(self) -> None:
        """Advance the clock to the next call's time."""
        self.clock += self.rng.uniform(0.5, 3.0)

    def call_id(self) -> str:
        """A fresh call id."""
        return f"call-{self.rng.getrandbits(40):010x}"

    def words(self, label: str) -> str:
        """`label` made unique, as a model's text of that kind."""
        return f"{label} {self.rng.getrandbits(48):012x}"

    def log_probs(self, generation: list[int]) -> list[float]:
        """Sampling-time log probs for `generation`."""
        return [-round(self.rng.random() * 4, 5) for _ in generation]

    def record(
        self,
        call_id: str,
        prompt: list[int],
        generation: list[int],
        log_probs: list[float],
        items: list[dict[str, Any]],
        **extra: Any,
    ) -> TokenEntry:
        """Capture the call at the current time under a fresh served response id; `extra`
        fields (writer-recorded parents, say) go onto the entry as they are."""
        entry = TokenEntry(
            rollout_id=self.rollout_id,
            model_call_id=call_id,
            model="policy",
            prompt_token_ids=prompt,
            generation_token_ids=generation,
            generation_log_probs=log_probs,
            output_items=items,
            token_item_index=len(items) - 1,
            created_at=self.clock,
            response_id=f"resp_{self.rng.getrandbits(64):016x}",
            **extra,
        )
        self.entries.append(entry)
        return entry
