"""Trainer rows in Parquet against the same rows as JSON lines, and what writing them costs.

For one batch of synthetic agent rollouts finalized from a local store:
- bytes: the batch's Parquet rows part against the same rows (same columns, the records'
  own log probs) as orjson JSON lines; the JSONL records part is printed for context;
- read: seconds to have every token id, log prob and mask position in memory as numpy
  arrays, from the Parquet part (pyarrow) against parsing the JSON lines (orjson) and
  making each row's arrays; the JSON parse alone is printed too;
- write: finalize and hand off the batch (freeze, rebuild, encode, create-only upload and
  read-back, as the upload task does) with `rows="parquet"` against `rows="none"`, sides
  alternated, each run to a fresh destination.
Goals: bytes at most 0.35x, reading at least 10x faster, writing rows adds at most 15%.
Prints medians, ranges and ratios; asserts nothing.
Usage: .venv/bin/python -m bench.rows_bench [--rollouts N] [--turns T] [--repetitions R]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import orjson
import pyarrow.compute as pc

from bench.ratios import alternate_sides, describe_seconds, median
from capture_core.run.handoff import FinalizedBatch, finalize_batch, handoff_batch
from capture_core.run.rollout_io import plan_rollout_file, read_batch
from capture_core.run.trainer_rows import read_rows, record_rows
from capture_core.storage import open_byte_store
from capture_core.store import TokenCaptureStore
from capture_core.testing.synthetic import RolloutShape, rollout_record, synthetic_rollout

COLUMNS = ("token_ids", "generation_logprobs", "loss_mask")


def capture(root: str, rollouts: int, shape: RolloutShape) -> list[dict]:
    """Capture every rollout's calls into a local store; return their rollout records."""
    store = TokenCaptureStore(root)

    def one(i: int) -> dict:
        for entry in synthetic_rollout(f"{i}-0", shape, seed=i):
            store.put_now(entry)
        return rollout_record(i, 0, reward=float(i % 2))

    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(one, range(rollouts)))


def finalize(rollouts: str, store: str, dest: str, rows: str) -> tuple[float, FinalizedBatch]:
    """Seconds to finalize the file's single batch and hand it off to a fresh `dest`."""
    plan = plan_rollout_file(rollouts, 1_000_000)
    (batch,) = plan.batches
    start = time.perf_counter()
    lines = read_batch(rollouts, batch)
    source = TokenCaptureStore(store)
    finalized = asyncio.run(finalize_batch("bench", batch, lines, source, rows=rows))
    handoff_batch("bench", finalized, open_byte_store(dest))
    seconds = time.perf_counter() - start
    shutil.rmtree(dest, ignore_errors=True)
    return seconds, finalized


def json_rows(finalized: FinalizedBatch) -> bytes:
    """The batch's rows as JSON lines: the same columns and values (numbers in shortest form)."""
    records = [orjson.loads(line) for line in finalized.part.splitlines()]
    rows = [row for n, record in enumerate(records) for row in record_rows(record, n + 1, True)]
    option = orjson.OPT_SERIALIZE_NUMPY  # float32 log probs as their shortest repr
    return b"".join(orjson.dumps(dataclasses.asdict(row), option=option) + b"\n" for row in rows)


def read_parquet(data: bytes) -> float:
    start = time.perf_counter()
    table = read_rows(data)
    arrays = [pc.list_flatten(table.column(name)).to_numpy() for name in COLUMNS]
    assert all(len(a) == len(arrays[0]) for a in arrays)
    return time.perf_counter() - start


JSON_TYPES = {"token_ids": np.int32, "generation_logprobs": np.float32, "loss_mask": np.int8}


def read_json(data: bytes, arrays: bool = True) -> float:
    """Seconds to parse the JSON lines and, with `arrays`, have each row's columns as numpy
    arrays (what a trainer feeds to tensors, and what the Parquet side ends with)."""
    start = time.perf_counter()
    rows = [orjson.loads(line) for line in data.splitlines()]
    if arrays:
        columns = [[np.asarray(r[c], dtype=t) for c, t in JSON_TYPES.items()] for r in rows]
        assert all(len(c[0]) == len(c[2]) for c in columns)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rollouts", type=int, default=100)
    parser.add_argument("--turns", type=int, default=16)
    parser.add_argument("--repetitions", type=int, default=5)
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    shape = RolloutShape(
        turns=args.turns, prompt_tokens=1024, generated_tokens=512, tool_tokens=256
    )
    work = tempfile.mkdtemp(prefix="tokcap-rows-bench-")
    try:
        store, rollouts = f"{work}/store", f"{work}/rollouts.jsonl"
        records = capture(store, args.rollouts, shape)
        with open(rollouts, "wb") as f:
            f.writelines(orjson.dumps(r) + b"\n" for r in records)
        _, finalized = finalize(rollouts, store, f"{work}/warm", "parquet")  # freezes once
        parquet = finalized.rows or b""
        as_json = json_rows(finalized)
        table = read_rows(parquet)
        tokens = sum(len(ids) for ids in table.column("token_ids").to_pylist())
        print(
            f"{args.rollouts} rollouts x {args.turns} turns (S=1024, G=512, I=256): "
            f"{table.num_rows} rows, {tokens:,} tokens"
        )
        print(
            f"bytes: parquet {len(parquet):,}, JSON lines {len(as_json):,}: "
            f"{len(parquet) / len(as_json):.3f}x (goal <= 0.35x); JSONL records part "
            f"{len(finalized.part):,} ({len(parquet) / len(finalized.part):.3f}x)"
        )
        sides = {
            "json": lambda: read_json(as_json, arrays=False),
            "json+arrays": lambda: read_json(as_json),
            "parquet": lambda: read_parquet(parquet),
        }
        reads = alternate_sides(sides, 3 * args.repetitions)  # reads are cheap: more reps
        for baseline in ("json+arrays", "json"):
            speedups = [b / p for b, p in zip(reads[baseline], reads["parquet"], strict=True)]
            print(
                f"read every token: {baseline} {describe_seconds(reads[baseline])}, parquet "
                f"{describe_seconds(reads['parquet'])}: {median(speedups):.1f}x faster (range "
                f"{min(speedups):.1f}-{max(speedups):.1f}; goal >= 10x against json+arrays)"
            )
        seconds = alternate_sides(
            {
                "none": lambda: finalize(rollouts, store, f"{work}/dest", "none")[0],
                "parquet": lambda: finalize(rollouts, store, f"{work}/dest", "parquet")[0],
            },
            args.repetitions,
        )
        ratios = [p / n for p, n in zip(seconds["parquet"], seconds["none"], strict=True)]
        print(
            f"finalize + hand off: rows none {describe_seconds(seconds['none'])}, parquet "
            f"{describe_seconds(seconds['parquet'])}: {median(ratios):.3f}x "
            f"(range {min(ratios):.3f}-{max(ratios):.3f}; goal <= 1.15x)"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
