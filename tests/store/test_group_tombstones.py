"""Group tombstones: a batch retirement writes one decision object per group of rollouts.

Each rollout's `RETIRED` is still its own exclusive create and names only its own snapshot
to its reader; these tests check what that promise rests on, on local disk and S3 (moto):
every rollout of a multi-group batch reads its own decision, a group object found under a
rollout it does not name is refused by name, and tombstones written in the single-rollout
form before groups still fence and retire.
"""

from __future__ import annotations

import asyncio
import os

import pytest

from capture_core.errors import CaptureRetiredError, UnreadableCaptureError
from capture_core.protocols import DropRequest
from capture_core.storage import LocalStore
from capture_core.store import TokenCaptureStore, retirement
from capture_core.store.stored_json import encode_json
from tests.store.test_store_attacks import two_turns
from tests.support.reliability_figures import record_case

ROLLOUTS = 2 * retirement.TOMBSTONE_GROUP + 3  # three groups, the last one short


def frozen(store: TokenCaptureStore, rollout_id: str) -> DropRequest:
    for item in two_turns(rollout_id):
        store.put_now(item)
    snapshot = store.freeze_now(rollout_id)
    return DropRequest(rollout_id, snapshot_id=snapshot.snapshot_id, version=snapshot.version)


def test_a_batch_retires_each_rollout_by_its_own_snapshot_across_groups(store) -> None:
    drops = [frozen(store, f"r{i}") for i in range(ROLLOUTS)]
    results = asyncio.run(store.drop_many(drops, concurrency=8))
    assert results == [True] * ROLLOUTS
    for drop in drops:
        decision = retirement.read_decision(store.byte_store, drop.rollout_id)
        assert decision is not None and retirement.retires(
            decision, drop.snapshot_id, drop.version
        ), drop.rollout_id
        assert store.byte_store.list_prefix(drop.rollout_id) == [
            f"{drop.rollout_id}/FROZEN",
            f"{drop.rollout_id}/RETIRED",
        ]
        with pytest.raises(CaptureRetiredError):
            store.freeze_now(drop.rollout_id)
    assert store.byte_store.remove_stale_temporaries(-1.0, 2e9) == 0, "staged copies released"


def test_on_local_disk_a_group_is_one_file_linked_into_each_rollout(tmp_path) -> None:
    """What makes a batch cheap: one data write and fsync per group, not per rollout."""
    store = TokenCaptureStore(str(tmp_path))
    assert isinstance(store.byte_store, LocalStore)
    drops = [frozen(store, f"r{i}") for i in range(ROLLOUTS)]
    assert asyncio.run(store.drop_many(drops, concurrency=8)) == [True] * ROLLOUTS
    inodes = {os.stat(tmp_path / d.rollout_id / "RETIRED").st_ino for d in drops}
    assert len(inodes) == 3, "one object per group of at most TOMBSTONE_GROUP rollouts"


@pytest.mark.integrity
def test_a_group_tombstone_under_a_rollout_it_does_not_name_is_refused_by_name(store) -> None:
    retired = frozen(store, "a1")
    assert store.drop_now(retired.rollout_id, retired.snapshot_id, retired.version)
    other = frozen(store, "c3")
    copied = store.byte_store.get("a1/RETIRED")
    assert copied is not None and store.byte_store.create("c3/RETIRED", copied)
    kept = store.byte_store.list_prefix("c3")
    with pytest.raises(UnreadableCaptureError, match="c3/RETIRED is not a retirement decision"):
        store.drop_now(other.rollout_id, other.snapshot_id, other.version)
    assert store.byte_store.list_prefix("c3") == kept, "nothing of c3 is deleted"
    record_case("group tombstone copied to a rollout it does not name", records_lost=0)


@pytest.mark.integrity
def test_a_single_rollout_tombstone_from_before_groups_still_fences_and_retires(store) -> None:
    drop = frozen(store, "b2")
    old = {"snapshot_id": drop.snapshot_id, "version": drop.version, "retired_at": 1.0e9}
    assert store.byte_store.create("b2/RETIRED", encode_json(old))
    with pytest.raises(CaptureRetiredError):
        store.freeze_now("b2")
    assert store.drop_now(drop.rollout_id, drop.snapshot_id, drop.version), "it follows it"
    assert store.byte_store.list_prefix("b2") == ["b2/FROZEN", "b2/RETIRED"]
    record_case("single-rollout tombstone written before group tombstones", records_lost=0)
