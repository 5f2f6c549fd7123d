"""Local retirement of a batch (`retire_receipt`), beside NeMo Gym's file store and raw
removal of the same files, in the same run.

Workloads as in finalize_bench: 200 rollouts x 16 turns, and 1 rollout x 1,000 turns; the
part holds their finalized records (retirement re-reads and decides from them).
Four sides, alternated over the repetitions: retirement from tokcap's store (its two-phase
`drop_many`); the same store retired one `drop` per rollout (`drop_each`, what retirement
did before `drop_many`); the same retirement from a store in NeMo Gym's file-store layout
(`NemoGymFileStore`, the reference: its protocol under its per-rollout lock); raw removal:
unlink every file the
capture holds, then fsync each rollout folder once (no decision, no tombstone, no
verification), with as many threads as retirement's concurrency. Prints each side's median
and range and tokcap's ratio to both. Asserts nothing.
Usage: .venv/bin/python -m bench.retire_bench [--repetitions R] [--preset many|long|all]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import logging
import os
import shutil
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import orjson

from bench.finalize_bench import PRESETS
from bench.ratios import alternate_sides, describe_seconds, median
from capture_core.delivery import finalize_rollout_token_capture
from capture_core.protocols import TokenCaptureSnapshot
from capture_core.run.concurrency import store_concurrency
from capture_core.run.receipt import HandoffReceipt, RolloutOutcome
from capture_core.run.retirement import retire_receipt
from capture_core.storage import ByteStore, open_byte_store
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
    key: str, rollouts: int, layout: str = "tokcap", one_by_one: bool = False
) -> float:
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
        start = time.perf_counter()
        dest = handed_off(receipt, part)
        source = OneByOne(store) if one_by_one else store
        outcome = asyncio.run(retire_receipt(receipt, source, dest))
        seconds = time.perf_counter() - start
        assert len(outcome.retired) == rollouts, outcome
        return seconds
    finally:
        store.close_now()
        shutil.rmtree(root, ignore_errors=True)


def raw_seconds(key: str, rollouts: int) -> float:
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
        start = time.perf_counter()
        with ThreadPoolExecutor(store_concurrency()) as pool:
            list(pool.map(remove, range(rollouts)))
        return time.perf_counter() - start
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--preset", choices=["many", "long", "all"], default="all")
    args = parser.parse_args()
    logging.getLogger("capture_core").setLevel(logging.ERROR)
    for key in ("many", "long") if args.preset == "all" else (args.preset,):
        preset = PRESETS[key]
        n = preset.rollouts
        seconds = alternate_sides(
            {
                "tokcap": lambda key=key, n=n: retire_seconds(key, n),
                "one_by_one": lambda key=key, n=n: retire_seconds(key, n, one_by_one=True),
                "nemo_gym": lambda key=key, n=n: retire_seconds(key, n, "nemo_gym"),
                "raw": lambda key=key, n=n: raw_seconds(key, n),
            },
            args.repetitions,
        )
        sides = ("tokcap", "one_by_one", "nemo_gym", "raw")
        mine, each, gym, raw = (median(seconds[side]) for side in sides)
        print(
            f"retire {preset.name}, {len(seconds['raw'])} reps: tokcap "
            f"{describe_seconds(seconds['tokcap'])}; tokcap one drop per rollout "
            f"{describe_seconds(seconds['one_by_one'])}; NeMo Gym's file store "
            f"{describe_seconds(seconds['nemo_gym'])}; raw unlink "
            f"{describe_seconds(seconds['raw'])}"
        )
        print(
            f"  tokcap / NeMo Gym = {mine / gym:.2f}x (goal <= 1x); one by one / NeMo Gym = "
            f"{each / gym:.2f}x; tokcap / raw = {mine / raw:.2f}x; the reference first "
            f"measured {REFERENCE_SECONDS[key]:.2f}s"
        )


if __name__ == "__main__":
    main()
