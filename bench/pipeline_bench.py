"""Orchestration overhead: `finalize_run` versus the same work through plain capture_core calls.

Both sides plan, finalize, hand off and retire the same rollouts (two identical stores built
from the same seeds), in the same run. The Prefect server is started first and its start-up
is reported separately. Prints figures and the ratio; asserts nothing.
Usage: .venv/bin/python -m bench.pipeline_bench [--rollouts N] [--batch-size B]
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

from capture_core.handoff import finalize_batch, handoff_batch, retire_receipt
from capture_core.rollout_io import plan_rollout_file, read_batch
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rollouts", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=500)
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
        for side in ("plain", "flow"):
            capture(os.path.join(work, side, "store"), args.rollouts)
        print(f"{args.rollouts} rollouts x {SHAPE.turns} calls, batch size {args.batch_size}")

        from prefect.testing.utilities import prefect_test_harness

        from flows.finalize import finalize_run

        started = time.perf_counter()
        with prefect_test_harness(server_startup_timeout=120):
            print(f"Prefect server start (one-time): {time.perf_counter() - started:.1f}s")
            start = time.perf_counter()
            plain_run(
                rollouts,
                os.path.join(work, "plain", "store"),
                os.path.join(work, "plain", "dest"),
                "bench",
                args.batch_size,
            )
            plain = time.perf_counter() - start
            start = time.perf_counter()
            summary = finalize_run(
                rollouts,
                os.path.join(work, "flow", "store"),
                os.path.join(work, "flow", "dest"),
                "bench",
                batch_size=args.batch_size,
            )
            flow = time.perf_counter() - start
        assert summary.handed_off == args.rollouts
        print(f"plain capture_core calls: {plain:.2f}s")
        print(f"finalize_run flow:        {flow:.2f}s ({summary.retired} retired)")
        print(f"ratio flow/plain = {flow / plain:.2f}x (goal <= 1.2x)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
