"""What weight-version provenance costs, and what staleness masking keeps that dropping loses.

On the seeded asynchronous workload of `capture_core.testing.async_workload` (episodes of
1 to 24 turns, weights updated between calls, and with `--per-token` inside generations too),
captured once with provenance and once without:
- stored bytes: every object the capture store wrote, with against without (goal at most
  1.02x with one version per call);
- row bytes: the batch's Parquet trainer rows, with against without (goal at most 1.05x);
- finalize: freeze, rebuild, encode records and rows and hand off one batch, with against
  without, sides alternated, median of the per-pair ratios of wall seconds (goal 1.05x);
- staleness: for the trainer's current version V and a maximum lag K, the share of sampled
  tokens `staleness_mask` masks, against the share a drop-whole-stale-episodes policy loses
  (an episode is dropped when its oldest token is older than V - K), by episode length.
Prints the load, figures and ratios; asserts nothing.
Usage: .venv/bin/python -m bench.async_bench [--episodes N] [--per-token] [--lag K]
       [--repetitions R]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Sequence

import numpy as np
import orjson
import pyarrow as pa

from bench.ratios import alternate
from capture_core.dataset import staleness_mask
from capture_core.records import TokenEntry
from capture_core.records.provenance import generated_versions
from capture_core.rows.trainer_rows import read_rows
from capture_core.run.batch_finalize import FinalizedBatch, finalize_batch
from capture_core.run.part_upload import handoff_batch
from capture_core.run.rollout_io import plan_rollout_file, read_batch
from capture_core.storage import open_byte_store
from capture_core.store import TokenCaptureStore
from capture_core.testing.async_workload import (
    AsyncEpisode,
    AsyncWorkload,
    async_episodes,
    without_versions,
)

LENGTHS = ((1, 6, "short (1-6 turns)"), (7, 15, "medium (7-15)"), (16, 99, "long (16-24)"))


def stored_bytes(root: str, episodes: Sequence[Sequence[TokenEntry]]) -> int:
    """Capture every call into a fresh local store at `root`; the bytes of what it wrote."""
    store = TokenCaptureStore(root)
    for entries in episodes:
        for entry in entries:
            store.put_now(entry)
    return sum(
        os.path.getsize(os.path.join(folder, name))
        for folder, _, names in os.walk(root)
        if "/.tmp" not in folder
        for name in names
    )


def write_records(path: str, episodes: Sequence[AsyncEpisode]) -> str:
    with open(path, "wb") as f:
        f.writelines(orjson.dumps(e.record) + b"\n" for e in episodes)
    return path


def finalize(rollouts: str, store: str, dest: str) -> FinalizedBatch:
    """Finalize the file's one batch with Parquet rows and hand it off to a fresh `dest`."""
    (batch,) = plan_rollout_file(rollouts, 1_000_000).batches
    lines = read_batch(rollouts, batch)
    finalized = asyncio.run(
        finalize_batch("bench", batch, lines, TokenCaptureStore(store), rows="parquet")
    )
    handoff_batch("bench", finalized, open_byte_store(dest))
    return finalized


def timed_finalize(rollouts: str, store: str, dest: str) -> float:
    start = time.perf_counter()
    finalize(rollouts, store, dest)
    seconds = time.perf_counter() - start
    shutil.rmtree(dest, ignore_errors=True)
    return seconds


def staleness(
    table: pa.Table, episodes: Sequence[AsyncEpisode], current: int, lag: int
) -> list[str]:
    """Masked share against dropped share of sampled tokens, overall and by length."""
    masked = staleness_mask(table, current, lag, unknown_version="mask")
    trainable = masked.column("trainable_mask").combine_chunks().flatten().to_numpy()
    loss = table.column("loss_mask").combine_chunks().flatten().to_numpy()
    rollout_of = np.repeat(
        np.asarray(table.column("rollout_id").to_pylist()),
        [len(x) for x in table.column("loss_mask").to_pylist()],
    )
    lines = []
    for low, high, label in ((1, 99, "all episodes"), *LENGTHS):
        chosen = [e for e in episodes if low <= e.turns <= high]
        ids = {e.rollout_id for e in chosen}
        sampled = loss.astype(bool) & np.isin(rollout_of, list(ids))
        kept = trainable.astype(bool) & sampled
        dropped = sum(_generated(e) for e in chosen if _oldest(e) < current - lag)
        total = sum(_generated(e) for e in chosen)
        if not total:
            continue
        lines.append(
            f"  {label:<22} tokens {total:>8}: masked {1 - kept.sum() / sampled.sum():6.1%}"
            f"   dropped with whole episodes {dropped / total:6.1%}"
        )
    return lines


def _generated(episode: AsyncEpisode) -> int:
    return sum(len(e.generation_token_ids) for e in episode.entries)


def _oldest(episode: AsyncEpisode) -> int:
    return min(min(generated_versions(e) or [0]) for e in episode.entries)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--per-token", action="store_true", help="updates inside generations")
    parser.add_argument("--lag", type=int, default=2, help="max_weight_lag K")
    parser.add_argument("--repetitions", type=int, default=5)
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    workload = AsyncWorkload(episodes=args.episodes, per_token=args.per_token)
    episodes = async_episodes(workload)
    plain = without_versions(episodes)
    print(f"load {', '.join(f'{n:.2f}' for n in os.getloadavg())}")
    print(f"workload: {workload}")
    with tempfile.TemporaryDirectory() as tmp:
        with_store, without_store = f"{tmp}/with", f"{tmp}/without"
        stored = stored_bytes(with_store, [e.entries for e in episodes])
        baseline = stored_bytes(without_store, plain)
        print(f"stored bytes: {stored} vs {baseline}: {stored / baseline:.4f}x (goal <= 1.02x)")
        rollouts = write_records(f"{tmp}/rollouts.jsonl", episodes)
        rows = finalize(rollouts, with_store, f"{tmp}/dest-with").rows or b""
        rows_plain = finalize(rollouts, without_store, f"{tmp}/dest-without").rows or b""
        print(
            f"row bytes: {len(rows)} vs {len(rows_plain)}: "
            f"{len(rows) / len(rows_plain):.4f}x (goal <= 1.05x)"
        )
        ratio = alternate(
            lambda: timed_finalize(rollouts, without_store, f"{tmp}/d0"),
            lambda: timed_finalize(rollouts, with_store, f"{tmp}/d1"),
            args.repetitions,
        )
        print(f"finalize with provenance vs without: {ratio.describe()} (goal <= 1.05x)")
        table = read_rows(rows)
        newest = workload.finish_version
        print(f"staleness at current version {newest}, max lag {args.lag}:")
        print("\n".join(staleness(table, episodes, newest, args.lag)))


if __name__ == "__main__":
    main()
