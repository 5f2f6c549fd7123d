"""Multi-trace delivery against the main chain, on the same captures in the same run.

Captures come from `testing/trace_shapes` (seeded): stripped thinking history, compaction,
sub-agents, forks, parallel samples, plain chains with a resolved retry, an abandoned retry
of the scored call, and lost calls. Each is written to a local store after the dispatch-time
clear of its id (an intent per call; a lost call leaves only its intent). Every rollout is
finalized from that store with both deliveries (`finalize_rollout_token_capture`,
`delivery="main_chain"` and `"all_traces"`), and its record encoded as the part line it
becomes. Judged against the generator's truth:
per shape, the share of healthy episodes' sampled tokens trained exactly once; calls owned
twice; abandoned tries trained; rollouts with a lost call trained. Every delivered envelope
is checked again as a consumer would (`check_envelope` against the frozen capture).
Time, in CPU seconds of the process (the machine is shared): finalize (freeze, read, build,
check, encode) of all rollouts per delivery, sides alternating over the repetitions; and the
in-memory build alone (`assemble` of either delivery over the entries already read),
also alternating, with the envelope check inside it (`check_envelope` against the capture, as
the build runs it before handoff) timed on its own as a third side, and the build per shape.
Prints figures; asserts nothing.
Usage: .venv/bin/python -m bench.traces_bench [--per-shape N] [--seed S] [--scale K]
       [--repetitions R]
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import logging
import statistics
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import orjson

from bench.ratios import alternate, alternate_sides, describe_seconds
from capture_core.builder.snapshot import assemble
from capture_core.builder.terminal import TerminalInputs
from capture_core.builder.trace_envelope import (
    ALL_TRACES,
    ENVELOPE_KEY,
    TraceEnvelopeError,
    check_envelope,
)
from capture_core.delivery import finalize_rollout_token_capture
from capture_core.run.capture_source import clear_captures
from capture_core.store import TokenCaptureStore
from capture_core.testing.agent_captures import AgentRollout, agent_rollouts, write_capture
from capture_core.testing.trace_shapes import SHAPES, Episode, episodes, write_episode


@dataclass
class ShapeTally:
    """What each delivery trained of one shape's episodes."""

    sampled: int = 0
    main_chain: int = 0
    all_traces: int = 0
    rollouts: int = 0


@dataclass
class Tally:
    shapes: dict[str, ShapeTally] = field(default_factory=dict)
    owned_twice: int = 0
    abandoned_trained: int = 0
    lost_trained: int = 0
    envelopes: int = 0
    envelopes_refused: int = 0
    masked_healthy: Counter = field(default_factory=Counter)


def _main_chain_trained(ep: Episode, record: dict) -> int:
    """Tokens of used calls the main chain delivers (nothing when masked)."""
    if record.get("mask_sample"):
        return 0
    used = {
        (len(e.prompt_token_ids), tuple(e.generation_token_ids))
        for e in ep.entries
        if e.model_call_id in ep.used
    }
    return sum(
        len(item["generation_token_ids"])
        for item in record["response"].get("output") or []
        if item.get("generation_token_ids")
        and (len(item["prompt_token_ids"]), tuple(item["generation_token_ids"])) in used
    )


def _judge_traces(ep: Episode, record: dict, store: TokenCaptureStore, tally: Tally) -> int:
    """Tokens of used calls the envelope owns; counts what must never happen."""
    envelope = record.get(ENVELOPE_KEY)
    if envelope is None:
        if ep.healthy:
            error = (record.get("_ng_token_capture") or {}).get("error") or "masked"
            tally.masked_healthy[f"{ep.shape}: {error[:70]}"] += 1
        return 0
    tally.envelopes += 1
    calls = {e.model_call_id: e for e in store.freeze_now(ep.rollout_id).entries}
    try:
        check_envelope(envelope, ep.rollout_id, calls=calls)
    except TraceEnvelopeError:
        tally.envelopes_refused += 1
        return 0
    owned = [s["model_call_id"] for t in envelope["traces"] for s in t["sampled_spans"]]
    tally.owned_twice += len(owned) - len(set(owned))
    tally.abandoned_trained += len(set(owned) & ep.abandoned)
    if not ep.healthy:
        tally.lost_trained += 1
        return 0
    return sum(len(calls[c].generation_token_ids) for c in set(owned) & ep.used)


async def _finalize_all(eps: list[Episode], store: TokenCaptureStore, delivery: str) -> list:
    records = [copy.deepcopy(ep.record) for ep in eps]
    for record in records:
        await finalize_rollout_token_capture(record, store, delivery=delivery)
        orjson.dumps(record)
    return records


def measure(eps: list[Episode], store: TokenCaptureStore) -> Tally:
    tally = Tally(shapes={shape: ShapeTally() for shape in SHAPES})
    main = asyncio.run(_finalize_all(eps, store, "main_chain"))
    traced = asyncio.run(_finalize_all(eps, store, "all_traces"))
    for ep, main_record, traces_record in zip(eps, main, traced, strict=True):
        shape = tally.shapes[ep.shape]
        shape.rollouts += 1
        shape.sampled += ep.sampled_tokens()
        shape.main_chain += _main_chain_trained(ep, main_record) if ep.healthy else 0
        shape.all_traces += _judge_traces(ep, traces_record, store, tally)
    return tally


def _timed(action) -> float:
    """CPU seconds of the process (all threads): a shared machine's other jobs do not count."""
    started = time.process_time()
    action()
    return time.process_time() - started


def time_sides(eps: list[Episode], store: TokenCaptureStore, repetitions: int) -> dict:
    """Seconds per repetition: finalize from the store, and the in-memory build alone."""
    entries = [list(store.freeze_now(ep.rollout_id).entries) for ep in eps]
    inputs = [TerminalInputs.from_record(ep.record) for ep in eps]
    pairs = list(zip(eps, entries, inputs, strict=True))

    def build_main(chosen: list = pairs) -> None:
        for ep, calls, terminal in chosen:
            assemble(ep.rollout_id, calls, "prefix_merging", "", terminal)

    def build_traces(chosen: list = pairs) -> None:
        for ep, calls, terminal in chosen:
            assemble(ep.rollout_id, calls, "prefix_merging", "", terminal, delivery=ALL_TRACES)

    built = [
        (ep.rollout_id, result.training_traces, {c.model_call_id: c for c in calls})
        for ep, calls, terminal in pairs
        if (
            result := assemble(
                ep.rollout_id, calls, "prefix_merging", "", terminal, delivery=ALL_TRACES
            )
        ).training_traces
    ]

    def check_traces() -> None:
        for rollout_id, envelope, calls in built:
            check_envelope(envelope, rollout_id, calls=calls, calls_finite=True)

    finalize = alternate_sides(
        {
            "main_chain": lambda: _timed(
                lambda: asyncio.run(_finalize_all(eps, store, "main_chain"))
            ),
            "all_traces": lambda: _timed(
                lambda: asyncio.run(_finalize_all(eps, store, "all_traces"))
            ),
        },
        repetitions,
    )
    build = alternate_sides(
        {
            "main_chain": lambda: _timed(build_main),
            "all_traces": lambda: _timed(build_traces),
            "envelope check": lambda: _timed(check_traces),
        },
        repetitions,
    )
    by_shape = {
        shape: alternate(
            lambda chosen=chosen: _timed(lambda: build_main(chosen)),
            lambda chosen=chosen: _timed(lambda: build_traces(chosen)),
            repetitions,
        )
        for shape in SHAPES
        if (chosen := [pair for pair in pairs if pair[0].shape == shape])
    }
    return {"finalize": finalize, "build": build, "build by shape": by_shape}


def _share(trained: int, sampled: int) -> str:
    return f"{100 * trained / sampled:6.2f}%" if sampled else "     - "


def report(tally: Tally, seconds: dict, eps: list[Episode]) -> None:
    print("| shape | rollouts | sampled tokens | main_chain trained | all_traces trained |")
    print("|---|---|---|---|---|")
    totals = ShapeTally()
    for name, shape in tally.shapes.items():
        main, traces = (
            _share(shape.main_chain, shape.sampled),
            _share(shape.all_traces, shape.sampled),
        )
        print(f"| {name} | {shape.rollouts} | {shape.sampled} | {main} | {traces} |")
        totals.sampled += shape.sampled
        totals.main_chain += shape.main_chain
        totals.all_traces += shape.all_traces
    healthy = sum(ep.healthy for ep in eps)
    main, traces = (
        _share(totals.main_chain, totals.sampled),
        _share(totals.all_traces, totals.sampled),
    )
    print(f"| **healthy, all shapes** | {healthy} | {totals.sampled} | {main} | {traces} |")
    print()
    print(
        f"envelopes delivered {tally.envelopes}, refused by a consumer's check "
        f"{tally.envelopes_refused}"
    )
    print(f"calls owned twice {tally.owned_twice}")
    print(f"abandoned tries trained {tally.abandoned_trained}")
    print(f"rollouts with a lost call trained {tally.lost_trained}")
    for reason, count in tally.masked_healthy.most_common(5):
        print(f"healthy masked: {reason} ({count})")
    print()
    tokens = sum(
        len(e.prompt_token_ids) + len(e.generation_token_ids) for ep in eps for e in ep.entries
    )
    print(f"{len(eps)} rollouts, {tokens} captured prompt+generation tokens")
    by_shape = seconds.pop("build by shape")
    for kind, sides in seconds.items():
        main, traces = sides["main_chain"], sides["all_traces"]
        ratios = [t / m for t, m in zip(traces, main, strict=True)]
        print(
            f"{kind}: main_chain {describe_seconds(main)}, all_traces {describe_seconds(traces)}, "
            f"ratio {statistics.median(ratios):.2f}x (range {min(ratios):.2f}-{max(ratios):.2f})"
        )
        if "envelope check" in sides:
            check = sides["envelope check"]
            shares = [c / m for c, m in zip(check, main, strict=True)]
            print(
                f"  of which the envelope check {describe_seconds(check)}, "
                f"{statistics.median(shares):.2f}x the main chain's build "
                f"(range {min(shares):.2f}-{max(shares):.2f})"
            )
    print(
        "build by shape (all_traces vs main_chain, median of the alternated repetitions): "
        + ", ".join(f"{shape} {ratio.median:.2f}x" for shape, ratio in by_shape.items())
    )


@dataclass
class MixTally:
    """All_traces on the `agent_captures` busy-harness mix, judged by its scored chains."""

    deliverable: int = 0
    delivered: int = 0
    scored_calls_trained: int = 0
    scored_calls: int = 0
    abandoned_trained: int = 0
    lost_trained: int = 0
    undecidable_trained: int = 0


def _tokens(entry: Any) -> tuple:
    """A call's prompt and generation: identical calls train the same tokens."""
    return (tuple(entry.prompt_token_ids), tuple(entry.generation_token_ids))


def _abandoned(rollout: AgentRollout) -> set[str]:
    """Tries of a scored turn that were not kept, unless identical to the kept one."""
    kept = {_tokens(e) for e in rollout.scored_chain}
    prompts = {tuple(e.prompt_token_ids) for e in rollout.scored_chain}
    return {
        e.model_call_id
        for e in rollout.entries
        if tuple(e.prompt_token_ids) in prompts and _tokens(e) not in kept
    }


def measure_mix(n: int, seed: int, root: str) -> MixTally:
    tally = MixTally()
    store = TokenCaptureStore(root)
    for rollout in agent_rollouts(n, seed=seed):
        clear_captures(store, [rollout.rollout_id])  # the dispatch-time clear marks the attempt
        write_capture(store, rollout)
        record = copy.deepcopy(rollout.record)
        asyncio.run(finalize_rollout_token_capture(record, store, delivery="all_traces"))
        envelope = record.get(ENVELOPE_KEY)
        owned = (
            {s["model_call_id"] for t in envelope["traces"] for s in t["sampled_spans"]}
            if envelope
            else set()
        )
        tally.abandoned_trained += len(owned & _abandoned(rollout))
        tally.lost_trained += bool(envelope) and not rollout.healthy
        tally.undecidable_trained += bool(envelope) and rollout.healthy and not rollout.decidable
        if rollout.deliverable:
            tally.deliverable += 1
            tally.delivered += bool(envelope)
            tally.scored_calls += len(rollout.scored_chain)
            trained = {_tokens(e) for e in rollout.entries if e.model_call_id in owned}
            tally.scored_calls_trained += sum(_tokens(e) in trained for e in rollout.scored_chain)
    return tally


def report_mix(tally: MixTally, n: int) -> None:
    print(f"agent_captures mix, {n} rollouts, all_traces:")
    print(f"  deliverable rollouts delivered {tally.delivered}/{tally.deliverable}")
    print(f"  scored-chain calls trained {tally.scored_calls_trained}/{tally.scored_calls}")
    print(f"  abandoned tries trained {tally.abandoned_trained}")
    print(f"  rollouts with a lost call trained {tally.lost_trained}")
    print(f"  undecidable rollouts trained {tally.undecidable_trained}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-shape", type=int, default=40, help="episodes per shape")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--scale", type=int, default=1, help="multiply every token count")
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--mix", type=int, default=400, help="agent_captures rollouts (0: none)")
    args = parser.parse_args()
    logging.disable(logging.WARNING)  # masked rollouts warn; the figures say it all
    eps = episodes(args.per_shape, seed=args.seed, scale=args.scale)
    with tempfile.TemporaryDirectory(prefix="tokcap-traces-") as root:
        store = TokenCaptureStore(root)
        for ep in eps:
            write_episode(store, ep)
        tally = measure(eps, store)
        seconds = time_sides(eps, store, args.repetitions)
        mix = measure_mix(args.mix, args.seed, f"{root}/mix") if args.mix else None
    report(tally, seconds, eps)
    if mix is not None:
        print()
        report_mix(mix, args.mix)


if __name__ == "__main__":
    main()
