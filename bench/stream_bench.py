"""A stream over a destination against reading the same parts run by run.

Synthetic agent rollouts are captured once into a local store, then handed off as `--runs`
runs of `--batches` batches each (trainer rows, persisted receipts, a claimed manifest), as
runs land: a thread hands the runs off one after another while `RowStream` (`follow=True`,
a 0.05 s poll) reads and acknowledges every part, stopping at the last. The reference reads
the same parts with one `RowConsumer` per run, each run once it has landed, also
acknowledging each. Both are timed from the first part's handoff to the last ack, in parts
a second and tokens a second; a third figure reads the parts after every run landed
(`follow=False` against `RowConsumer` run by run), where only the reading differs.
Prints both sides and their ratio; asserts nothing.
Usage: .venv/bin/python -m bench.stream_bench [--runs N] [--batches B] [--rollouts R]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import tempfile
import threading
import time

import orjson
from prefect.results import ResultRecord, ResultRecordMetadata
from prefect.serializers import JSONSerializer

from bench.rows_bench import capture, load
from capture_core.dataset import RowConsumer, RowStream
from capture_core.run.batch_finalize import finalize_batch
from capture_core.run.part_upload import handoff_batch
from capture_core.run.rollout_io import plan_rollout_file, read_batch
from capture_core.run.run_layout import RunLayout, RunManifest
from capture_core.storage import open_byte_store
from capture_core.store import TokenCaptureStore
from capture_core.testing.synthetic import RolloutShape


def land(rollouts: str, store: str, dest: str, run_id: str, batch_size: int) -> None:
    """Claim run `run_id` and hand off its batches with rows and persisted receipts."""
    plan = plan_rollout_file(rollouts, batch_size)
    byte_store = open_byte_store(dest)
    layout = RunLayout(byte_store, run_id)
    manifest = RunManifest(
        run_id=run_id,
        rollouts=rollouts,
        rollouts_sha256=plan.sha256,
        store=store,
        builder="prefix_merging",
        batch_size=batch_size,
        batches=len(plan.batches),
        rows="parquet",
        started_at=time.time(),
    )
    layout.claim(manifest)
    source = TokenCaptureStore(store)
    for batch in plan.batches:
        lines = read_batch(rollouts, batch)
        finalized = asyncio.run(finalize_batch(run_id, batch, lines, source, rows="parquet"))
        receipt = handoff_batch(run_id, finalized, byte_store)
        key = layout.receipt_key(receipt.receipt_key)
        metadata = ResultRecordMetadata(serializer=JSONSerializer(), storage_key=key)
        byte_store.create(key, ResultRecord(result=receipt, metadata=metadata).serialize())


def tokens_of(part) -> int:
    return len(part.table.column("token_ids").combine_chunks().flatten())


def streamed(dest: str, name: str, parts: int, follow: bool) -> int:
    """Read and acknowledge `parts` parts through one stream; return their tokens."""
    stream, tokens = RowStream(dest, name, follow=follow, poll_seconds=0.05), 0
    for seen, part in enumerate(stream, start=1):
        tokens += tokens_of(part)
        stream.ack(part.key)
        if seen == parts:
            break
    return tokens


def run_by_run(dest: str, name: str, runs: list[str], landed: list[threading.Event]) -> int:
    """Read and acknowledge every part with one consumer per run, each once it landed."""
    tokens = 0
    for run_id, done in zip(runs, landed, strict=True):
        done.wait()
        consumer = RowConsumer(dest, run_id, name)
        for part in consumer:
            tokens += tokens_of(part)
            consumer.ack(part.key)
    return tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=6)
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--rollouts", type=int, default=8, help="rollouts a run")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    print(f"load {load()}")
    work = tempfile.mkdtemp(prefix="tokcap-stream-bench-")
    shape = RolloutShape(turns=8, prompt_tokens=1024, generated_tokens=512, tool_tokens=256)
    store, rollouts = f"{work}/store", f"{work}/rollouts.jsonl"
    with open(rollouts, "wb") as f:
        f.writelines(orjson.dumps(r) + b"\n" for r in capture(store, args.rollouts, shape))
    batch_size = max(1, args.rollouts // args.batches)
    parts = args.runs * -(-args.rollouts // batch_size)
    for side in ("stream", "run by run"):
        dest = f"{work}/{side.replace(' ', '-')}"
        runs = [f"run-{n:03d}" for n in range(args.runs)]
        landed = [threading.Event() for _ in runs]

        def landing(runs=runs, landed=landed, dest=dest) -> None:
            for run_id, done in zip(runs, landed, strict=True):
                land(rollouts, store, dest, run_id, batch_size)
                done.set()

        thread = threading.Thread(target=landing)
        start = time.perf_counter()
        thread.start()
        if side == "stream":
            tokens = streamed(dest, "trainer", parts, follow=True)
        else:
            tokens = run_by_run(dest, "trainer", runs, landed)
        seconds = time.perf_counter() - start
        thread.join()
        print(
            f"as runs land, {side}: {parts} parts, {tokens:,} tokens in {seconds:.2f} s: "
            f"{parts / seconds:.1f} parts/s, {tokens / seconds:,.0f} tokens/s"
        )
        start = time.perf_counter()
        if side == "stream":
            streamed(dest, "again", parts, follow=False)
        else:
            done = [threading.Event() for _ in runs]
            for event in done:
                event.set()
            run_by_run(dest, "again", runs, done)
        seconds = time.perf_counter() - start
        print(
            f"after every run landed, {side}: {parts / seconds:.1f} parts/s, "
            f"{tokens / seconds:,.0f} tokens/s"
        )


if __name__ == "__main__":
    main()
