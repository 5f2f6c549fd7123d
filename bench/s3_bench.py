"""Finalize and retire from S3 (a moto server), against fetching the same objects.

Baseline, alternated with finalize over the repetitions: one s3fs call, `fs.cat(paths)`,
fetching every entry object of the batch concurrently. Finalize is `finalize_batch` over
the batch (freeze, read, verify, build, project) at `--concurrency`; retire is
`retire_receipt` of the same rollouts, compared with that repetition's finalize time.
Each repetition captures fresh rollouts under its own prefix (not timed). Asserts nothing.
Usage: .venv/bin/python -m bench.s3_bench [--rollouts N] [--repetitions R] [--concurrency C]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor

from bench.ratios import Ratio, median
from bench.retire_bench import handed_off
from capture_core.run.batch_finalize import finalize_batch
from capture_core.run.receipt import HandoffReceipt
from capture_core.run.retirement import retire_receipt
from capture_core.run.rollout_io import BatchPlan, ParsedLine
from capture_core.store import TokenCaptureStore
from capture_core.testing.synthetic import RolloutShape, rollout_record, synthetic_rollout

SHAPE = RolloutShape(turns=16, prompt_tokens=1024, generated_tokens=512, tool_tokens=256)


def capture(store: TokenCaptureStore, rollouts: int) -> list[str]:
    """Put every rollout's calls (16 writers); return the entry keys."""

    def one(i: int) -> None:
        for entry in synthetic_rollout(f"{i}-0", SHAPE, seed=i):
            store.put_now(entry)

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(one, range(rollouts)))
    return [k for i in range(rollouts) for k in store.byte_store.list_prefix(f"{i}-0")]


def fetch_seconds(store: TokenCaptureStore, keys: list[str]) -> float:
    fs, root = store.byte_store.fs, store.byte_store.url.split("://", 1)[1]  # type: ignore[attr-defined]
    paths = [f"{root}/{key}" for key in keys]
    start = time.perf_counter()
    found = fs.cat(paths)
    seconds = time.perf_counter() - start
    assert len(found) == len(paths)
    return seconds


def finalize_and_retire(
    store: TokenCaptureStore, rollouts: int, concurrency: int
) -> tuple[float, float]:
    lines = [ParsedLine(line=i, record=rollout_record(i, 0)) for i in range(rollouts)]
    batch = BatchPlan(index=0, start=0, end=0, first_line=0, lines=rollouts, sha256="0" * 64)
    start = time.perf_counter()
    finalized = asyncio.run(finalize_batch("bench", batch, lines, store, concurrency=concurrency))
    finalize = time.perf_counter() - start
    receipt = HandoffReceipt(
        run_id="bench",
        batch=0,
        receipt_key=finalized.receipt_key,
        part_key=finalized.part_key,
        sha256="",
        bytes=len(finalized.part),
        records=rollouts,
        rollouts=finalized.outcomes,
    )
    dest = handed_off(receipt)
    start = time.perf_counter()
    outcome = asyncio.run(retire_receipt(receipt, store, dest, concurrency=concurrency))
    retire = time.perf_counter() - start
    assert not outcome.failed, outcome.failed
    return finalize, retire


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rollouts", type=int, default=50)
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    logging.getLogger("capture_core").setLevel(logging.ERROR)
    import s3fs

    from tests.support.servers import FAKE_AWS_ENV, moto_server

    os.environ.update(FAKE_AWS_ENV)
    with moto_server() as endpoint:
        options = {"endpoint_url": endpoint}
        s3fs.S3FileSystem(**options).mkdir("bench")
        fetch: list[float] = []
        finalize: list[float] = []
        retire: list[float] = []
        for rep in range(max(args.repetitions, 3)):
            store = TokenCaptureStore(f"s3://bench/rep{rep}", options)
            keys = capture(store, args.rollouts)
            fetch.append(fetch_seconds(store, keys))
            f, r = finalize_and_retire(store, args.rollouts, args.concurrency)
            finalize.append(f)
            retire.append(r)
            store.close_now()
    print(
        f"S3 (moto), {args.rollouts} rollouts x {SHAPE.turns} turns, concurrency "
        f"{args.concurrency}: fetch every object with one fs.cat {median(fetch):.2f}s; "
        f"finalize {median(finalize):.2f}s; retire {median(retire):.2f}s"
    )
    print(f"  finalize / fetch = {Ratio(fetch, finalize).describe()} (goal <= 1.2x)")
    print(f"  retire / finalize = {Ratio(finalize, retire).describe()} (goal <= 1x)")


if __name__ == "__main__":
    main()
