"""A sweep paused after it listed a rollout's keys, waking after the rollout was cleared and
dispatched again, must not delete the next attempt's calls.

The retired attempt left payloads under its tombstone (its drop's deletion was cut short by a
crash), and the next attempt's calls have the same keys (same model call ids). On local disk
the sweep holds the rollout's folder open from its judgement to its deletes, so it deletes
only in the folder it judged; S3 has no folder to hold (a known defect, strict xfail there).
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator

import pytest

from capture_core.errors import CaptureFencedError
from capture_core.storage import FolderView
from capture_core.store import TokenCaptureStore
from tests.store.test_store_attacks import REPO, PausingBytes, two_turns
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


@pytest.mark.parametrize("residue", ["empty-folders", "reserved-file"])
@pytest.mark.parametrize("next_attempt_retired", [False, True])
def test_on_local_disk_a_crashed_drop_s_folders_do_not_outlive_the_clear(
    tmp_path, residue: str, next_attempt_retired: bool
) -> None:
    """A drop killed after its unlinks but before removing its folders leaves empty `e/` and
    `i/` beneath the tombstone (and perhaps an entry of a reserved name: NFS's `.nfs*` for a
    file still open elsewhere). The clear still leaves no folder under the id, so a sweep
    paused past it and a new attempt (also one retired meanwhile) deletes nothing of that
    attempt, its tombstone included."""
    url = str(tmp_path / "store")
    sweeper, dispatcher = TokenCaptureStore(url), TokenCaptureStore(url)
    for item in two_turns("r1"):
        sweeper.put_now(item)
    snapshot = sweeper.freeze_now("r1")
    assert sweeper.drop_now("r1", snapshot.snapshot_id, snapshot.version)
    folder = tmp_path / "store" / "r1"
    (folder / "e").mkdir()
    (folder / "i").mkdir()
    if residue == "reserved-file":
        (folder / ".nfs0000000001").write_bytes(b"held open elsewhere")
    age_tombstone(sweeper, "r1", 3 * DAY)
    fresh: list[TokenCaptureStore] = []
    survived: list[bool] = []

    def next_attempt() -> None:  # the sweep judged r1 expired through its folder, then paused
        dispatcher.delete("r1")
        survived.append(folder.exists())
        for item in two_turns("r1"):
            dispatcher.put_now(item)
        if next_attempt_retired:
            again = dispatcher.freeze_now("r1")
            assert dispatcher.drop_now("r1", again.snapshot_id, again.version)
        fresh.append(TokenCaptureStore(url))

    sweeper._bytes = DeletePausingBytes(sweeper.byte_store, lambda _key: True, next_attempt)
    assert sweeper.sweep_retired(2 * DAY) == 1
    keys = fresh[0].byte_store.list_prefix("r1")
    if next_attempt_retired:
        assert keys == ["r1/FROZEN", "r1/RETIRED"], "the new tombstone still fences"
        with pytest.raises(CaptureFencedError):
            fresh[0].put_now(two_turns("r1")[0])
    else:
        snapshot = fresh[0].freeze_now("r1")
        assert len(snapshot.entries) == 2 and not snapshot.incomplete
    assert survived == [False], "the clear left no folder under the id"


SWEEP_UNDER_A_LOW_DESCRIPTOR_LIMIT = """
import resource, sys
from capture_core.store import TokenCaptureStore
resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
print(TokenCaptureStore(sys.argv[1]).sweep_retired(0))
"""


def test_a_sweep_holds_no_more_than_one_folder_open_at_once(tmp_path) -> None:
    """Far more expired rollouts than descriptors: each folder is released once swept."""
    url = str(tmp_path / "store")
    store = TokenCaptureStore(url)
    count = 150
    for i in range(count):
        for item in two_turns(f"r{i}"):
            store.put_now(item)
        snapshot = store.freeze_now(f"r{i}")
        assert store.drop_now(f"r{i}", snapshot.snapshot_id, snapshot.version)
    run = subprocess.run(
        [sys.executable, "-c", SWEEP_UNDER_A_LOW_DESCRIPTOR_LIMIT, url],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == str(count)
    assert store.byte_store.list_children("") == []
