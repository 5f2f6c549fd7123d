"""A retirement's deletion racing a dispatch-time clear of the same id and the new attempt.

Phase two of a retirement reads the decision, then deletes. A clear (the id dispatched
again) and the new attempt's first calls may land in between: the deletion must reach only
the retired attempt's capture, never the new one's (its attempt marker, calls and intents).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import pytest

from capture_core.storage.local.store import LocalStore
from capture_core.storage.local.temporaries import wait_removed
from capture_core.store import TokenCaptureStore
from capture_core.store import capture_layout as layout
from tests.store.test_retire_moved_aside import captured, left_under
from tests.store.test_torn_puts import turns


class ClearLandsFirst(LocalStore):
    """A real local store on which `race` runs once, just before the first folder of a
    rollout is held or moved for deletion: the moment a paused retirement wakes up."""

    race: Callable[[], None] | None = None

    def _run_race(self) -> None:
        race, self.race = self.race, None
        if race is not None:
            race()

    def pinned(self, prefix: str):  # type: ignore[no-untyped-def]
        self._run_race()
        return super().pinned(prefix)

    def move_aside(self, prefix: str, names: Sequence[str]) -> list[str]:
        self._run_race()
        return super().move_aside(prefix, names)


def racing_store(root: str) -> tuple[TokenCaptureStore, ClearLandsFirst]:
    store = TokenCaptureStore(root)
    store._bytes = ClearLandsFirst(root)
    return store, store._bytes


def new_attempt(store: TokenCaptureStore, rollout_id: str) -> Callable[[], None]:
    def race() -> None:
        store.clear_for_dispatch(rollout_id)
        for item in turns(rollout_id, 2):
            store.put_now(item)

    return race


def assert_new_attempt_kept(store: TokenCaptureStore, rollout_id: str) -> None:
    keys = store._bytes.list_prefix(rollout_id)
    assert layout.attempt_key(rollout_id) in keys, f"the new attempt's marker was deleted: {keys}"
    assert layout.retired_key(rollout_id) not in keys, "the clear removed the old tombstone"
    events = [k for k in keys if k.startswith(f"{rollout_id}/e/")]
    assert len(events) == 2, f"the new attempt's two calls were deleted: {keys}"
    snapshot = store.freeze_now(rollout_id)
    assert snapshot.version >= 0


@pytest.mark.integrity
def test_a_batch_retirement_woken_after_a_clear_keeps_the_new_attempt(tmp_path) -> None:
    store, racing = racing_store(str(tmp_path))
    (drop,) = captured(store, 1)
    racing.race = new_attempt(store, drop.rollout_id)
    results = asyncio.run(store.drop_many([drop], concurrency=1))
    assert racing.race is None, "the race ran"
    assert results == [False], "the old snapshot's tombstone was gone: nothing retired"
    assert wait_removed(120)
    assert_new_attempt_kept(store, drop.rollout_id)


@pytest.mark.integrity
def test_a_single_drop_woken_after_a_clear_keeps_the_new_attempt(tmp_path) -> None:
    store, racing = racing_store(str(tmp_path))
    (drop,) = captured(store, 1)
    racing.race = new_attempt(store, drop.rollout_id)
    store.drop_now(drop.rollout_id, drop.snapshot_id, drop.version)
    assert racing.race is None, "the race ran"
    assert wait_removed(120)
    assert_new_attempt_kept(store, drop.rollout_id)


def test_a_drop_request_still_retires_without_a_race(tmp_path) -> None:
    store, _ = racing_store(str(tmp_path))
    drops = captured(store, 2)
    assert asyncio.run(store.drop_many(drops, concurrency=2)) == [True, True]
    for drop in drops:
        assert left_under(str(tmp_path), drop.rollout_id) == ["FROZEN", "RETIRED"]
