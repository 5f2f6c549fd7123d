"""Batches finalize and retire several rollouts at once, bounded by a setting."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from bench.retire_bench import handed_off
from capture_core.delivery import finalize_rollout_token_capture
from capture_core.run.handoff import (
    HandoffReceipt,
    RolloutOutcome,
    retire_receipt,
    store_concurrency,
)
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
