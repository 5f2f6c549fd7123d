"""Durable put throughput of the capture store, against raw durable creates in the same run.

Workload: agentic rollouts (16 turns, prompts growing from 1,024 tokens), each rollout's
calls put in order by one writer, `concurrency` writers at once. Every entry is parsed from
its JSON before the timed region, as a served response is: its token ids are distinct int
objects, never the ones of the call before it (no identity shortcut in comparisons).
Baseline, alternated with the puts over the repetitions: the same stored bytes written as
new files with O_EXCL create, write, fsync of the file and fsync of its folder (durable,
like a put), by as many writers.
Prints puts/s, the time ratio put/raw (median and range) and the reference's figure scaled
by this run's raw baseline. Also a floor: raw creates that each first spend, in Python, the
CPU time a put's encoding alone takes (measured in the same run). No Python put doing that
work can beat this ratio, because Python work holds the interpreter lock and the writers
take turns. Asserts nothing.
Every side writes into fresh folders under one bench folder, removed only at the end: on
ext4 without a journal, files deleted just before a run slow that run's creates (see
`bench/filesystem.py`), and which side pays for the other's deletions would depend on the
inode allocator. The header names the filesystem measured; `--dir` picks another.
With `--against COMMIT`, it instead puts the same entries with the capture store of that commit
(its tree extracted by `git archive`), alternated with this tree's, each side in a fresh
process, and prints puts/s of both and their ratio: the figure for "no lower than before".
Usage: .venv/bin/python -m bench.store_bench [--rollouts N] [--repetitions R] [--dir D] [--s3]
       [--against COMMIT]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import orjson

from bench import filesystem
from bench.finalize_bench import PRESETS, stored_entry_blobs
from bench.ratios import (
    Sample,
    Stopwatch,
    alternate,
    alternate_samples,
    describe_ratio,
    load,
    median,
    ratios_of,
    spread,
    verdict,
)
from capture_core.records import TokenEntry
from capture_core.store import TokenCaptureStore, compact
from capture_core.store.capture_layout import call_key
from capture_core.testing.synthetic import synthetic_rollout

SHAPE = PRESETS["many"].shape
# The reference's puts/s and the raw durable creates/s measured beside it (2 cores, loaded).
REFERENCE = {16: (396.0, 994.0), 1: (284.0, 431.0)}
GOALS = {16: 1.5, 1: 1.3}


def workload(rollouts: int) -> list[list[TokenEntry]]:
    """Seeded rollouts, each entry parsed from its own JSON (fresh token objects)."""
    return [
        [
            TokenEntry.model_validate_json(orjson.dumps(e.wire_dump()))
            for e in synthetic_rollout(f"{i}-0", SHAPE, seed=i)
        ]
        for i in range(rollouts)
    ]


def run_writers(concurrency: int, jobs: list[Callable[[], None]]) -> Sample:
    """Wall and CPU seconds to run every job with `concurrency` threads (a job: one writer's
    calls)."""
    with Stopwatch() as watch, ThreadPoolExecutor(concurrency) as pool:
        for future in [pool.submit(job) for job in jobs]:
            future.result()
    return watch.sample


def raw_durable_create(folder: str, name: str, data: bytes) -> None:
    """A durable new file: O_EXCL create, write, fsync, then fsync of the folder."""
    fd = os.open(os.path.join(folder, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    folder_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(folder_fd)
    finally:
        os.close(folder_fd)


def encoding_cpu_seconds(rollouts: list[list[TokenEntry]]) -> float:
    """CPU seconds per put of the encoding alone (delta, digests, JSON, seal), one thread."""
    start = time.process_time()
    for entries in rollouts:
        parents: list[compact.Known] = []
        for entry in entries:
            encoded = compact.encode(entry, call_key(entry.model_call_id), parents)
            if encoded.known is not None:
                parents = [*parents[-7:], encoded.known]
    return (time.process_time() - start) / sum(len(entries) for entries in rollouts)


def hold_the_interpreter(seconds: float) -> None:
    """Busy Python work for `seconds`: it holds the interpreter lock, as an encoding does."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def raw_seconds(
    space: str, blobs: list[list[bytes]], concurrency: int, python_seconds: float = 0.0
) -> Sample:
    folder = tempfile.mkdtemp(prefix="raw-", dir=space)

    def write(i: int, rollout: list[bytes]) -> None:
        for n, blob in enumerate(rollout):
            if python_seconds:
                hold_the_interpreter(python_seconds)
            raw_durable_create(folder, f"{i}-{n}", blob)

    return run_writers(concurrency, [(lambda i=i, r=r: write(i, r)) for i, r in enumerate(blobs)])


def put_seconds(
    space: str,
    rollouts: list[list[TokenEntry]],
    concurrency: int,
    keep: list[bytes] | None = None,
) -> Sample:
    root = tempfile.mkdtemp(prefix="store-", dir=space)
    store = TokenCaptureStore(root)

    def capture(entries: list[TokenEntry]) -> None:
        for entry in entries:
            store.put_now(entry)

    try:
        seconds = run_writers(concurrency, [(lambda r=r: capture(r)) for r in rollouts])
        if keep is not None:
            keep.extend(stored_entry_blobs(root))
        return seconds
    finally:
        store.close_now()


def bench_local(
    space: str, rollouts: list[list[TokenEntry]], concurrency: int, repetitions: int
) -> None:
    flat: list[bytes] = []
    put_seconds(space, rollouts, concurrency, keep=flat)  # warm-up; collects the stored bytes
    per_rollout = len(flat) // len(rollouts)
    blobs = [flat[i : i + per_rollout] for i in range(0, len(flat), per_rollout)]
    puts = len(flat)
    before = load()
    sides = alternate_samples(
        {
            "raw": lambda: raw_seconds(space, blobs, concurrency),
            "put": lambda: put_seconds(space, rollouts, concurrency),
        },
        repetitions,
    )
    ref_puts, ref_raw = REFERENCE[concurrency]
    ref_ratio = ref_raw / ref_puts
    wall, _cpu = ratios_of(sides["put"], sides["raw"])
    print(
        f"local put, concurrency {concurrency:>2}: "
        f"{puts / median([s.wall for s in sides['put']]):6.0f} puts/s; raw durable creates "
        f"{puts / median([s.wall for s in sides['raw']]):6.0f}/s; CPU per put "
        f"{median([s.cpu for s in sides['put']]) / puts * 1e6:.0f} us, per raw create "
        f"{median([s.cpu for s in sides['raw']]) / puts * 1e6:.0f} us; load {before:.1f}"
    )
    print(
        f"  put/raw (goal <= {GOALS[concurrency]}x): {describe_ratio(sides['put'], sides['raw'])}"
    )
    print(
        f"  reference: {ref_puts:.0f} puts/s beside raw {ref_raw:.0f}/s, i.e. {ref_ratio:.2f}x "
        f"raw; scaled by this run's raw, puts/s over the reference = "
        f"{ref_ratio / median(wall):.2f}x"
    )
    encoding = encoding_cpu_seconds(rollouts)
    floor = alternate(
        lambda: raw_seconds(space, blobs, concurrency).wall,
        lambda: raw_seconds(space, blobs, concurrency, encoding).wall,
        repetitions,
    )
    print(
        f"  floor: raw creates each first spending a put's encoding CPU in Python "
        f"({encoding * 1e6:.0f} us) = {floor.describe()} of raw"
    )


# Run in a fresh process whose `capture_core` is the tree given first on PYTHONPATH: it parses
# the entries from their JSON (fresh int objects) and prints the seconds of the puts alone.
_PUT_CHILD = """
import json, sys, tempfile, time
from concurrent.futures import ThreadPoolExecutor
import capture_core
from capture_core.records import TokenEntry
from capture_core.store import TokenCaptureStore
assert capture_core.__file__.startswith(sys.argv[1]), capture_core.__file__
with open(sys.argv[2], "rb") as f:
    rollouts = [[TokenEntry.model_validate_json(line) for line in r.splitlines()]
                for r in f.read().split(b"\\n\\n") if r]
store = TokenCaptureStore(tempfile.mkdtemp(prefix="store-", dir=sys.argv[3]))
def capture(entries):
    for entry in entries:
        store.put_now(entry)
start, cpu = time.perf_counter(), time.process_time()
with ThreadPoolExecutor(int(sys.argv[4])) as pool:
    for future in [pool.submit(capture, r) for r in rollouts]:
        future.result()
print(json.dumps([time.perf_counter() - start, time.process_time() - cpu]))
"""


def tree_of(commit: str, into: str) -> str:
    """The source tree of `commit` (this repository's), extracted under `into`."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    tree = os.path.join(into, f"tree-{commit}")
    if os.path.isdir(tree):
        return tree
    os.makedirs(tree)
    archive = subprocess.run(
        ["git", "-C", repo, "archive", commit], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
    return tree


def child_put_seconds(tree: str, entries: str, space: str, concurrency: int) -> Sample:
    """Wall and CPU seconds of the puts alone by `tree`'s capture store, in a fresh process."""
    env = {**os.environ, "PYTHONPATH": tree}
    out = subprocess.run(
        [sys.executable, "-c", _PUT_CHILD, tree, entries, space, str(concurrency)],
        check=True,
        capture_output=True,
        env=env,
        cwd=tree,  # `python -c` puts the working folder first on the path
        text=True,
    ).stdout
    wall, cpu = orjson.loads(out.strip().splitlines()[-1])
    return Sample(wall, cpu)


def bench_against(
    commit: str, space: str, rollouts: list[list[TokenEntry]], concurrency: int, repetitions: int
) -> None:
    """Puts/s of this tree against `commit`'s, alternated, same entries, same filesystem."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    old = tree_of(commit, space)
    entries = os.path.join(space, "entries.jsonl")
    with open(entries, "wb") as f:
        f.write(b"\n\n".join(b"\n".join(orjson.dumps(e.wire_dump()) for e in r) for r in rollouts))
    puts = sum(len(r) for r in rollouts)
    before = load()
    sides = alternate_samples(
        {
            "old": lambda: child_put_seconds(old, entries, space, concurrency),
            "new": lambda: child_put_seconds(here, entries, space, concurrency),
        },
        repetitions,
    )
    print(
        f"local put, concurrency {concurrency:>2}: this tree "
        f"{puts / median([s.wall for s in sides['new']]):6.0f} puts/s, CPU "
        f"{median([s.cpu for s in sides['new']]) / puts * 1e6:.0f} us/put; {commit} "
        f"{puts / median([s.wall for s in sides['old']]):6.0f} puts/s, CPU "
        f"{median([s.cpu for s in sides['old']]) / puts * 1e6:.0f} us/put; "
        f"load {before:.1f} before, {load():.1f} after"
    )
    wall, cpu = ratios_of(sides["new"], sides["old"])
    print(f"  time this/that (goal <= 1x): wall {spread(wall)}; CPU {spread(cpu)}")
    print(f"    CPU: {verdict(cpu)}")


def bench_s3(rollouts: list[list[TokenEntry]]) -> None:
    import s3fs

    from tests.support.servers import FAKE_AWS_ENV, moto_server

    os.environ.update(FAKE_AWS_ENV)
    entries = [e for rollout in rollouts for e in rollout]
    with moto_server() as endpoint:
        options = {"endpoint_url": endpoint}
        s3fs.S3FileSystem(**options).mkdir("bench")
        for concurrency in (1, 16):
            store = TokenCaptureStore(f"s3://bench/c{concurrency}", options)
            seconds = run_writers(
                concurrency, [(lambda r=r, s=store: [s.put_now(e) for e in r]) for r in rollouts]
            )
            print(
                f"s3 (moto) put, concurrency {concurrency:>2}: "
                f"{len(entries) / seconds.wall:8.0f} puts/s"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rollouts", type=int, default=100)
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--concurrency", type=int, nargs="*", default=[16, 1])
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where to write")
    parser.add_argument("--s3", action="store_true", help="also put against a moto server")
    parser.add_argument("--against", help="compare puts/s with this commit's store, not raw")
    args = parser.parse_args()
    rollouts = workload(args.rollouts)
    print(f"{args.rollouts} rollouts x {SHAPE.turns} calls (S={SHAPE.prompt_tokens})")
    print(filesystem.describe(args.dir))
    space = tempfile.mkdtemp(prefix="tokcap-store-bench-", dir=args.dir)
    try:
        for concurrency in args.concurrency:
            if args.against:
                bench_against(args.against, space, rollouts, concurrency, args.repetitions)
            else:
                bench_local(space, rollouts, concurrency, args.repetitions)
    finally:
        shutil.rmtree(space, ignore_errors=True)
    if args.s3:
        bench_s3(rollouts[:30])


if __name__ == "__main__":
    main()
