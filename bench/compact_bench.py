"""Compact captures: stored bytes against a rollout's minimal content, at any concurrency.

Minimal content is each rollout's final cumulative token ids plus every generated token's
log prob, as compact JSON. Workloads (each turn generates G tokens, then I tool tokens join
the next prompt):

- standard: 200 rollouts x 16 turns, S=1,024 first-prompt tokens, G=512, I=256;
- wide: 1,000 rollouts x 8 turns, S=4,096, G=512, I=256;
- long: 1 rollout x 1,000 turns, S=256, G=32, I=16.

Calls arrive interleaved, as a busy model server writes them: every rollout's first call,
then every second call, and so on. Each workload runs with one writer process, and with two
(calls of each rollout alternate between two store instances in two processes, turn by turn).
Prints stored bytes over minimal content and each writer's peak RSS (growth over its RSS
before the first put; tokens are generated per call, so the workload itself holds no
rollout). Then the 1,000-turn finalize time over parsing its minimal content, and its peak
RSS growth over stored bytes. Writes to /dev/shm when it exists (bytes stored do not depend
on the filesystem; `--dir` picks another). Asserts nothing.
Usage: .venv/bin/python -m bench.compact_bench [--workload standard|wide|long|all]
       [--writers 1|2|both] [--parent-index-bytes N] [--dir D]
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from bench.finalize_bench import (
    PRESETS,
    finalize_seconds,
    high_water_rss,
    peak_rss_of_one_rollout,
    stored_entry_blobs,
)
from capture_core.records import TokenEntry
from capture_core.store import TokenCaptureStore
from capture_core.testing.synthetic import VOCAB, rollout_record, synthetic_rollout

GOALS = {"standard": 1.1, "wide": 1.1, "long": 1.5}


@dataclass(frozen=True)
class Workload:
    label: str
    rollouts: int
    turns: int
    prompt: int
    generated: int
    tool: int

    def step(self) -> int:
        return self.generated + self.tool


WORKLOADS = {
    "standard": Workload(
        "standard: 200 rollouts x 16 turns (S=1024, G=512, I=256)", 200, 16, 1024, 512, 256
    ),
    "wide": Workload(
        "wide: 1,000 rollouts x 8 turns (S=4096, G=512, I=256)", 1000, 8, 4096, 512, 256
    ),
    "long": Workload("long: 1 rollout x 1,000 turns (S=256, G=32, I=16)", 1, 1000, 256, 32, 16),
}


def _mixed(rollout: int, start: int, count: int) -> np.ndarray:
    """Deterministic pseudo-random uint64 values for positions `start..start+count` of a
    rollout's token stream (splitmix64), so no rollout's tokens need to be kept."""
    with np.errstate(over="ignore"):
        x = np.arange(start, start + count, dtype=np.uint64)
        x += np.uint64(rollout) * np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def tokens(rollout: int, start: int, count: int) -> list[int]:
    return (_mixed(rollout, start, count) % np.uint64(VOCAB)).tolist()


def log_probs(rollout: int, start: int, count: int) -> list[float]:
    scaled = (_mixed(rollout + 1_000_003, start, count) % np.uint64(3_000_000)).astype(float)
    return [round(-v / 1e6, 6) for v in scaled.tolist()]


def call(workload: Workload, rollout: int, turn: int) -> TokenEntry:
    """Call `turn` of `rollout`: its prompt is the stream so far, fresh int objects each time."""
    cut = workload.prompt + turn * workload.step()
    return TokenEntry(
        rollout_id=f"{rollout}-0",
        model_call_id=f"call-{turn:05d}",
        model="synthetic-policy",
        prompt_token_ids=tokens(rollout, 0, cut),
        generation_token_ids=tokens(rollout, cut, workload.generated),
        generation_log_probs=log_probs(rollout, cut, workload.generated),
        output_items=[
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": f"turn {turn}"}],
            }
        ],
        token_item_index=0,
        created_at=1000.0 + turn,
    )


def minimal_bytes(workload: Workload) -> int:
    """Sum over rollouts of the compact JSON of final tokens and every log prob."""
    final = workload.prompt + (workload.turns - 1) * workload.step() + workload.generated
    total = 0
    for rollout in range(workload.rollouts):
        probs = [
            p
            for turn in range(workload.turns)
            for p in log_probs(
                rollout, workload.prompt + turn * workload.step(), workload.generated
            )
        ]
        total += len(orjson.dumps({"token_ids": tokens(rollout, 0, final), "log_probs": probs}))
    return total


def resident_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def write_share(
    root: str, key: str, writers: int, me: int, index_bytes: int | None, barrier: Any, out: Any
) -> None:
    """One writer: turn by turn, call `turn` of every rollout when `turn % writers == me`."""
    logging.getLogger("capture_core").setLevel(logging.ERROR)
    workload = WORKLOADS[key]
    options = {} if index_bytes is None else {"parent_index_bytes": index_bytes}
    store = TokenCaptureStore(root, **options)
    call(workload, 0, 0)  # warm up numpy and pydantic before the baseline
    before = resident_bytes()
    start = time.perf_counter()
    for turn in range(workload.turns):
        if turn % writers == me:
            for rollout in range(workload.rollouts):
                store.put_now(call(workload, rollout, turn))
        barrier.wait()
    held = getattr(getattr(store, "_parents", None), "held_bytes", None)
    out.put((me, time.perf_counter() - start, before, high_water_rss(), held))


def stored_bytes(root: str) -> int:
    return sum(len(b) for b in stored_entry_blobs(root))


def measure_storage(key: str, writers: int, space: str, index_bytes: int | None) -> None:
    workload = WORKLOADS[key]
    root = tempfile.mkdtemp(prefix=f"tokcap-compact-{key}-", dir=space)
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(writers), ctx.Queue()
    processes = [
        ctx.Process(target=write_share, args=(root, key, writers, me, index_bytes, barrier, out))
        for me in range(writers)
    ]
    try:
        for process in processes:
            process.start()
        reports = sorted(out.get() for _ in processes)
        for process in processes:
            process.join()
        stored, minimal = stored_bytes(root), minimal_bytes(workload)
        print(
            f"{workload.label}, {writers} writer(s): stored {stored / 2**20:.1f} MiB, minimal "
            f"content {minimal / 2**20:.1f} MiB: ratio {stored / minimal:.2f}x "
            f"(goal <= {GOALS[key]}x)"
        )
        for me, seconds, before, peak, held in reports:
            index = f", parent index ~{held / 2**20:.2f} MiB" if held is not None else ""
            print(
                f"  writer {me}: {seconds:.1f}s, peak RSS {peak / 2**20:.0f} MiB, "
                f"{(peak - before) / 2**20:.0f} MiB above its RSS before the first put{index}"
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)


def measure_long_finalize() -> None:
    """The 1,000-turn rollout: finalize against parsing its minimal content, and peak RSS."""
    shape = PRESETS["long"].shape
    root = tempfile.mkdtemp(prefix="tokcap-compact-")
    try:
        store = TokenCaptureStore(root)
        entries = synthetic_rollout("0-0", shape)
        for entry in entries:
            store.put_now(entry)
        stored = stored_bytes(root)
        minimal = _synthetic_minimal(entries)
        start = time.perf_counter()
        for _ in range(20):
            orjson.loads(minimal)
        parse = (time.perf_counter() - start) / 20
        finalize, _ = finalize_seconds(root, [rollout_record(0, 0)])
        print(
            f"1,000 turns: finalize {finalize:.3f}s vs parse of minimal content "
            f"{parse * 1000:.1f} ms: ratio {finalize / parse:.0f}x"
        )
        before, after = peak_rss_of_one_rollout(shape)
        print(
            f"1,000 turns: finalize peak RSS growth {(after - before) / 2**20:.0f} MiB: ratio "
            f"to stored bytes {(after - before) / stored:.0f}x"
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _synthetic_minimal(entries: list[TokenEntry]) -> bytes:
    last = entries[-1]
    return orjson.dumps(
        {
            "token_ids": last.prompt_token_ids + last.generation_token_ids,
            "log_probs": [lp for e in entries for lp in e.generation_log_probs],
        }
    )


def main() -> None:
    logging.getLogger("capture_core").setLevel(logging.ERROR)
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workload", choices=[*WORKLOADS, "all"], default="all")
    parser.add_argument("--writers", choices=["1", "2", "both"], default="both")
    parser.add_argument("--parent-index-bytes", type=int, default=None)
    parser.add_argument("--dir", default="/dev/shm" if os.path.isdir("/dev/shm") else None)
    parser.add_argument("--skip-finalize", action="store_true")
    args = parser.parse_args()
    keys = list(WORKLOADS) if args.workload == "all" else [args.workload]
    counts = [1, 2] if args.writers == "both" else [int(args.writers)]
    print(f"writing to {args.dir or tempfile.gettempdir()}")
    for key in keys:
        for writers in counts:
            measure_storage(key, writers, args.dir, args.parent_index_bytes)
    if not args.skip_finalize:
        measure_long_finalize()


if __name__ == "__main__":
    main()
