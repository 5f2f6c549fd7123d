"""Compact captures: stored bytes and finalize cost against a rollout's minimal content.

Minimal content is the rollout's final cumulative token ids plus every generated token's log
prob, as compact JSON. Prints bytes stored per rollout over that (16 and 1,000 turns), the
1,000-turn finalize time over parsing the minimal content, and peak RSS growth over stored
bytes. The projected response itself repeats each call's whole prompt (docs/contract.md,
Building trajectories), so finalize cannot be cheaper than materialising those prompts.
Asserts nothing.
Usage: .venv/bin/python -m bench.compact_bench
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time

import orjson

from bench.finalize_bench import (
    PRESETS,
    finalize_seconds,
    peak_rss_of_one_rollout,
    stored_entry_blobs,
)
from capture_core.store import TokenCaptureStore
from capture_core.testing.synthetic import RolloutShape, rollout_record, synthetic_rollout


def minimal_content(shape: RolloutShape) -> bytes:
    entries = synthetic_rollout("0-0", shape)
    last = entries[-1]
    return orjson.dumps(
        {
            "token_ids": last.prompt_token_ids + last.generation_token_ids,
            "log_probs": [lp for e in entries for lp in e.generation_log_probs],
        }
    )


def measure(label: str, shape: RolloutShape, rss: bool) -> None:
    root = tempfile.mkdtemp(prefix="tokcap-compact-")
    try:
        store = TokenCaptureStore(root)
        for entry in synthetic_rollout("0-0", shape):
            store.put_now(entry)
        stored = sum(len(b) for b in stored_entry_blobs(root))
        minimal = minimal_content(shape)
        start = time.perf_counter()
        for _ in range(20):
            orjson.loads(minimal)
        parse = (time.perf_counter() - start) / 20
        print(f"\n== {label}")
        print(
            f"stored {stored / 1024:.0f} KiB, minimal content {len(minimal) / 1024:.0f} KiB: "
            f"ratio {stored / len(minimal):.2f}x (goal <= 1.5x)"
        )
        finalize, _ = finalize_seconds(root, [rollout_record(0, 0)])
        print(
            f"finalize {finalize:.3f}s vs parse of minimal content {parse * 1000:.1f} ms: "
            f"ratio {finalize / parse:.0f}x (goal <= 3x)"
        )
        if rss:
            before, after = peak_rss_of_one_rollout(shape)
            print(
                f"peak RSS growth {(after - before) / 2**20:.0f} MiB: ratio to stored bytes "
                f"{(after - before) / stored:.0f}x (goal <= 2x)"
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    logging.getLogger("capture_core").setLevel(logging.ERROR)
    measure("16 turns (S=1024, G=512, I=256)", PRESETS["many"].shape, rss=False)
    measure("1,000 turns (S=256, G=32, I=16)", PRESETS["long"].shape, rss=True)


if __name__ == "__main__":
    main()
