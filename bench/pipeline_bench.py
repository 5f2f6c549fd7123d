"""Orchestration overhead: `finalize_run` versus the same work through plain capture_core calls.

Both sides plan, finalize, hand off and retire the same rollouts (stores built from the same
seeds, captured afresh before each side, not timed), alternated over the repetitions in the
same run. The Prefect server is started first and its start-up is reported separately.
Each repetition captures into a fresh store folder and hands off as a new run id to its
side's one destination, as the runs of a training job do; each side's first run at its
destination (the flow's also saves the destination's receipt storage block) runs and is
reported before the repetitions. Everything is removed at the end (see
`bench/store_bench.py` on why).
Prints the time ratio flow/plain (median and range); asserts nothing.
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
from bench.ratios import alternate, median
from capture_core.run.handoff import finalize_batch, handoff_batch, retire_receipt
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
        from flows.finalize import finalize_run

        summary = finalize_run(rollouts, store, dest, f"bench-{rep}", batch_size=args.batch_size)
        assert summary.handed_off == count and summary.retired == count, summary
    return time.perf_counter() - start


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
            reps = iter(range(1000))
            ratio = alternate(
                lambda: timed_side(work, "plain", next(reps), rollouts, args),
                lambda: timed_side(work, "flow", next(reps), rollouts, args),
                args.repetitions,
            )
        for name, seconds in (
            ("plain capture_core calls", ratio.baseline),
            ("finalize_run flow", ratio.measured),
        ):
            best = median(seconds)
            print(f"{name}: {best:.2f}s median ({args.rollouts / best:.0f} rollouts/s)")
        print(f"time flow/plain = {ratio.describe()} (goal <= 1.15x)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
