"""Batches finalize and retire several rollouts at once, bounded by a setting."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import orjson
import pytest

from bench.retire_bench import handed_off
from capture_core.delivery import finalize_rollout_token_capture
from capture_core.protocols import TokenCaptureSnapshot
from capture_core.run.batch_finalize import finalize_batch
from capture_core.run.concurrency import (
    LOCAL_FINALIZE_CONCURRENCY,
    finalize_concurrency,
    store_concurrency,
)
from capture_core.run.receipt import HandoffReceipt, RolloutOutcome
from capture_core.run.retirement import retire_receipt
from capture_core.run.rollout_io import BatchPlan, ParsedLine, plan_rollout_file, read_batch
from capture_core.store import TokenCaptureStore
from tests.store.test_torn_puts import turns


class CountingSource:
    """A real store that records how many drops run at once."""

    def __init__(self, store: TokenCaptureStore) -> None:
        self.store, self.running, self.most = store, 0, 0

    async def drop(self, rollout_id: str, *, snapshot_id: str, version: int) -> bool:
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await asyncio.sleep(0)  # let the other drops start, if the bound allows
            return await self.store.drop(rollout_id, snapshot_id=snapshot_id, version=version)
        finally:
            self.running -= 1


def receipt_for(store: TokenCaptureStore, count: int) -> HandoffReceipt:
    rollouts = []
    for i in range(count):
        for item in turns(f"r{i}", 2):
            store.put_now(item)
        snap = store.freeze_now(f"r{i}")
        rollouts.append(
            RolloutOutcome(
                line=i,
                rollout_id=f"r{i}",
                can_retire=True,
                snapshot_id=snap.snapshot_id,
                version=snap.version,
            )
        )
    return HandoffReceipt(
        run_id="run",
        batch=0,
        receipt_key="k",
        part_key="p",
        sha256="",
        bytes=0,
        records=count,
        rollouts=rollouts,
    )


def finalized_part(store: TokenCaptureStore, count: int) -> bytes:
    """The batch's part: each rollout's record finalized from its capture (retire re-reads it)."""
    records = [{"_ng_rollout_id": f"r{i}", "reward": 1.0} for i in range(count)]
    for record in records:
        asyncio.run(finalize_rollout_token_capture(record, store))
    return b"".join(orjson.dumps(record) + b"\n" for record in records)


@pytest.mark.parametrize("bound", [1, 3])
def test_retirement_runs_at_most_the_configured_drops_at_once(tmp_path, bound: int) -> None:
    store = TokenCaptureStore(str(tmp_path))
    receipt = receipt_for(store, 8)
    source = CountingSource(store)
    dest = handed_off(receipt, finalized_part(store, 8))
    outcome = asyncio.run(retire_receipt(receipt, source, dest, concurrency=bound))  # type: ignore[arg-type]
    assert sorted(outcome.retired) == sorted(f"r{i}" for i in range(8))
    assert source.most == bound


def test_concurrency_setting_is_read_and_checked(monkeypatch) -> None:
    monkeypatch.setenv("TOKCAP_STORE_CONCURRENCY", "4")
    assert store_concurrency() == 4
    for bad in ("0", "many"):
        monkeypatch.setenv("TOKCAP_STORE_CONCURRENCY", bad)
        with pytest.raises(ValueError, match="TOKCAP_STORE_CONCURRENCY"):
            store_concurrency()


class CountingFreezes:
    """A real store that records how many freezes run at once; it shows its byte store,
    as tokcap's store does, so a batch picks its concurrency from it."""

    def __init__(self, store: TokenCaptureStore) -> None:
        self.store, self.byte_store, self.running, self.most = store, store.byte_store, 0, 0

    async def freeze(self, rollout_id: str) -> TokenCaptureSnapshot:
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await asyncio.sleep(0)  # let the other freezes start, if the bound allows
            return await self.store.freeze(rollout_id)
        finally:
            self.running -= 1

    async def drop(self, rollout_id: str, *, snapshot_id: str, version: int) -> bool:
        return await self.store.drop(rollout_id, snapshot_id=snapshot_id, version=version)

    async def close(self) -> None:
        await self.store.close()


def batch_of(path: Path, rollouts: list[dict]) -> tuple[BatchPlan, list[ParsedLine]]:
    """The single batch of a rollout file holding `rollouts`, read as the finalize task does."""
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rollouts))
    (plan,) = plan_rollout_file(str(path), 1000).batches
    return plan, read_batch(str(path), plan)


def test_a_batch_finalizes_four_at_once_from_local_disk_unless_told(tmp_path, monkeypatch) -> None:
    store = TokenCaptureStore(str(tmp_path / "store"))
    for i in range(10):
        for item in turns(f"r{i}", 2):
            store.put_now(item)
    monkeypatch.delenv("TOKCAP_STORE_CONCURRENCY", raising=False)
    source = CountingFreezes(store)
    records = [{"_ng_rollout_id": f"r{i}", "reward": 1.0} for i in range(10)]
    plan, lines = batch_of(tmp_path / "rollouts.jsonl", records)
    finalized = asyncio.run(finalize_batch("run", plan, lines, source))  # type: ignore[arg-type]
    assert [o.masked for o in finalized.outcomes] == [False] * 10
    assert source.most == LOCAL_FINALIZE_CONCURRENCY == 4
    assert finalize_concurrency(store) == 4
    monkeypatch.setenv("TOKCAP_STORE_CONCURRENCY", "7")
    assert finalize_concurrency(store) == 7


def test_a_batch_finalizes_sixteen_at_once_from_any_other_source(monkeypatch) -> None:
    monkeypatch.delenv("TOKCAP_STORE_CONCURRENCY", raising=False)
    remote = TokenCaptureStore(f"memory://tokcap-concurrency-{uuid.uuid4().hex}")
    assert finalize_concurrency(remote) == store_concurrency() == 16
    assert finalize_concurrency(object()) == 16
