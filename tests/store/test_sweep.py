"""The tombstone sweep: it removes old tombstones and nothing that is evidence, deletes in
checked batches, and a write that lands after it never becomes a delivered rollout.

Tombstones are aged by rewriting their `retired_at`, as if they had been written days ago.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time

import pytest

from capture_core.errors import CaptureRetiredError
from capture_core.storage import FolderView, LocalStore
from capture_core.store import TokenCaptureStore, retirement
from capture_core.store.capture_layout import entry_key, retired_key
from capture_core.store.stored_json import encode_json
from tests.store.test_nemo_gym_file_store import write_rollout
from tests.store.test_store_attacks import PausingBytes, two_turns
from tests.support.gym_file_writer import GymWriter
from tests.support.pipeline_helpers import (
    batch_entries,
    dest_records,
    finalize_locations,
    make_batch,
    write_rollouts,
)
from tests.support.reliability_figures import record_case
from tokcap.flows.clear import dispatch_clear
from tokcap.flows.sweep import sweep_retired_captures

pytestmark = pytest.mark.integrity

DAY = 86400.0


def retire(store: TokenCaptureStore, rollout_id: str) -> None:
    for item in two_turns(rollout_id):
        store.put_now(item)
    snapshot = store.freeze_now(rollout_id)
    assert store.drop_now(rollout_id, snapshot.snapshot_id, snapshot.version)


def age_tombstone(store: TokenCaptureStore, rollout_id: str, seconds: float) -> None:
    """Make the rollout's tombstone look `seconds` older than it is."""
    decision = retirement.read_decision(store.byte_store, rollout_id)
    assert decision is not None and retirement.is_tombstone(decision)
    decision["retired_at"] -= seconds
    store.byte_store.replace(retired_key(rollout_id), encode_json(decision))


def age_all_tombstones(store: TokenCaptureStore, seconds: float) -> None:
    for rollout_id in store.byte_store.list_children(""):
        age_tombstone(store, rollout_id, seconds)


def test_the_sweep_removes_old_tombstones_and_never_evidence(store) -> None:
    listed = store.byte_store.list_prefix
    for rollout_id in ("old", "old-leftover", "fresh", "late-loss"):
        retire(store, rollout_id)
    # A payload beneath a tombstone: a drop's deletion interrupted by a crash.
    assert store.byte_store.create(entry_key("old-leftover", "cleft"), b"left by a crash")
    with pytest.raises(CaptureRetiredError):
        store.mark_incomplete_now("late-loss", "turn-9", "reported after retirement")
    for item in two_turns("masked"):
        store.put_now(item)
    store.freeze_now("masked")  # frozen, never retired: a masked rollout's evidence
    for item in two_turns("refused"):
        store.put_now(item)
    store.freeze_now("refused")
    store.mark_incomplete_now("refused", "turn-2", "lost after the freeze")
    store.put_now(two_turns("live")[0])
    for rollout_id in ("old", "old-leftover", "late-loss"):
        age_tombstone(store, rollout_id, 3 * DAY)
    kept = {name: listed(name) for name in ("fresh", "late-loss", "masked", "refused", "live")}

    assert store.sweep_retired(2 * DAY) == 2
    assert listed("old") == listed("old-leftover") == []
    assert {name: listed(name) for name in kept} == kept, "evidence and fresh tombstones stay"
    assert store.sweep_retired(2 * DAY) == 0, "a repeat sweeps nothing"
    if isinstance(store.byte_store, LocalStore):
        assert not os.path.exists(os.path.join(store.root, "old")), "no empty folder left"
    record_case("sweep removes evidence, a fresh tombstone or a late loss marker", records_lost=0)


def test_a_failed_key_keeps_its_rollout_and_the_others_are_swept(tmp_path, caplog) -> None:
    class RefusingView:
        """A pinned folder whose deletes of one rollout's decision fail, as a denied key does."""

        def __init__(self, view: FolderView) -> None:
            self.view = view
            self.get, self.list_prefix = view.get, view.list_prefix

        def delete_each(self, keys, *, durable=True):
            keys = list(keys)
            failed = {k: "AccessDenied: denied" for k in keys if k.startswith("b2/RETIRED")}
            rest = self.view.delete_each([k for k in keys if k not in failed], durable=durable)
            return {**rest, **failed}

    class RefusingStore(LocalStore):
        """A local store whose sweep deletes go through a `RefusingView`."""

        @contextlib.contextmanager
        def pinned(self, prefix):
            with super().pinned(prefix) as view:
                yield RefusingView(view)

    root = str(tmp_path / "store")
    store = TokenCaptureStore(root)
    for rollout_id in ("a1", "b2", "c3"):
        retire(store, rollout_id)
        age_tombstone(store, rollout_id, 3 * DAY)
    refusing = RefusingStore(root)
    with caplog.at_level(logging.WARNING, logger="capture_core.store"):
        assert retirement.sweep_tombstones(refusing, 2 * DAY, time.time()) == 2
    assert "skipped rollout b2" in caplog.text and "AccessDenied" in caplog.text
    assert refusing.list_prefix("b2") == ["b2/RETIRED"], "its tombstone still refuses a freeze"
    with pytest.raises(CaptureRetiredError):
        store.freeze_now("b2")
    assert store.sweep_retired(2 * DAY) == 1, "the next sweep finishes it"
    record_case("sweep counts a rollout whose delete was refused", records_lost=0)


def test_the_sweep_deletes_across_rollouts_in_checked_batches_on_s3(s3_url, s3_options) -> None:
    store = TokenCaptureStore(s3_url, s3_options)
    count = retirement.SWEEP_CHUNK + 10
    # The single-rollout form that stores written before group tombstones hold.
    old = encode_json({"snapshot_id": "s", "version": 2, "retired_at": time.time() - 3 * DAY})
    for i in range(count):
        assert store.byte_store.create(f"r{i}/FROZEN", b'{"snapshot_id": "s"}')
        assert store.byte_store.create(f"r{i}/RETIRED", old)
    retire(store, "fresh")
    assert store.sweep_retired(2 * DAY) == count
    assert store.byte_store.list_children("") == ["fresh"]


def test_a_nemo_gym_directory_is_swept_through_its_own_lock_protocol(tmp_path, prefect_api) -> None:
    root = str(tmp_path / "gym")
    writer = GymWriter(root)
    for rollout_id in ("9-0", "9-1"):
        write_rollout(writer, rollout_id)
    store = TokenCaptureStore(root)
    for rollout_id in ("9-0", "9-1"):
        snapshot = store.freeze_now(rollout_id)
        assert store.drop_now(rollout_id, snapshot.snapshot_id, snapshot.version)
    old = time.time() - 3 * DAY
    os.utime(os.path.join(root, "9-0.tokens.state.json"), (old, old))
    summary = sweep_retired_captures(root, "2d")
    assert summary.swept == 1
    assert sorted(os.listdir(root)) == ["9-1.tokens.lock", "9-1.tokens.state.json"]


class ListingPausingBytes(PausingBytes):
    """A byte store that runs `hook()` once, just before the first listing matching `when`."""

    def list_prefix(self, prefix: str) -> list[str]:
        if not self.fired and self.when(prefix):
            self.fired = True
            self.hook()
        return self.inner.list_prefix(prefix)


def test_a_sweep_racing_a_clear_and_the_next_attempt_keeps_its_calls(
    shared_store_location,
) -> None:
    url, options = shared_store_location
    sweeper, dispatcher = TokenCaptureStore(url, options), TokenCaptureStore(url, options)
    retire(sweeper, "r1")
    age_tombstone(sweeper, "r1", 3 * DAY)

    def next_attempt() -> None:  # after the sweep judged the tombstone expired, before it lists
        dispatcher.delete("r1")
        for item in two_turns("r1"):
            dispatcher.put_now(item)

    sweeper._bytes = ListingPausingBytes(sweeper.byte_store, lambda p: p == "r1", next_attempt)
    assert sweeper.sweep_retired(2 * DAY) == 0
    snapshot = TokenCaptureStore(url, options).freeze_now("r1")
    assert len(snapshot.entries) == 2 and not snapshot.incomplete, "the new attempt is intact"
    record_case("sweep racing a dispatch-time clear deletes the next attempt", records_lost=0)


# -- a late write after the sweep ----------------------------------------------------------


def test_a_late_write_after_the_sweep_is_never_delivered(locations, prefect_api) -> None:
    """After the sweep, a late put of a retired attempt creates a capture with no decision.

    The run that delivered the rollout never freezes it again (its batch has a receipt),
    and its retirement, repeated, finds no freeze naming the receipt's snapshot; the next
    attempt of that id is dispatched after the dispatch-time clear, which deletes it.
    """
    options = locations["options"]
    store = TokenCaptureStore(locations["store"], options)
    records = make_batch(store, 3)
    late = batch_entries("7-0")[1]
    write_rollouts(locations["rollouts"], records, options)
    first = finalize_locations(locations, "late-1")
    assert first.retired == 3
    delivered = dest_records(locations["dest"], "late-1", options)
    age_all_tombstones(store, 3 * DAY)
    swept = sweep_retired_captures(locations["store"], "2d", storage_options=options)
    assert swept.swept == 3 and store.byte_store.list_children("") == []

    store.put_now(late)  # a writer of the retired attempt, paused past the sweep
    lone = store.byte_store.list_prefix("7-0")
    again = finalize_locations(locations, "late-1")
    assert again.already_handed_off == 3, "its one batch has a receipt: not finalized again"
    assert again.retired == 3 and again.masked == 0
    assert dest_records(locations["dest"], "late-1", options) == delivered
    assert store.byte_store.list_prefix("7-0") == lone, "neither frozen nor deleted"

    dispatch_clear(records, locations["store"], storage_options=options)
    left = {name: store.byte_store.list_prefix(name) for name in ("7-0", "7-1", "7-2")}
    assert left == {name: [f"{name}/ATTEMPT"] for name in left}, "the next dispatch starts clean"
    record_case("late write after the sweep delivered", records_lost=0)


def test_an_empty_decision_is_named_and_kept_and_the_others_are_swept(tmp_path, caplog) -> None:
    store = TokenCaptureStore(str(tmp_path / "store"))
    for rollout_id in ("r1", "r2", "r3"):
        retire(store, rollout_id)
        age_tombstone(store, rollout_id, 3 * DAY)
    with open(tmp_path / "store" / "r2" / "RETIRED", "wb"):
        pass  # truncated to nothing: no decision can be read from it
    with caplog.at_level(logging.WARNING, logger="capture_core.store"):
        assert store.sweep_retired(2 * DAY) == 2
    assert "skipped rollout r2" in caplog.text
    assert store.byte_store.list_children("") == ["r2"]
