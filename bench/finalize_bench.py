"""Finalize throughput and memory on synthetic agentic rollouts, against parsing their JSON.

Baseline: `orjson.loads` of every entry as full-prompt JSON (already in memory).
Finalize is `finalize_rollout_token_capture` per rollout from a local store: freeze, read,
validate, build, project and check contiguity; `--concurrency` rollouts at once (default
as many as `finalize_batch` runs from a local tokcap store, `finalize_concurrency`; 1: one
after another). The reference, NeMo Gym's file store (`NemoGymFileStore`, the same captures
in its layout), is finalized the same way, at the same concurrency. The three sides
alternate over the repetitions; each finalize runs on a fresh copy of its captured store (a
freeze is done once). Peak RSS is measured in a fresh
process that finalizes one rollout. Prints medians, ranges and ratios; asserts nothing.
Every side is timed in wall and CPU seconds (`bench.ratios`); both ratios print with their
spread. With `--against REV`, it instead finalizes the same workload with this tree's
`capture_core` and `REV`'s, each in its own long-lived process that captured its own store,
alternated with an orjson parse in the same process, and prints each tree's finalize/parse
and the ratio of the two (`--against .` runs this tree against itself: the A/A spread).
Usage: .venv/bin/python -m bench.finalize_bench [--preset many|long|all] [--rollouts N]
       [--repetitions R] [--dir D] [--concurrency C] [--against REV]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import orjson

from bench import filesystem
from bench.ratios import (
    Sample,
    Stopwatch,
    TreeSides,
    against,
    alternate_samples,
    composed_root,
    describe_ratio,
    describe_samples,
    load,
    report_against,
    serve,
    timed,
)
from capture_core.delivery import finalize_rollout_token_capture

try:
    from capture_core.run.concurrency import finalize_concurrency
except ImportError:  # a tree before the run layer was split (`--against` an older revision)
    from capture_core.run.handoff import finalize_concurrency  # type: ignore[no-redef]
from capture_core.store import TokenCaptureStore
from capture_core.store.capture_entries import encode_entry
from capture_core.store.nemo_gym_store import NemoGymFileStore
from capture_core.testing.synthetic import RolloutShape, rollout_record, synthetic_rollout


@dataclass(frozen=True)
class Preset:
    name: str
    rollouts: int
    shape: RolloutShape


PRESETS = {
    "many": Preset(
        "200 rollouts x 16 turns (S=1024, G=512, I=256)",
        200,
        RolloutShape(turns=16, prompt_tokens=1024, generated_tokens=512, tool_tokens=256),
    ),
    "long": Preset(
        "1 rollout x 1000 turns (S=256, G=32, I=16)",
        1,
        RolloutShape(turns=1000, prompt_tokens=256, generated_tokens=32, tool_tokens=16),
    ),
}


def write_captures(
    root: str, preset: Preset, rollouts: int, layout: type = TokenCaptureStore
) -> list[dict]:
    """Capture every rollout, its calls in order as an agent makes them, rollouts in parallel.

    Every 10th rollout has a resolved retry, every 25th a lost call. `layout`: the store
    class that writes them (`NemoGymFileStore` for NeMo Gym's layout).
    """
    store = layout(root)

    def capture(i: int) -> dict:
        shape = preset.shape
        if i % 10 == 3:
            shape = RolloutShape(**{**shape.__dict__, "retried_turn": shape.turns // 2})
        for entry in synthetic_rollout(f"{i}-0", shape, seed=i):
            store.put_now(entry)
        if i % 25 == 7:
            store.mark_incomplete_now(f"{i}-0", "lost-call", reason="server restarted")
        return rollout_record(i, 0)

    with ThreadPoolExecutor(16) as pool:
        return list(pool.map(capture, range(rollouts)))


def stored_entry_blobs(root: str) -> list[bytes]:
    blobs = []
    for folder, _dirs, files in os.walk(root):
        if os.path.basename(folder) == "e":
            for name in files:
                with open(os.path.join(folder, name), "rb") as f:
                    blobs.append(f.read())
    return blobs


def full_prompt_blobs(root: str) -> list[bytes]:
    """Every entry as schema-1 JSON with its whole prompt: the reference's stored form."""
    store = TokenCaptureStore(root)
    rollouts = sorted(os.listdir(root))
    return [
        encode_entry(e) for r in rollouts if not r.startswith(".") for e in store.read_entries(r)
    ]


def parse_seconds(blobs: list[bytes]) -> Sample:
    def parse() -> None:
        for blob in blobs:
            orjson.loads(blob)

    return timed(parse)


def finalize_seconds(root: str, records: list[dict], concurrency: int = 1) -> tuple[Sample, int]:
    """Seconds to finalize `records`, `concurrency` rollouts at once (as `finalize_batch`
    does), and how many masked."""
    store = TokenCaptureStore(root)

    async def run() -> int:
        limit = asyncio.Semaphore(concurrency)

        async def one(record: dict) -> bool:
            async with limit:
                # A fresh copy, dropped after use, as the pipeline drops each batch after upload.
                copy = orjson.loads(orjson.dumps(record))
                built = await finalize_rollout_token_capture(copy, store)
                return bool(built and built["mask_sample"])

        return sum(await asyncio.gather(*map(one, records)))

    with Stopwatch() as watch:
        masked = asyncio.run(run())
    return watch.sample, masked


def high_water_rss() -> int:
    """Peak resident bytes of this process (VmHWM resets on exec, unlike ru_maxrss)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def peak_rss_child(root: str, record: dict) -> None:
    """Run in a fresh process: print baseline and peak RSS (bytes) around one finalize."""
    store = TokenCaptureStore(root)
    before = high_water_rss()
    built = asyncio.run(finalize_rollout_token_capture(record, store))
    after = high_water_rss()
    assert built is not None
    print(orjson.dumps({"before": before, "after": after}).decode())


def peak_rss_of_one_rollout(shape: RolloutShape) -> tuple[int, int]:
    """Capture rollout `0-0` into a fresh store; return RSS (before, peak) of finalizing it."""
    fresh = tempfile.mkdtemp(prefix="tokcap-bench-rss-")
    try:
        store = TokenCaptureStore(fresh)
        for entry in synthetic_rollout("0-0", shape):
            store.put_now(entry)
        return peak_rss(fresh, rollout_record(0, 0))
    finally:
        shutil.rmtree(fresh, ignore_errors=True)


def peak_rss(root: str, record: dict) -> tuple[int, int]:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.finalize_bench",
            "--rss-child",
            root,
            orjson.dumps(record).decode(),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    figures = orjson.loads(out.stdout.strip().splitlines()[-1])
    return figures["before"], figures["after"]


def finalize_fresh(template: str, records: list[dict], concurrency: int = 1) -> Sample:
    """Seconds to finalize `records` from a fresh copy of the captured store `template`."""
    copy = f"{template}-run"
    shutil.copytree(template, copy)
    # Flushed before the timed region, so a timed freeze's fsyncs never flush the copy's data;
    # one sync, not an fsync per file (3,200 of them took about 25 s at load 20).
    os.sync()
    try:
        return finalize_seconds(copy, records, concurrency)[0]
    finally:
        shutil.rmtree(copy, ignore_errors=True)


def run_preset(
    key: str, rollouts: int | None, repetitions: int, space: str | None, concurrency: int | None
) -> None:
    """One preset's figures; `concurrency` None: as many at once as `finalize_batch` runs
    from tokcap's store (`finalize_concurrency`), for NeMo Gym's store too, so both sides
    do the same work."""
    preset = PRESETS[key]
    count = rollouts or preset.rollouts
    root = tempfile.mkdtemp(prefix=f"tokcap-bench-{key}-", dir=space)
    gym_root = tempfile.mkdtemp(prefix=f"nemo-gym-bench-{key}-", dir=space)
    concurrency = concurrency or finalize_concurrency(TokenCaptureStore(root))
    try:
        start = time.perf_counter()
        records = write_captures(root, preset, count)
        write_captures(gym_root, preset, count, NemoGymFileStore)
        blobs = stored_entry_blobs(root)
        stored = sum(len(b) for b in blobs)
        full = full_prompt_blobs(root)
        print(
            f"\n== {preset.name}, {count} rollout(s), {concurrency} at once: {len(blobs)} entries, "
            f"{stored / 2**20:.1f} MiB stored, {sum(map(len, full)) / 2**20:.1f} MiB as "
            f"full-prompt JSON (captured in both layouts in {time.perf_counter() - start:.1f}s)"
        )
        load_before = load()
        seconds = alternate_samples(
            {
                "parse": lambda: parse_seconds(full),
                "tokcap": lambda: finalize_fresh(root, records, concurrency),
                "nemo_gym": lambda: finalize_fresh(gym_root, records, concurrency),
            },
            repetitions,
        )
        print(f"orjson parse, full-prompt JSON: {describe_samples(seconds['parse'])}")
        for side, name in (("tokcap", "tokcap"), ("nemo_gym", "NeMo Gym's file store")):
            print(f"finalize from {name}: {describe_samples(seconds[side])}")
            print(f"  finalize/parse: {describe_ratio(seconds[side], seconds['parse'])}")
        print(f"tokcap / NeMo Gym: {describe_ratio(seconds['tokcap'], seconds['nemo_gym'])}")
        print(
            f"goal: tokcap <= 1.5x parse; load average (1 min) {load_before:.1f} before, "
            f"{load():.1f} after"
        )
        if key == "long":
            before, after = peak_rss_of_one_rollout(preset.shape)
            print(
                f"peak RSS of one finalize: {after / 2**20:.0f} MiB ({(after - before) / 2**20:.0f}"
                f" MiB above the {before / 2**20:.0f} MiB baseline); growth / stored (delta) "
                f"bytes = {(after - before) / stored:.0f}x"
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(gym_root, ignore_errors=True)


def serve_preset(
    key: str, rollouts: int | None, space: str | None, concurrency: int | None
) -> None:
    """Child of `--against`: capture the preset with this process's `capture_core`, then
    answer `parse` and `finalize` requests (`bench.ratios.serve`)."""
    preset = PRESETS[key]
    root = tempfile.mkdtemp(prefix=f"tokcap-bench-{key}-", dir=space)
    try:
        records = write_captures(root, preset, rollouts or preset.rollouts)
        full = full_prompt_blobs(root)
        limit = concurrency or finalize_concurrency(TokenCaptureStore(root))
        serve(
            {
                "parse": lambda: parse_seconds(full),
                "finalize": lambda: finalize_fresh(root, records, limit),
            }
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run_against(
    rev: str,
    key: str,
    rollouts: int | None,
    repetitions: int,
    space: str | None,
    concurrency: int | None,
) -> None:
    """This tree's finalize/parse against `rev`'s, alternated in one run."""
    work = tempfile.mkdtemp(prefix="tokcap-bench-against-", dir=space)
    args = ["--preset", key, *(["--rollouts", str(rollouts)] if rollouts else [])]
    args += [
        *(["--dir", space] if space else []),
        *(["--concurrency", str(concurrency)] if concurrency else []),
    ]
    names = {"this tree": ".", rev if rev != "." else "this tree again": rev}
    trees = {}
    try:
        for name, tree in names.items():
            trees[name] = TreeSides(composed_root(tree, work), "bench.finalize_bench", args)
        before = load()
        samples = against(trees, "parse", "finalize", repetitions)
        print(
            f"\n== finalize {PRESETS[key].name}: finalize/parse per tree, load {before:.1f} "
            f"before, {load():.1f} after"
        )
        for line in report_against(samples, *names):
            print(line)
    finally:
        for tree in trees.values():
            tree.close()
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    logging.getLogger("capture_core").setLevel(logging.ERROR)
    if len(sys.argv) == 4 and sys.argv[1] == "--rss-child":
        peak_rss_child(sys.argv[2], orjson.loads(sys.argv[3]))
        return
    if sys.argv[1:2] == ["--serve"]:
        sys.argv.pop(1)
        serving = True
    else:
        serving = False
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--preset", choices=["many", "long", "all"], default="all")
    parser.add_argument("--rollouts", type=int, default=None, help="override the rollout count")
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument(
        "--dir", default=None, help="where to write (/dev/shm: no fsync cost, CPU alone)"
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="rollouts finalized at once, as finalize_batch does (1: one after another)",
    )
    parser.add_argument(
        "--against", help="compare finalize/parse with this revision's capture_core ('.': A/A)"
    )
    args = parser.parse_args()
    if serving:
        serve_preset(args.preset, args.rollouts, args.dir, args.concurrency)
        return
    print(filesystem.describe(args.dir or tempfile.gettempdir()))
    for key in ("many", "long") if args.preset == "all" else (args.preset,):
        if args.against:
            run_against(
                args.against, key, args.rollouts, args.repetitions, args.dir, args.concurrency
            )
        else:
            run_preset(key, args.rollouts, args.repetitions, args.dir, args.concurrency)


if __name__ == "__main__":
    main()
