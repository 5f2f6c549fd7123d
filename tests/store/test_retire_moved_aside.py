"""On local disk a retirement moves each retired rollout's event folders into the store's
temporaries with one rename, after its tombstone is durable, and removes them off its path.

What a rollout keeps (its tombstone) and when its capture may go are those of every drop;
these tests pin the new step: the folders leave in one rename each, nothing of them stays
under the rollout, and the background removal leaves none in the temporaries.
"""

from __future__ import annotations

import asyncio
import logging
import os

import pytest

from capture_core.errors import CaptureFencedError, CaptureRetiredError
from capture_core.protocols import DELETED, DropRequest
from capture_core.storage.local.temporaries import TMP_DIR, wait_removed
from capture_core.store import TokenCaptureStore
from tests.store.test_torn_puts import turns


def set_aside(root: str) -> list[str]:
    """The entries moved aside into the store's temporaries and not yet removed."""
    folder = os.path.join(root, TMP_DIR)
    names = os.listdir(folder) if os.path.isdir(folder) else []
    return sorted(name for name in names if name.startswith("set-aside-"))


def captured(store: TokenCaptureStore, count: int) -> list[DropRequest]:
    """`count` rollouts cleared for dispatch (so each holds an attempt marker), captured with
    three calls and frozen: drop requests for their snapshots."""
    drops = []
    for i in range(count):
        rollout_id = f"r{i}"
        store.clear_for_dispatch(rollout_id)
        for item in turns(rollout_id, 3):
            store.put_now(item)
        snapshot = store.freeze_now(rollout_id)
        drops.append(DropRequest(rollout_id, snapshot.snapshot_id, snapshot.version))
    return drops


def left_under(root: str, rollout_id: str) -> list[str]:
    return sorted(os.listdir(os.path.join(root, rollout_id)))


def test_a_batch_moves_each_event_folder_in_one_rename_and_removes_it_after(tmp_path) -> None:
    root = str(tmp_path)
    store = TokenCaptureStore(root)
    drops = captured(store, 4)
    folders = {os.stat(os.path.join(root, d.rollout_id, "e")).st_ino for d in drops}
    seen: list[set[int]] = []

    def checkpoint(moment: str) -> None:
        if moment == DELETED:  # the batch is not done: nothing moved is removed yet
            temporaries = os.path.join(root, TMP_DIR)
            seen.append({os.stat(os.path.join(temporaries, n)).st_ino for n in set_aside(root)})

    results = asyncio.run(store.drop_many(drops, concurrency=2, checkpoint=checkpoint))
    assert results == [True] * 4
    assert folders <= seen[-1], "each entry folder was renamed whole, not copied or emptied"
    for drop in drops:
        assert left_under(root, drop.rollout_id) == ["FROZEN", "RETIRED"]
    assert wait_removed(120), "the background removal finished"
    assert set_aside(root) == [], "the moved folders are gone after the removal"
    for drop in drops:
        with pytest.raises(CaptureRetiredError):
            store.freeze_now(drop.rollout_id)
        with pytest.raises(CaptureFencedError):
            store.put_now(turns(drop.rollout_id, 4)[3])
        assert left_under(root, drop.rollout_id) == ["FROZEN", "RETIRED"]


def test_a_single_drop_moves_its_folders_and_a_repeat_finds_nothing_to_move(tmp_path) -> None:
    root = str(tmp_path)
    store = TokenCaptureStore(root)
    (drop,) = captured(store, 1)
    assert store.drop_now(drop.rollout_id, drop.snapshot_id, drop.version)
    assert left_under(root, drop.rollout_id) == ["FROZEN", "RETIRED"]
    assert wait_removed(120) and set_aside(root) == []
    assert store.drop_now(drop.rollout_id, drop.snapshot_id, drop.version), "safe to repeat"
    assert left_under(root, drop.rollout_id) == ["FROZEN", "RETIRED"]
    assert set_aside(root) == []


def test_a_planted_temporaries_link_is_never_moved_into_the_drop_unlinks_instead(
    tmp_path, caplog: pytest.LogCaptureFixture
) -> None:
    """`.tmp` made a symbolic link to a folder outside the store: the rename would place the
    capture there, so nothing is moved; the payloads are unlinked in place, with a warning."""
    root, elsewhere = tmp_path / "store", tmp_path / "elsewhere"
    store = TokenCaptureStore(str(root))
    (drop,) = captured(store, 1)
    elsewhere.mkdir()
    (root / TMP_DIR).rename(tmp_path / "old-tmp")
    (root / TMP_DIR).symlink_to(elsewhere)
    with caplog.at_level(logging.WARNING, logger="capture_core"):
        assert store.drop_now(drop.rollout_id, drop.snapshot_id, drop.version)
    assert left_under(str(root), drop.rollout_id) == ["FROZEN", "RETIRED"]
    assert not [n for n in os.listdir(elsewhere) if n.startswith("set-aside-")]
    assert "not moved into the temporaries" in caplog.text
