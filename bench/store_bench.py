"""Durable put and freeze throughput of the capture store, against raw durable writes.

Baseline, measured in the same run: each entry's bytes to its own new file with
O_EXCL + write + fsync, at the same concurrency. Prints figures and ratios; asserts nothing.
Usage: .venv/bin/python -m bench.store_bench [--entries N] [--tokens T] [--s3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from capture_core.records import TokenEntry
from capture_core.store import TokenCaptureStore, encode_entry

CALLS_PER_ROLLOUT = 16


def make_entries(count: int, tokens: int) -> list[TokenEntry]:
    entries = []
    for i in range(count):
        rollout, call = divmod(i, CALLS_PER_ROLLOUT)
        entries.append(
            TokenEntry(
                rollout_id=f"r{rollout}",
                model_call_id=f"call-{call}",
                prompt_token_ids=[(i * 31 + t) % 150_000 for t in range(tokens)],
                generation_token_ids=[(t * 7) % 150_000 for t in range(tokens // 8)],
                generation_log_probs=[-0.123456 - t * 1e-4 for t in range(tokens // 8)],
                created_at=float(i),
            )
        )
    return entries


def timed(concurrency: int, jobs: list[Callable[[], None]]) -> float:
    start = time.perf_counter()
    if concurrency == 1:
        for job in jobs:
            job()
    else:
        with ThreadPoolExecutor(concurrency) as pool:
            for future in [pool.submit(job) for job in jobs]:
                future.result()
    return time.perf_counter() - start


def raw_durable_write(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def bench_local(entries: list[TokenEntry], concurrency: int) -> tuple[float, float]:
    blobs = [encode_entry(e) for e in entries]
    raw_dir = tempfile.mkdtemp(prefix="tokcap-raw-")
    store_dir = tempfile.mkdtemp(prefix="tokcap-store-")
    try:
        raw = timed(
            concurrency,
            [
                (lambda i=i, b=b: raw_durable_write(os.path.join(raw_dir, str(i)), b))
                for i, b in enumerate(blobs)
            ],
        )
        store = TokenCaptureStore(store_dir)
        put = timed(concurrency, [(lambda e=e: store.put_now(e)) for e in entries])
        return raw, put
    finally:
        shutil.rmtree(raw_dir, ignore_errors=True)
        shutil.rmtree(store_dir, ignore_errors=True)


def bench_freeze(
    root: str, options: dict[str, object], entries: list[TokenEntry]
) -> tuple[float, int]:
    store = TokenCaptureStore(root, options)
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(store.put_now, entries))
    rollouts = sorted({e.rollout_id for e in entries})
    start = time.perf_counter()
    for rollout_id in rollouts:
        store.freeze_now(rollout_id)
    return time.perf_counter() - start, len(rollouts)


def bench_s3(entries: list[TokenEntry]) -> None:
    import s3fs

    from tests.servers import FAKE_AWS_ENV, moto_server

    os.environ.update(FAKE_AWS_ENV)
    with moto_server() as endpoint:
        options = {"endpoint_url": endpoint}
        s3fs.S3FileSystem(**options).mkdir("bench")
        for concurrency in (1, 16):
            store = TokenCaptureStore(f"s3://bench/c{concurrency}", options)
            seconds = timed(concurrency, [(lambda e=e, s=store: s.put_now(e)) for e in entries])
            print(
                f"s3 (moto) put, concurrency {concurrency:>2}: {len(entries) / seconds:8.0f} puts/s"
            )
        seconds, rollouts = bench_freeze("s3://bench/freeze", options, entries)
        print(
            f"s3 (moto) freeze: {rollouts / seconds:8.1f} rollouts/s "
            f"({CALLS_PER_ROLLOUT} calls each)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--entries", type=int, default=2000)
    parser.add_argument("--tokens", type=int, default=2048, help="prompt tokens per entry")
    parser.add_argument("--s3", action="store_true", help="also run against a moto server")
    args = parser.parse_args()
    entries = make_entries(args.entries, args.tokens)
    size = sum(len(encode_entry(e)) for e in entries) / len(entries)
    print(f"{len(entries)} entries, {size / 1024:.1f} KiB each on average")
    for concurrency in (1, 16):
        raw, put = bench_local(entries, concurrency)
        print(
            f"local put, concurrency {concurrency:>2}: {len(entries) / put:8.0f} puts/s; "
            f"raw durable writes {len(entries) / raw:8.0f}/s; time ratio put/raw = {put / raw:.2f}x"
        )
    store_dir = tempfile.mkdtemp(prefix="tokcap-freeze-")
    try:
        seconds, rollouts = bench_freeze(store_dir, {}, entries)
        print(
            f"local freeze: {rollouts / seconds:8.1f} rollouts/s ({CALLS_PER_ROLLOUT} calls each)"
        )
    finally:
        shutil.rmtree(store_dir, ignore_errors=True)
    if args.s3:
        bench_s3(entries[: min(len(entries), 480)])


if __name__ == "__main__":
    main()
