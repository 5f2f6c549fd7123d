"""Orchestration overhead: `finalize_run` versus the same work through plain capture_core calls.

Both sides plan, finalize, hand off and retire the same rollouts (stores built from the same
seeds, captured afresh before each side, not timed), alternated over the repetitions in the
same run. The Prefect server is started first and its start-up is reported separately.
Each repetition captures into a fresh store folder and hands off as a new run id to its
side's one destination, as the runs of a training job do; each side's first run at its
destination (the flow's also saves the destination's receipt storage block) runs and is
reported before the repetitions. Everything is removed at the end (see
`bench/store_bench.py` on why).
A third side, for attribution only, runs the flow with Prefect's flow-run heartbeat off
(`PREFECT_FLOWS_HEARTBEAT_FREQUENCY` unset for that call): Prefect 3.9's heartbeat thread
sleeps in whole seconds and the engine joins it when a sync flow run ends, so every run
waits up to 1 s after its last step (docs/perf.md). The goal figure keeps Prefect's default.
Prints the time ratios to the plain calls (median and range); asserts nothing.
Usage: .venv/bin/python -m bench.pipeline_bench [--rollouts N] [--batch-size B] [--repetitions R]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import orjson

from bench import filesystem
from bench.ratios import Ratio, alternate_sides, median
from capture_core.operator.run_report import RunSummary
from capture_core.run.batch_finalize import finalize_batch
from capture_core.run.part_upload import handoff_batch
from capture_core.run.retirement import retire_receipt
from capture_core.run.rollout_io import plan_rollout_file, read_batch
from capture_core.storage import open_byte_store
from capture_core.store import TokenCaptureStore
from capture_core.testing.synthetic import RolloutShape, rollout_record, synthetic_rollout

SHAPE = RolloutShape(turns=4, prompt_tokens=128, generated_tokens=32, tool_tokens=16)


def capture(root: str, count: int) -> None:
    store = TokenCaptureStore(root)
    entries = [e for i in range(count) for e in synthetic_rollout(f"{i}-0", SHAPE)]
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(store.put_now, entries))


def plain_run(rollouts: str, store_root: str, dest: str, run_id: str, batch_size: int) -> None:
    """The same steps as the flow, as direct library calls in one process."""
    store, dest_store = TokenCaptureStore(store_root), open_byte_store(dest)
    plan = plan_rollout_file(rollouts, batch_size)
    for batch in plan.batches:
        lines = read_batch(rollouts, batch)
        finalized = asyncio.run(finalize_batch(run_id, batch, lines, store))
        receipt = handoff_batch(run_id, finalized, dest_store)
        asyncio.run(retire_receipt(receipt, store, dest_store))


def timed_side(work: str, side: str, rep: int, rollouts: str, args: argparse.Namespace) -> float:
    """Capture a fresh store (not timed), then time one side's whole run over it."""
    count, dest = args.rollouts, os.path.join(work, f"{side}-dest")
    store = os.path.join(work, f"{side}-{rep}", "store")
    capture(store, count)
    start = time.perf_counter()
    if side == "plain":
        plain_run(rollouts, store, dest, f"bench-{rep}", args.batch_size)
    else:
        summary = flow_run(rollouts, store, dest, f"bench-{rep}", args.batch_size, side)
        assert summary.handed_off == count and summary.retired == count, summary
    return time.perf_counter() - start


def flow_run(
    rollouts: str, store: str, dest: str, run_id: str, batch_size: int, side: str
) -> RunSummary:
    """`finalize_run`; on the `no-heartbeat` side with Prefect's flow-run heartbeat off."""
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    from tokcap.flows.finalize import finalize_run

    if side == "flow":
        return finalize_run(rollouts, store, dest, run_id, batch_size=batch_size)
    with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        return finalize_run(rollouts, store, dest, run_id, batch_size=batch_size)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rollouts", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--repetitions", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    logging.getLogger("capture_core").setLevel(logging.ERROR)
    work = tempfile.mkdtemp(prefix="tokcap-pipeline-bench-")
    try:
        rollouts = os.path.join(work, "rollouts.jsonl")
        with open(rollouts, "wb") as f:
            f.write(
                b"".join(orjson.dumps(rollout_record(i, 0)) + b"\n" for i in range(args.rollouts))
            )
        print(f"{args.rollouts} rollouts x {SHAPE.turns} calls, batch size {args.batch_size}")
        print(filesystem.describe(work))

        from prefect.testing.utilities import prefect_test_harness

        started = time.perf_counter()
        with prefect_test_harness(server_startup_timeout=120):
            print(f"Prefect server start (one-time): {time.perf_counter() - started:.1f}s")
            first = timed_side(work, "flow", 1000, rollouts, args)
            print(f"flow's first run at its destination (one-time, saves its block): {first:.2f}s")
            first = timed_side(work, "plain", 1001, rollouts, args)
            print(f"plain calls' first run at their destination (one-time): {first:.2f}s")
            first = timed_side(work, "no-heartbeat", 1002, rollouts, args)
            print(f"the same flow, heartbeat off, first run at its destination: {first:.2f}s")
            reps = iter(range(1000))
            seconds = alternate_sides(
                {
                    side: lambda side=side: timed_side(work, side, next(reps), rollouts, args)
                    for side in ("plain", "flow", "no-heartbeat")
                },
                args.repetitions,
            )
        for name, side in (
            ("plain capture_core calls", "plain"),
            ("finalize_run flow", "flow"),
            ("finalize_run flow, Prefect's heartbeat off", "no-heartbeat"),
        ):
            best = median(seconds[side])
            print(f"{name}: {best:.2f}s median ({args.rollouts / best:.0f} rollouts/s)")
        goal = Ratio(seconds["plain"], seconds["flow"])
        print(f"time flow/plain = {goal.describe()} (goal <= 1.15x)")
        quiet = Ratio(seconds["plain"], seconds["no-heartbeat"])
        print(f"  with Prefect's flow-run heartbeat off (attribution only): {quiet.describe()}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
