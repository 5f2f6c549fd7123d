"""Yield on realistic agent captures: how many healthy rollouts are delivered, and none wrong.

Captures come from `capture_core.testing.agent_captures` (seeded): plain chains, auxiliary
roots, sub-agent forks, middle and final retries (some with identical tokens, some with the
same answer from other tokens), a later call continuing the scored conversation, lost calls,
and scored responses as harnesses return them. Healthy and wrong are judged against the
generator's own scored chain, never against what the builder says. A healthy rollout whose
evidence fits two different chains alike (a same-answer retry of the final call that nothing
names) is undecidable: it is counted apart, and delivering it would be a guess. Each capture is
written to a `memory://` store (an intent per call; a lost call leaves only its intent),
finalized twice and deleted: without attribution (`trajectories_from_source`, the strict
single-chain policy) and with it (`finalize_rollout_token_capture` on the finished record).
Both kinds of capture are reported: with NeMo Gym 0.7.0's writer parent fields and without.
Prints figures; asserts nothing. Usage: .venv/bin/python -m bench.yield_bench [--rollouts N]
[--seed S] [--misses]"""

from __future__ import annotations

import argparse
import asyncio
import copy
import logging
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field

from capture_core.consumer import trajectories_from_source
from capture_core.delivery import finalize_rollout_token_capture
from capture_core.store import TokenCaptureStore
from capture_core.testing.agent_captures import (
    AgentRollout,
    agent_rollouts,
    delivered_tokens,
    scored_tokens,
    write_capture,
)


@dataclass
class Tally:
    """Outcomes of one mode over one kind of capture.

    `healthy` counts the deliverable rollouts (no call lost, the scored chain decidable);
    `undecidable` the healthy ones whose evidence fits two chains alike, kept apart.
    """

    healthy: int = 0
    healthy_delivered: int = 0
    undecidable: int = 0
    undecidable_delivered: int = 0
    wrong_chain: int = 0
    unhealthy_delivered: int = 0
    methods: Counter = field(default_factory=Counter)
    masked_shapes: Counter = field(default_factory=Counter)
    misses: list[str] = field(default_factory=list)

    def add(
        self, rollout: AgentRollout, output: list | None, masked: bool, method: str, why: str = ""
    ) -> None:
        delivered = output is not None and not masked
        self.methods[method or "none"] += 1
        if rollout.deliverable:
            self.healthy += 1
            self.healthy_delivered += delivered
            if not delivered:
                self.masked_shapes.update(rollout.shapes)
                self.misses.append(
                    f"{rollout.rollout_id} {rollout.shapes} {_shape(rollout)}: {why}"
                )
        elif rollout.healthy:
            self.undecidable += 1
            self.undecidable_delivered += delivered
        elif delivered:
            self.unhealthy_delivered += 1
        if delivered and delivered_tokens(output) != scored_tokens(rollout):  # type: ignore[arg-type]
            self.wrong_chain += 1

    @property
    def fraction(self) -> float:
        return self.healthy_delivered / self.healthy if self.healthy else 0.0


def _shape(rollout: AgentRollout) -> str:
    """How the scored response reads: dialect, served id or not, and how it ends."""
    response, terminal = rollout.record["response"], rollout.scored_chain[-1]
    served = "served id" if response.get("id") == terminal.response_id else "no served id"
    items = response.get("output") or []
    dialect = "chat" if "choices" in response else f"{len(items)} items"
    ends = f"ends in {items[-1].get('type')}" if items else ""
    given = [
        k for k in ("_ng_terminal_model_call_id", "terminal_response_id") if k in rollout.record
    ]
    return f"[{dialect}, {served}, {ends}, {given or 'no terminal given'}]"


async def _strict(rollout: AgentRollout, store: TokenCaptureStore, tally: Tally) -> None:
    built = await trajectories_from_source(rollout.rollout_id, store)
    assert built is not None
    response = built.get("rebuilt_response")
    tally.add(rollout, response and response["output"], bool(built["mask_sample"]), "")


async def _attributed(rollout: AgentRollout, store: TokenCaptureStore, tally: Tally) -> None:
    record = copy.deepcopy(rollout.record)
    built = await finalize_rollout_token_capture(record, store)
    assert built is not None
    output = record["response"].get("output") if built.get("rebuilt_response") else None
    capture = record["_ng_token_capture"]
    terminal = capture.get("terminal_attribution", {})
    why = f"{terminal} {capture.get('error', '')}"
    tally.add(rollout, output, bool(record.get("mask_sample")), terminal.get("method", ""), why)


async def measure(rollouts: list[AgentRollout]) -> tuple[Tally, Tally]:
    """Write each capture, finalize it without and with attribution, then delete it.

    Deleting keeps the in-memory filesystem small, so listing it stays cheap.
    """
    store = TokenCaptureStore(f"memory://yield-{uuid.uuid4().hex[:12]}")
    strict, attributed = Tally(), Tally()
    for rollout in rollouts:
        write_capture(store, rollout)
        await _strict(rollout, store, strict)
        await _attributed(rollout, store, attributed)
        store.delete(rollout.rollout_id)
    return strict, attributed


def _row(kind: str, mode: str, tally: Tally) -> str:
    return (
        f"| {kind} | {mode} | {tally.healthy_delivered}/{tally.healthy} = {tally.fraction:.1%} "
        f"| {tally.undecidable_delivered}/{tally.undecidable} "
        f"| {tally.wrong_chain} | {tally.unhealthy_delivered} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--misses", action="store_true", help="print why each healthy rollout was not delivered"
    )
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    lines = [
        "| capture | mode | healthy delivered | undecidable delivered | wrong chain delivered "
        "| unhealthy delivered |",
        "|---|---|---|---|---|---|",
    ]
    details = []
    for parent_fields in (True, False):
        kind = "with parent fields" if parent_fields else "without parent fields"
        started = time.perf_counter()
        rollouts = agent_rollouts(args.rollouts, seed=args.seed, parent_fields=parent_fields)
        strict, attributed = asyncio.run(measure(rollouts))
        lines += [_row(kind, "no attribution", strict), _row(kind, "attribution", attributed)]
        shapes = Counter(shape for r in rollouts for shape in r.shapes)
        details += [
            f"{kind}: {len(rollouts)} rollouts ({time.perf_counter() - started:.1f} s); "
            f"shapes {dict(sorted(shapes.items()))}",
            f"  attributed by {dict(sorted(attributed.methods.items()))}",
            f"  healthy masked with attribution, by shape: {dict(attributed.masked_shapes)}",
        ]
        if args.misses:
            details += [f"    {miss}" for miss in attributed.misses]
    print("\n".join(lines))
    print()
    print("\n".join(details))


if __name__ == "__main__":
    main()
