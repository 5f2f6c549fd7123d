"""Local retirement of a batch (`retire_receipt`), beside NeMo Gym's file store and raw
removal of the same files, in the same run.

Workloads as in finalize_bench: 200 rollouts x 16 turns, and 1 rollout x 1,000 turns; the
part holds their finalized records (retirement re-reads and decides from them).
Five sides, alternated over the repetitions: retirement from tokcap's store (its two-phase
`drop_many`), timed until it returns; the same, timed until the background removal of the
event folders it moved aside is done too (on local disk a retirement renames them into the
store's temporaries and unlinks their files off its path; the first side awaits that removal
after its timed region, so it never runs into another side's time); the same store retired
one `drop` per rollout (`drop_each`, what retirement did before `drop_many`); the same
retirement from a store in NeMo Gym's file-store layout (`NemoGymFileStore`, the reference:
its protocol under its per-rollout lock); raw removal: unlink every file the capture holds,
then fsync each rollout folder once (no decision, no tombstone, no verification), with as
many threads as retirement's concurrency. Prints each side's median and range and tokcap's
ratio to both. Asserts nothing.
Every side is timed in wall and CPU seconds (`bench.ratios`); both ratios print with their
spread. With `--against REV`, each tree (this one and `REV`'s `capture_core`) runs in its own
long-lived process, its retirement alternated with NeMo Gym's store's in that process, and
the ratio of the trees' ratios prints (`--against .`: this tree against itself, the A/A spread).
Usage: .venv/bin/python -m bench.retire_bench [--repetitions R] [--preset many|long|all]
       [--against REV [--cleanup]]
`--cleanup` times each tree's retirement with its background removal awaited.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import logging
import os
import shutil
import sys
import tempfile
import uuid
from concurrent.futures import ThreadPoolExecutor

import orjson

from bench.finalize_bench import PRESETS
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
)
from capture_core.delivery import finalize_rollout_token_capture
from capture_core.protocols import TokenCaptureSnapshot

try:
    from capture_core.run.concurrency import store_concurrency
    from capture_core.run.receipt import HandoffReceipt, RolloutOutcome
    from capture_core.run.retirement import retire_receipt
except ImportError:  # a tree before the run layer was split (`--against` an older revision)
    from capture_core.run.handoff import (  # type: ignore[no-redef]
        HandoffReceipt,
        RolloutOutcome,
        retire_receipt,
        store_concurrency,
    )
from capture_core.storage import ByteStore, open_byte_store

try:
    from capture_core.storage.local.temporaries import wait_removed
except ImportError:  # a tree whose retirement unlinks in place (`--against` an older revision)

    def wait_removed(timeout: float | None = None) -> bool:
        return True


from capture_core.store import TokenCaptureStore
from capture_core.store.nemo_gym_store import NemoGymFileStore
from capture_core.testing.synthetic import rollout_record, synthetic_rollout

# The reference's figures when they were first measured (seconds), for the record.
REFERENCE_SECONDS = {"many": 1.07, "long": 0.13}
STORES = {"tokcap": TokenCaptureStore, "nemo_gym": NemoGymFileStore}


def captured(key: str, rollouts: int, layout: str = "tokcap") -> tuple[str, list]:
    """A fresh store holding the preset's frozen rollouts; return it and their snapshots."""
    root = tempfile.mkdtemp(prefix=f"{layout}-retire-")
    store = STORES[layout](root)

    def one(i: int) -> None:
        for entry in synthetic_rollout(f"{i}-0", PRESETS[key].shape, seed=i):
            store.put_now(entry)

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(one, range(rollouts)))
    return root, [store.freeze_now(f"{i}-0") for i in range(rollouts)]


def finalized_part(store: TokenCaptureStore, rollouts: int) -> bytes:
    """The part of the batch: each rollout's record finalized from its capture, in order.

    Retirement decides from these records, so they are the real ones, not a placeholder.
    """
    records = [rollout_record(i, 0) for i in range(rollouts)]
    for record in records:
        asyncio.run(finalize_rollout_token_capture(record, store))
    return b"".join(orjson.dumps(record) + b"\n" for record in records)


def handed_off(receipt: HandoffReceipt, part: bytes) -> ByteStore:
    """A destination holding `part`, matching `receipt`, which retirement re-verifies."""
    dest = open_byte_store(f"memory://tokcap-bench-{uuid.uuid4().hex}")
    dest.create(receipt.part_key, part)
    receipt.sha256, receipt.bytes = hashlib.sha256(part).hexdigest(), len(part)
    return dest


class OneByOne:
    """The store as a plain `TokenSource`, so retirement drops its rollouts one by one."""

    def __init__(self, store: TokenCaptureStore) -> None:
        self.store = store

    async def freeze(self, rollout_id: str) -> TokenCaptureSnapshot:
        return await self.store.freeze(rollout_id)

    async def drop(self, rollout_id: str, *, snapshot_id: str, version: int) -> bool:
        return await self.store.drop(rollout_id, snapshot_id=snapshot_id, version=version)

    async def close(self) -> None:
        await self.store.close()


def retire_seconds(
    key: str, rollouts: int, layout: str = "tokcap", one_by_one: bool = False, cleanup: bool = False
) -> Sample:
    """One retirement of the preset from a fresh store. `cleanup`: the time also covers the
    background removal of what the retirement moved aside (`wait_removed`); otherwise that
    removal is awaited after the timed region, so it never runs into another side's time."""
    root, snapshots = captured(key, rollouts, layout)
    store = STORES[layout](root)
    receipt = HandoffReceipt(
        run_id="bench",
        batch=0,
        receipt_key="bench",
        part_key="bench",
        sha256="",
        bytes=0,
        records=rollouts,
        rollouts=[
            RolloutOutcome(
                line=i,
                rollout_id=s.rollout_id,
                can_retire=True,
                snapshot_id=s.snapshot_id,
                version=s.version,
            )
            for i, s in enumerate(snapshots)
        ],
    )
    part = finalized_part(store, rollouts)
    try:
        with Stopwatch() as watch:
            dest = handed_off(receipt, part)
            source = OneByOne(store) if one_by_one else store
            outcome = asyncio.run(retire_receipt(receipt, source, dest))
            if cleanup:
                wait_removed()
        wait_removed()  # never into the next side's time
        assert len(outcome.retired) == rollouts, outcome
        return watch.sample
    finally:
        store.close_now()
        shutil.rmtree(root, ignore_errors=True)


def raw_seconds(key: str, rollouts: int) -> Sample:
    root, _snapshots = captured(key, rollouts)

    def remove(i: int) -> None:
        folder = os.path.join(root, f"{i}-0")
        for sub in ("e", "i", "x"):
            path = os.path.join(folder, sub)
            for name in os.listdir(path) if os.path.isdir(path) else ():
                os.unlink(os.path.join(path, name))
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        os.fsync(fd)
        os.close(fd)

    try:
        with Stopwatch() as watch, ThreadPoolExecutor(store_concurrency()) as pool:
            list(pool.map(remove, range(rollouts)))
        return watch.sample
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run_against(rev: str, key: str, repetitions: int, cleanup: bool = False) -> None:
    """This tree's retire / NeMo Gym's store against `rev`'s, alternated in one run;
    `cleanup`: each tree's retirement timed with its background removal awaited."""
    work = tempfile.mkdtemp(prefix="tokcap-retire-against-")
    names = {"this tree": ".", rev if rev != "." else "this tree again": rev}
    trees = {}
    try:
        for name, tree in names.items():
            trees[name] = TreeSides(
                composed_root(tree, work), "bench.retire_bench", ["--preset", key]
            )
        before = load()
        side = "tokcap_cleanup" if cleanup else "tokcap"
        samples = against(trees, "nemo_gym", side, repetitions)
        print(
            f"\n== retire {PRESETS[key].name}{' with its background removal' * cleanup}: "
            f"tokcap / NeMo Gym's store per tree, load "
            f"{before:.1f} before, {load():.1f} after"
        )
        for line in report_against(samples, *names):
            print(line)
    finally:
        for tree in trees.values():
            tree.close()
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    serving = sys.argv[1:2] == ["--serve"]
    if serving:
        sys.argv.pop(1)
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--preset", choices=["many", "long", "all"], default="all")
    parser.add_argument("--against", help="compare with this revision's capture_core ('.': A/A)")
    parser.add_argument(
        "--cleanup",
        action="store_true",
        help="with --against: time tokcap's retirement with its background removal awaited",
    )
    args = parser.parse_args()
    logging.getLogger("capture_core").setLevel(logging.ERROR)
    if serving:
        n = PRESETS[args.preset].rollouts
        serve(
            {
                "tokcap": lambda: retire_seconds(args.preset, n),
                "tokcap_cleanup": lambda: retire_seconds(args.preset, n, cleanup=True),
                "nemo_gym": lambda: retire_seconds(args.preset, n, "nemo_gym"),
            }
        )
        return
    for key in ("many", "long") if args.preset == "all" else (args.preset,):
        if args.against:
            run_against(args.against, key, args.repetitions, args.cleanup)
            continue
        preset = PRESETS[key]
        n = preset.rollouts
        before = load()
        seconds = alternate_samples(
            {
                "tokcap": lambda key=key, n=n: retire_seconds(key, n),
                "cleanup": lambda key=key, n=n: retire_seconds(key, n, cleanup=True),
                "one_by_one": lambda key=key, n=n: retire_seconds(key, n, one_by_one=True),
                "nemo_gym": lambda key=key, n=n: retire_seconds(key, n, "nemo_gym"),
                "raw": lambda key=key, n=n: raw_seconds(key, n),
            },
            args.repetitions,
        )
        print(f"\n== retire {preset.name}, load {before:.1f} before, {load():.1f} after")
        for side, name in (
            ("tokcap", "tokcap (until retirement returns)"),
            ("cleanup", "tokcap with its background removal"),
            ("one_by_one", "tokcap one drop per rollout"),
            ("nemo_gym", "NeMo Gym's file store"),
            ("raw", "raw unlink"),
        ):
            print(f"{name}: {describe_samples(seconds[side])}")
        print(
            f"tokcap / NeMo Gym (goal <= 0.8x): "
            f"{describe_ratio(seconds['tokcap'], seconds['nemo_gym'])}"
        )
        print(
            f"tokcap with its background removal / NeMo Gym: "
            f"{describe_ratio(seconds['cleanup'], seconds['nemo_gym'])}"
        )
        print(
            f"one by one / NeMo Gym: {describe_ratio(seconds['one_by_one'], seconds['nemo_gym'])}"
        )
        print(f"tokcap / raw: {describe_ratio(seconds['tokcap'], seconds['raw'])}")
        print(f"the reference first measured {REFERENCE_SECONDS[key]:.2f}s (wall)")


if __name__ == "__main__":
    main()
