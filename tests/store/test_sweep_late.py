"""A sweep paused after it listed a rollout's keys, waking after the rollout was cleared and
dispatched again, must not delete the next attempt's calls.

The retired attempt left payloads under its tombstone (its drop's deletion was cut short by a
crash), and the next attempt's calls have the same keys (same model call ids). On local disk
the sweep holds the rollout's folder open from its judgement to its deletes, so it deletes
only in the folder it judged; S3 has no folder to hold (a known defect, strict xfail there).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator

import pytest

from capture_core.storage import FolderView
from capture_core.store import TokenCaptureStore
from tests.store.test_store_attacks import PausingBytes, two_turns
from tests.store.test_sweep import DAY, age_tombstone
from tests.support.reliability_figures import record_case

pytestmark = pytest.mark.integrity


class DeletePausingBytes(PausingBytes):
    """A byte store that runs `hook()` once, just before its first `delete_each`, also when
    the delete goes through a pinned view of a folder."""

    def delete_each(self, keys: Iterable[str], *, durable: bool = True) -> dict[str, str]:
        keys = list(keys)
        self.pause()
        return super().delete_each(keys, durable=durable)

    def pause(self) -> None:
        if not self.fired:
            self.fired = True
            self.hook()

    @contextlib.contextmanager
    def pinned(self, prefix: str) -> Iterator[FolderView]:
        with self.inner.pinned(prefix) as view:
            yield self if view is self.inner else PausingView(view, self.pause)


class PausingView:
    def __init__(self, view: FolderView, pause: Callable[[], None]) -> None:
        self.view, self.pause = view, pause

    def get(self, key: str) -> bytes | None:
        return self.view.get(key)

    def list_prefix(self, prefix: str) -> list[str]:
        return self.view.list_prefix(prefix)

    def delete_each(self, keys: Iterable[str], *, durable: bool = True) -> dict[str, str]:
        keys = list(keys)
        self.pause()
        return self.view.delete_each(keys, durable=durable)


S3_DEFECT = pytest.mark.xfail(
    strict=True,
    reason="sweep defect on S3: the listed keys are deleted by name after the check, so a "
    "sweep paused between its listing and its delete removes the calls of the next attempt "
    "of a cleared and re-dispatched rollout id that reuse a leftover payload's key; S3 has no "
    "folder to hold (it would need a conditional delete or per-attempt keys)",
)


def test_a_sweep_waking_after_the_next_attempt_keeps_its_calls(
    shared_store_location, request: pytest.FixtureRequest
) -> None:
    url, options = shared_store_location
    if url.startswith("s3://"):
        request.applymarker(S3_DEFECT)
    sweeper, dispatcher = TokenCaptureStore(url, options), TokenCaptureStore(url, options)
    for item in two_turns("r1"):
        sweeper.put_now(item)
    calls = {key: sweeper.byte_store.get(key) for key in sweeper.byte_store.list_prefix("r1")}
    snapshot = sweeper.freeze_now("r1")
    assert sweeper.drop_now("r1", snapshot.snapshot_id, snapshot.version)
    for key, data in calls.items():  # the drop's payload deletion was cut short by a crash
        assert sweeper.byte_store.create(key, data)
    age_tombstone(sweeper, "r1", 3 * DAY)

    def next_attempt() -> None:  # the sweep listed r1 and judged it expired, then paused
        dispatcher.delete("r1")
        for item in two_turns("r1"):
            dispatcher.put_now(item)

    sweeper._bytes = DeletePausingBytes(sweeper.byte_store, lambda _key: True, next_attempt)
    sweeper.sweep_retired(2 * DAY)
    snapshot = TokenCaptureStore(url, options).freeze_now("r1")
    assert len(snapshot.entries) == 2 and not snapshot.incomplete, "the new attempt is intact"
    record_case("sweep paused past a clear deletes the next attempt's calls", records_lost=0)
