"""Trainer rows in Parquet against the same rows as JSON lines, and what writing them costs.

For one batch of synthetic agent rollouts finalized from a local store:
- bytes: the batch's Parquet rows part against the same rows (same columns, the records'
  own log probs) as orjson JSON lines; the JSONL records part is printed for context;
- read every token, a trainer's read (the goal figure): wall seconds from a local
  destination holding the handed-off batch and its persisted receipt to every token id,
  log prob and mask position of every row as numpy arrays (int32, float32, int8).
  Parquet: one pass of `RowConsumer` (receipt listed and read, cursor checked, part read,
  its sha256 checked on a thread of its own while pyarrow decodes it with its default
  threading), then each row group's list values as arrays, views of what pyarrow decoded;
  "one thread" is the same consumer verifying first, then decoding on the iterating thread;
  "trained columns" reads only the token ids, log probs and loss mask (`columns=`), as a
  trainer training on those does (the other columns are verified with the part, never
  decompressed). JSON: the same rows' JSON lines file read from the same disk, each line
  parsed with orjson into lists, then each row's three arrays made by the fastest
  conversion measured. The
  goal figure is the median of the per-pair ratios of wall seconds (what a trainer waits
  for), process CPU beside;
- read every token, the work figure: the same from the part's bytes in memory, on one
  thread (`read_rows(use_threads=False)`; "verified" adds the sha256 check the consumer
  makes first; "json" is the parse alone), as the median of the per-pair ratios of the
  reading thread's CPU seconds (the work done, less stretched by the shared machine's load
  than wall seconds), wall beside. In both, sides alternate, each timed right after an
  untimed call of its own, and what it made is freed after its clocks are read;
- write: finalize and hand off the batch (freeze, rebuild, encode, create-only upload and
  read-back, as the upload task does) with `rows="parquet"` against `rows="none"`, sides
  alternated, each run to a fresh destination (removed, and the disk flushed, untimed
  after it); the goal figure is the median of the
  per-pair ratios of wall seconds, CPU beside, and the rows' own CPU cost alone.
Goals: bytes at most 0.35x, a trainer's read at least 10x faster, writing rows adds at most
15%. Prints the load, medians, ranges and ratios; asserts nothing.
The same batch's Arrow part (`rows="arrow"`) is measured beside the Parquet one: its bytes,
its read by `RowConsumer` (every column, trained columns) and its write.
The trainer's read is measured on a large part and on a small one (`--small-rollouts`, about
34k tokens), where a part's fixed costs weigh most, followed by the CPU seconds of each
step of its read alone (listing, receipt, ack, bytes, digest, footer, decode, arrays; the
Arrow part's digest and decode beside).
With `--against REV`, only the trainer's read of the Arrow parts (small and large, every column
and trained columns) is measured, by this tree and by `REV`'s `capture_core`, each in a
long-lived process of its own reading the same destinations, alternated in one run; per tree,
the read's wall and CPU ratio to the JSON lines file read in that process, and the ratio of the
trees' ratios (`--against .`: this tree against itself, the A/A spread).
Usage: .venv/bin/python -m bench.rows_bench [--rollouts N] [--turns T] [--repetitions R]
       [--against REV]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
from prefect.results import ResultRecord, ResultRecordMetadata
from prefect.serializers import JSONSerializer

from bench.ratios import (
    Sample,
    Stopwatch,
    TreeSides,
    against,
    alternate_sides,
    composed_root,
    describe_seconds,
    median,
    ratios_of,
    serve,
    spread,
    verdict,
)
from capture_core.dataset import RowConsumer
from capture_core.rows.row_cursor import read_stored_receipt, receipt_keys
from capture_core.rows.trainer_rows import batch_rows, read_rows, record_rows
from capture_core.run.batch_finalize import FinalizedBatch, finalize_batch
from capture_core.run.part_upload import handoff_batch
from capture_core.run.rollout_io import plan_rollout_file, read_batch
from capture_core.storage import open_byte_store
from capture_core.store import TokenCaptureStore
from capture_core.testing.synthetic import RolloutShape, rollout_record, synthetic_rollout
from tokcap.tasks.receipts import ReceiptStorage, result_path

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


def finalize(rollouts: str, store: str, dest: str, rows: str) -> FinalizedBatch:
    """Finalize the file's single batch and hand it off to `dest` (a fresh one: `clear`)."""
    plan = plan_rollout_file(rollouts, 1_000_000)
    (batch,) = plan.batches
    lines = read_batch(rollouts, batch)
    source = TokenCaptureStore(store)
    finalized = asyncio.run(finalize_batch("bench", batch, lines, source, rows=rows))
    handoff_batch("bench", finalized, open_byte_store(dest))
    return finalized


def clear(dest: str) -> None:
    """Remove a destination and flush the disk, so the next run starts from the same state:
    the removal's writes and the device's discards otherwise land in whichever run comes
    next (on this machine's disk, a handoff that waits for them takes twice as long)."""
    shutil.rmtree(dest, ignore_errors=True)
    os.sync()


def emitted(finalized: FinalizedBatch) -> list[tuple[int, dict, bool]]:
    """The batch's delivered records as `batch_rows` takes them (each a projected chain)."""
    return [(n + 1, orjson.loads(line), True) for n, line in enumerate(finalized.part.splitlines())]


def json_rows(finalized: FinalizedBatch) -> bytes:
    """The batch's rows as JSON lines: the same columns and values (numbers in shortest form)."""
    rows = [
        row
        for line, rec, projected in emitted(finalized)
        for row in record_rows(rec, line, projected)
    ]
    option = orjson.OPT_SERIALIZE_NUMPY  # float32 log probs as their shortest repr
    return b"".join(orjson.dumps(dataclasses.asdict(row), option=option) + b"\n" for row in rows)


def parquet_tokens(data: bytes) -> list[list[np.ndarray]]:
    """Every token id, log prob and mask position of a part as numpy arrays, decoded on the
    calling thread (the work figure): `read_rows`, then `table_tokens`."""
    return table_tokens(read_rows(data, use_threads=False))


def table_tokens(table: pa.Table) -> list[list[np.ndarray]]:
    """Each chunk's list values as arrays (a chunk per row group from pyarrow's threads, one
    per column from one thread): views of what pyarrow decoded, no copy (a row's tokens are
    the slice its list offsets give), as the JSON side ends with arrays per row."""
    return [[chunk.flatten().to_numpy() for chunk in table.column(c).chunks] for c in COLUMNS]


def verified_parquet_tokens(data: bytes, sha256: str) -> list[list[np.ndarray]]:
    """`parquet_tokens` after the digest check the consumer makes before decoding a part."""
    assert hashlib.sha256(data).hexdigest() == sha256
    return parquet_tokens(data)


def consumer_tokens(consumer: RowConsumer) -> list[list[np.ndarray]]:
    """What a trainer does for a part: one pass of `RowConsumer` over the run (its receipt
    listed and read, its cursor checked, its part read from the destination, verified and
    decoded), then `table_tokens` of the part it yields."""
    (part,) = list(consumer)
    return table_tokens(part.table)


def json_tokens(data: bytes, arrays: bool = True) -> list[dict]:
    """The JSON lines parsed with orjson (lists of Python numbers) and, with `arrays`, each
    row's three columns as numpy arrays, each by the fastest conversion measured (ids and
    log probs through `np.fromiter` with their count, an int8 mask through `bytes`)."""
    rows = [orjson.loads(line) for line in data.splitlines()]
    if arrays:
        for r in rows:
            ids, logprobs = r["token_ids"], r["generation_logprobs"]
            r["token_ids"] = np.fromiter(ids, np.int32, len(ids))
            r["generation_logprobs"] = np.fromiter(logprobs, np.float32, len(logprobs))
            r["loss_mask"] = np.frombuffer(bytes(r["loss_mask"]), np.int8)
    return rows


def json_file_tokens(path: str) -> list[dict]:
    """`json_tokens` of the JSON lines read from a file (a trainer reading them from disk)."""
    with open(path, "rb") as f:
        return json_tokens(f.read())


def handed_off(finalized: FinalizedBatch, dest: str) -> None:
    """Hand the batch off to `dest` and persist its receipt as the upload task does (its
    Prefect result record, through the run's receipt storage), so `RowConsumer` reads it."""
    receipt = handoff_batch("bench", finalized, open_byte_store(dest))
    path = result_path("bench", receipt.receipt_key)
    metadata = ResultRecordMetadata(serializer=JSONSerializer(), storage_key=path)
    record = ResultRecord(result=receipt, metadata=metadata)
    ReceiptStorage(dest=dest).write_path(path, record.serialize())


@dataclasses.dataclass
class Clocks:
    """Wall and CPU seconds of each side's calls, in call order.

    CPU seconds are `cpu_clock`'s: the calling thread's (`time.thread_time`) for work done on
    it alone, which does not grow when the shared machine's other processes take the cores
    (wall seconds do), or the whole process's for work spread over threads.
    """

    cpu_clock: Callable[[], float] = time.process_time
    wall: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    cpu: dict[str, list[float]] = dataclasses.field(default_factory=dict)

    def timed(
        self,
        side: str,
        fn: Callable[[], object],
        warm: bool = False,
        after: Callable[[], None] | None = None,
    ) -> Callable[[], float]:
        """`fn` as an `alternate_sides` side that records both clocks, returning wall seconds.

        What `fn` returns is freed after the clocks are read: freeing is not part of having
        it. With `warm`, an untimed call first, so each side is timed in the state its own
        previous call leaves (as a reader of part after part is), not the other side's.
        `after` runs untimed once the clocks are read (removing what `fn` wrote).
        """

        def run() -> float:
            if warm:
                fn()
            wall, cpu = time.perf_counter(), self.cpu_clock()
            kept = fn()
            cpu, wall = self.cpu_clock() - cpu, time.perf_counter() - wall
            del kept
            if after is not None:
                after()
            self.wall.setdefault(side, []).append(wall)
            self.cpu.setdefault(side, []).append(cpu)
            return wall

        return run

    def ratio(self, clock: str, numerator: str, denominator: str) -> str:
        """Median and range over the repetitions of one side's seconds over another's."""
        seconds = self.cpu if clock == "cpu" else self.wall
        r = [n / d for n, d in zip(seconds[numerator], seconds[denominator], strict=True)]
        return f"{median(r):.3f}x (range {min(r):.3f}-{max(r):.3f}, {len(r)} pairs)"

    def seconds(self, clock: str, side: str) -> str:
        return describe_seconds((self.cpu if clock == "cpu" else self.wall)[side])


def trainer_reads(
    finalized: FinalizedBatch, arrow: FinalizedBatch, as_json: bytes, dest: str, pairs: int
) -> Clocks:
    """Wall and process CPU seconds of a trainer's read of the part from a local destination,
    `RowConsumer` with pyarrow's threads and on one thread, against reading the same rows'
    JSON lines file from the same disk; the same batch's Arrow part (`arrow`, handed off to a
    destination of its own) read by `RowConsumer` too; sides alternated, each timed after an
    untimed call."""
    handed_off(finalized, dest)
    handed_off(arrow, f"{dest}-arrow")
    path = f"{dest}/rows.jsonl"
    with open(path, "wb") as f:
        f.write(as_json)
    threaded = RowConsumer(dest, "bench", "bench")
    single = RowConsumer(dest, "bench", "bench", use_threads=False)
    trained = RowConsumer(dest, "bench", "bench", columns=COLUMNS)
    arrow_every = RowConsumer(f"{dest}-arrow", "bench", "bench")
    arrow_trained = RowConsumer(f"{dest}-arrow", "bench", "bench", columns=COLUMNS)
    sides = {
        "JSON lines file": lambda: json_file_tokens(path),
        "consumer": lambda: consumer_tokens(threaded),
        "consumer, one thread": lambda: consumer_tokens(single),
        "consumer, trained columns": lambda: consumer_tokens(trained),
        "Arrow part, consumer": lambda: consumer_tokens(arrow_every),
        "Arrow part, consumer, trained columns": lambda: consumer_tokens(arrow_trained),
    }
    clocks = Clocks()
    alternate_sides({side: clocks.timed(side, fn, warm=True) for side, fn in sides.items()}, pairs)
    return clocks


def print_trainer_read(label: str, trainer: Clocks) -> None:
    """A trainer's read, each side and each consumer's ratio to the JSON lines file."""
    for side in trainer.wall:
        print(
            f"a trainer's read, {label}, {side}: wall {trainer.seconds('wall', side)}, "
            f"CPU {trainer.seconds('cpu', side)}"
        )
    for side in list(trainer.wall)[1:]:
        goal = " (the goal figure, goal >= 10x)" if side.endswith("consumer") else ""
        print(
            f"  {label}, {side} faster than the JSON lines file: wall "
            f"{trainer.ratio('wall', 'JSON lines file', side)}{goal}; CPU "
            f"{trainer.ratio('cpu', 'JSON lines file', side)}"
        )


def small_read(work: str, rollouts: int, shape: RolloutShape, pairs: int) -> None:
    """The trainer's read of a small part (`rollouts` rollouts of the same shape): fixed
    costs per part (listing, receipt, cursor, the digest) weigh most there."""
    store, path = f"{work}/small-store", f"{work}/small.jsonl"
    with open(path, "wb") as f:
        f.writelines(orjson.dumps(r) + b"\n" for r in capture(store, rollouts, shape))
    finalized = finalize(path, store, f"{work}/small-warm", "parquet")
    arrow = finalize(path, store, f"{work}/small-warm-arrow", "arrow")
    tokens = len(read_rows(finalized.rows or b"").column("token_ids").combine_chunks().flatten())
    trainer = trainer_reads(finalized, arrow, json_rows(finalized), f"{work}/small-read", pairs)
    print_trainer_read(f"small part ({tokens:,} tokens)", trainer)
    print_stages(f"{work}/small-read", arrow.rows or b"", pairs)


def read_stages(dest: str, arrow: bytes) -> dict[str, Callable[[], object]]:
    """Each step of the consumer's read of the run's one part, alone, on the calling thread:
    where a small part's read time goes; the same batch's Arrow part (`arrow`) beside."""
    consumer = RowConsumer(dest, "bench", "bench")
    layout = consumer.layout
    (key,) = receipt_keys(layout)
    receipt = read_stored_receipt(layout, key)
    assert receipt.rows is not None
    data = layout.dest.get(receipt.rows.key) or b""
    table = read_rows(data, use_threads=False)
    return {
        "list receipts": lambda: receipt_keys(layout),
        "read and check the receipt": lambda: read_stored_receipt(layout, key),
        "look for the ack": lambda: consumer.cursor.acknowledged(receipt),
        "read the part's bytes": lambda: layout.dest.get(receipt.rows.key if receipt.rows else ""),
        "sha256 of the part": lambda: hashlib.sha256(data).hexdigest(),
        "parse the footer": lambda: pq.ParquetFile(pa.BufferReader(data)).metadata,
        "decode every column": lambda: read_rows(data, use_threads=False),
        "decode every column but weight_version": lambda: read_rows(
            data, use_threads=False, skip=("weight_version",)
        ),
        "decode the trained columns": lambda: read_rows(data, use_threads=False, columns=COLUMNS),
        "trained columns as numpy arrays": lambda: table_tokens(table),
        "sha256 of the Arrow part": lambda: hashlib.sha256(arrow).hexdigest(),
        "decode every column of the Arrow part": lambda: read_rows(arrow, use_threads=False),
        "decode the trained columns of the Arrow part": lambda: read_rows(
            arrow, use_threads=False, columns=COLUMNS
        ),
    }


def print_stages(dest: str, arrow: bytes, repetitions: int) -> None:
    """The CPU seconds of each step of a part's read (`read_stages`), the calling thread's."""
    clocks = Clocks(time.thread_time)
    stages = read_stages(dest, arrow)
    alternate_sides({s: clocks.timed(s, fn, warm=True) for s, fn in stages.items()}, repetitions)
    for stage in stages:
        cpu = [seconds * 1e3 for seconds in clocks.cpu[stage]]
        print(f"  step: {stage}: CPU {median(cpu):.3f} ms (range {min(cpu):.3f}-{max(cpu):.3f})")


def load() -> str:
    """The machine's 1, 5 and 15 minute load averages."""
    return ", ".join(f"{n:.2f}" for n in os.getloadavg())


SIZES = ("small", "large")
ARROW_SIDES = ("Arrow part, consumer", "Arrow part, consumer, trained columns")


def arrow_read_sides(root: str) -> dict[str, Callable[[], Sample]]:
    """A served child's sides: per part size under `root` (an Arrow part handed off to
    `<size>-dest`, the same rows as JSON lines in `<size>.jsonl`), the JSON lines file read
    and the consumer's read of every column and of the trained columns, each timed (wall,
    process CPU) right after an untimed call of its own."""

    def warm_timed(fn: Callable[[], object]) -> Callable[[], Sample]:
        def run() -> Sample:
            fn()
            with Stopwatch() as watch:
                kept = fn()
            del kept
            return watch.sample

        return run

    sides = {}
    for size in SIZES:
        dest, path = f"{root}/{size}-dest", f"{root}/{size}.jsonl"
        every = RowConsumer(dest, "bench", "bench")
        trained = RowConsumer(dest, "bench", "bench", columns=COLUMNS)
        sides[f"{size} JSON lines file"] = warm_timed(lambda path=path: json_file_tokens(path))
        sides[f"{size} {ARROW_SIDES[0]}"] = warm_timed(lambda c=every: consumer_tokens(c))
        sides[f"{size} {ARROW_SIDES[1]}"] = warm_timed(lambda c=trained: consumer_tokens(c))
    return sides


def run_against(rev: str, args: argparse.Namespace, shape: RolloutShape) -> None:
    """The Arrow parts' trainer reads by this tree and by `rev`'s `capture_core`, each tree
    in its own process over the same parts, alternated in one run."""
    work = tempfile.mkdtemp(prefix="tokcap-rows-against-")
    names = {"this tree": ".", rev if rev != "." else "this tree again": rev}
    trees: dict[str, TreeSides] = {}
    try:
        for size, rollouts in (("small", args.small_rollouts), ("large", args.rollouts)):
            store, path = f"{work}/{size}-store", f"{work}/{size}-rollouts.jsonl"
            with open(path, "wb") as f:
                f.writelines(orjson.dumps(r) + b"\n" for r in capture(store, rollouts, shape))
            arrow = finalize(path, store, f"{work}/{size}-warm", "arrow")
            handed_off(arrow, f"{work}/{size}-dest")
            with open(f"{work}/{size}.jsonl", "wb") as f:
                f.write(json_rows(arrow))
        for name, tree in names.items():
            root = composed_root(tree, f"{work}/trees")
            trees[name] = TreeSides(root, "bench.rows_bench", ["--read-root", work])
        new, old = names
        for size in SIZES:
            for side in ARROW_SIDES:
                before = load()
                samples = against(
                    trees, f"{size} JSON lines file", f"{size} {side}", 3 * args.repetitions
                )
                print(f"\n== {size} part, {side}: load {before} before, {load()} after")
                for line in against_lines(samples, new, old):
                    print(line)
    finally:
        for tree in trees.values():
            tree.close()
        shutil.rmtree(work, ignore_errors=True)


def against_lines(
    samples: dict[str, tuple[list[Sample], list[Sample]]], new: str, old: str
) -> list[str]:
    """Per tree, how many times faster than the JSON lines file its read is (wall, CPU),
    and the trees' speed-ups divided, new by old, with the interval of that median."""
    faster = {}
    lines = []
    for name, (json_lines, read) in samples.items():
        wall, cpu = ([1 / r for r in ratios] for ratios in ratios_of(read, json_lines))
        faster[name] = wall, cpu
        lines.append(f"  {name}: faster than JSON lines: wall {spread(wall)}; CPU {spread(cpu)}")
    for i, kind in enumerate(("wall", "CPU")):
        gain = [n / o for n, o in zip(faster[new][i], faster[old][i], strict=True)]
        lines.append(f"  {kind} speed-up {new} / {old}: {spread(gain)}")
        lines.append(f"    read time, {new} / {old}: {verdict([1 / g for g in gain])}")
    return lines


def main() -> None:
    serving = sys.argv[1:2] == ["--serve"]
    if serving:
        sys.argv.pop(1)
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rollouts", type=int, default=100)
    parser.add_argument("--turns", type=int, default=16)
    parser.add_argument("--repetitions", type=int, default=7)
    parser.add_argument("--small-rollouts", type=int, default=3, help="rollouts of the small part")
    parser.add_argument("--against", help="compare with this revision's capture_core ('.': A/A)")
    parser.add_argument("--read-root", help=argparse.SUPPRESS)  # a served child's parts
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    if serving:
        serve(arrow_read_sides(args.read_root))
        return
    shape = RolloutShape(
        turns=args.turns, prompt_tokens=1024, generated_tokens=512, tool_tokens=256
    )
    print(f"load {load()}")
    if args.against:
        run_against(args.against, args, shape)
        return
    work = tempfile.mkdtemp(prefix="tokcap-rows-bench-")
    try:
        store, rollouts = f"{work}/store", f"{work}/rollouts.jsonl"
        records = capture(store, args.rollouts, shape)
        with open(rollouts, "wb") as f:
            f.writelines(orjson.dumps(r) + b"\n" for r in records)
        finalized = finalize(rollouts, store, f"{work}/warm", "parquet")  # freezes once
        clear(f"{work}/warm")
        arrow = finalize(rollouts, store, f"{work}/warm", "arrow")
        clear(f"{work}/warm")
        parquet, arrow_part = finalized.rows or b"", arrow.rows or b""
        as_json = json_rows(finalized)
        table = read_rows(parquet)
        tokens = sum(len(ids) for ids in table.column("token_ids").to_pylist())
        print(
            f"{args.rollouts} rollouts x {args.turns} turns (S=1024, G=512, I=256): "
            f"{table.num_rows} rows, {tokens:,} tokens"
        )
        print(
            f"bytes: parquet {len(parquet):,}, JSON lines {len(as_json):,}: "
            f"{len(parquet) / len(as_json):.3f}x (goal <= 0.35x); Arrow part {len(arrow_part):,}: "
            f"{len(arrow_part) / len(as_json):.3f}x; JSONL records part "
            f"{len(finalized.part):,} ({len(parquet) / len(finalized.part):.3f}x)"
        )
        digest = hashlib.sha256(parquet).hexdigest()
        reads = Clocks(time.thread_time)  # both sides decode on the calling thread
        sides = {
            "json": lambda: json_tokens(as_json, arrays=False),
            "json+arrays": lambda: json_tokens(as_json),
            "parquet": lambda: parquet_tokens(parquet),
            "parquet verified": lambda: verified_parquet_tokens(parquet, digest),
        }
        timed = {side: reads.timed(side, fn, warm=True) for side, fn in sides.items()}
        alternate_sides(timed, 3 * args.repetitions)
        for side in sides:
            print(
                f"read every token, {side}: CPU {reads.seconds('cpu', side)}, "
                f"wall {reads.seconds('wall', side)}"
            )
        for baseline in ("json+arrays", "json"):
            for side in ("parquet", "parquet verified"):
                work_figure = side == "parquet" and baseline == "json+arrays"
                print(
                    f"  {side} faster than {baseline}: CPU {reads.ratio('cpu', baseline, side)}"
                    f"{' (the work figure)' if work_figure else ''}; "
                    f"wall {reads.ratio('wall', baseline, side)}"
                )
        trainer = trainer_reads(finalized, arrow, as_json, f"{work}/read", 3 * args.repetitions)
        print_trainer_read(f"large part ({tokens:,} tokens)", trainer)
        small_read(work, args.small_rollouts, shape, 3 * args.repetitions)
        delivered = emitted(finalized)
        encode = Clocks(time.thread_time)
        alternate_sides({"encode": encode.timed("encode", lambda: batch_rows(delivered))}, 5)
        writes, dest = Clocks(), f"{work}/dest"
        # Both sides finalize again (the captures are frozen): the rows of records that are
        # not the builder's projection are derived comparing every item, the dearer path.
        alternate_sides(
            {
                side: writes.timed(
                    side,
                    lambda side=side: finalize(rollouts, store, dest, side),
                    after=lambda: clear(dest),
                )
                for side in ("none", "parquet", "arrow")
            },
            3 * args.repetitions,
        )
        share = median(encode.cpu["encode"]) / median(writes.cpu["none"])
        print(
            f"finalize + hand off: rows none wall {writes.seconds('wall', 'none')}, parquet "
            f"{writes.seconds('wall', 'parquet')}: parquet/none wall "
            f"{writes.ratio('wall', 'parquet', 'none')} (goal <= 1.15x); CPU "
            f"{writes.ratio('cpu', 'parquet', 'none')}; arrow wall "
            f"{writes.seconds('wall', 'arrow')}: arrow/none wall "
            f"{writes.ratio('wall', 'arrow', 'none')}; CPU {writes.ratio('cpu', 'arrow', 'none')}"
        )
        print(
            f"  deriving and encoding the rows alone: CPU {encode.seconds('cpu', 'encode')}, "
            f"{share:.1%} of finalize's CPU without rows ({writes.seconds('cpu', 'none')})"
        )
        print(f"load {load()}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
