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
Usage: .venv/bin/python -m bench.finalize_bench [--preset many|long|all] [--rollouts N]
       [--repetitions R] [--dir D] [--concurrency C]
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
from bench.ratios import alternate_sides, describe_seconds, median
from capture_core.delivery import finalize_rollout_token_capture
from capture_core.run.concurrency import finalize_concurrency
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


def parse_seconds(blobs: list[bytes]) -> float:
    start = time.perf_counter()
    for blob in blobs:
        orjson.loads(blob)
    return time.perf_counter() - start


def finalize_seconds(root: str, records: list[dict], concurrency: int = 1) -> tuple[float, int]:
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

    start = time.perf_counter()
    masked = asyncio.run(run())
    return time.perf_counter() - start, masked


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


def durable_copy(source: str, target: str) -> None:
    """Copy a file and fsync it, so a timed freeze's fsyncs never flush the copy's data."""
    shutil.copy2(source, target)
    fd = os.open(target, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def finalize_fresh(template: str, records: list[dict], concurrency: int = 1) -> float:
    """Seconds to finalize `records` from a fresh copy of the captured store `template`."""
    copy = f"{template}-run"
    shutil.copytree(template, copy, copy_function=durable_copy)
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
        load_before = os.getloadavg()[0]
        seconds = alternate_sides(
            {
                "parse": lambda: parse_seconds(full),
                "tokcap": lambda: finalize_fresh(root, records, concurrency),
                "nemo_gym": lambda: finalize_fresh(gym_root, records, concurrency),
            },
            repetitions,
        )
        ratios = {
            side: [t / p for t, p in zip(seconds[side], seconds["parse"], strict=True)]
            for side in ("tokcap", "nemo_gym")
        }
        print(f"orjson parse, full-prompt JSON: {describe_seconds(seconds['parse'])}")
        for side, name in (("tokcap", "tokcap"), ("nemo_gym", "NeMo Gym's file store")):
            r = ratios[side]
            print(
                f"finalize from {name}: {describe_seconds(seconds[side])}; finalize/parse = "
                f"{median(r):.2f}x (range {min(r):.2f}-{max(r):.2f})"
            )
        print(
            f"goal: tokcap <= 2x; tokcap / NeMo Gym = "
            f"{median(seconds['tokcap']) / median(seconds['nemo_gym']):.2f}x; load average "
            f"(1 min) {load_before:.1f} before, {os.getloadavg()[0]:.1f} after"
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


def main() -> None:
    logging.getLogger("capture_core").setLevel(logging.ERROR)
    if len(sys.argv) == 4 and sys.argv[1] == "--rss-child":
        peak_rss_child(sys.argv[2], orjson.loads(sys.argv[3]))
        return
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
    args = parser.parse_args()
    print(filesystem.describe(args.dir or tempfile.gettempdir()))
    for key in ("many", "long") if args.preset == "all" else (args.preset,):
        run_preset(key, args.rollouts, args.repetitions, args.dir, args.concurrency)


if __name__ == "__main__":
    main()
