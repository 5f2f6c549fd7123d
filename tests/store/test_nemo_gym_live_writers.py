"""Attacks on a NeMo Gym file store finalized in place: live writers, torn and planted files.

Writers are real processes running `tests.support.gym_file_writer` (built from the format's facts);
tokcap freezes and drops through `TokenCaptureStore(dir)` while they write.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import orjson
import pytest

from capture_core.consumer import trajectories_for_rollout
from capture_core.errors import CaptureConflictError, UnreadableCaptureError
from capture_core.store import TokenCaptureStore
from tests.support.gym_file_writer import GymWriter, GymWriterRefused, entry_payload
from tests.support.pipeline_helpers import REPO
from tests.support.reliability_figures import record_case
from tests.support.servers import wait_until

pytestmark = pytest.mark.integrity

TRIALS = 12
# The live writer puts calls until the freeze refuses one: many more than it can put before
# the freeze (each call's prompt is longer), however the processes are scheduled.
LIVE_CALLS = "2000"
DEADLINE = 120.0


class WriterProcess:
    """A `tests.support.gym_file_writer` subprocess whose stdout lines are read as they arrive."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.gym_file_writer", *args],
            cwd=REPO,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.strip())

    def finish(self) -> list[str]:
        assert self.proc.wait(timeout=DEADLINE) == 0
        self._reader.join(timeout=DEADLINE)
        return self.lines


@pytest.fixture()
def gym_dir(tmp_path) -> str:
    root = str(tmp_path / "gym")
    GymWriter(root).put(entry_payload("seed-0", 0))
    return root


@pytest.mark.parametrize("trial", range(TRIALS))
def test_a_live_writer_and_freeze_then_drop_stay_consistent(gym_dir, trial: int) -> None:
    rollout_id = f"live-{trial}"
    writer = WriterProcess(gym_dir, rollout_id, LIVE_CALLS, "300")
    wait_until(lambda: len(writer.lines) >= trial % 4, DEADLINE, "the writer's first puts")
    store = TokenCaptureStore(gym_dir)
    snapshot = store.freeze_now(rollout_id)
    wait_until(
        lambda: any(line.startswith("refused") for line in writer.lines), DEADLINE, "a refusal"
    )
    assert store.freeze_now(rollout_id) == snapshot, "idempotent while a late writer knocks"
    dropped = store.drop_now(rollout_id, snapshot.snapshot_id, snapshot.version)
    lines = writer.finish()
    acknowledged = {f"c{int(line.split()[1]):04d}" for line in lines if line.startswith("ok")}
    captured = {entry.model_call_id for entry in snapshot.entries}
    assert captured == acknowledged, "every acknowledged put is frozen, and nothing else"
    assert not [line for line in lines if line.startswith("late-ok")], "the fence holds"
    assert dropped, "nothing changed since the freeze, so the drop retires it"
    (refusal,) = [line for line in lines if line.startswith("refused")]
    assert snapshot.incomplete == refusal.startswith("refused-put"), "a begun call masks"
    assert not os.path.exists(GymWriter(gym_dir).path(rollout_id, "jsonl"))
    with pytest.raises(GymWriterRefused):
        GymWriter(gym_dir).put(entry_payload(rollout_id, 999))
    assert not [n for n in os.listdir(gym_dir) if os.path.isdir(os.path.join(gym_dir, n))]
    lost = len(acknowledged - captured)
    record_case("NeMo Gym writer process racing freeze and drop", records_lost=lost)


@pytest.mark.parametrize("trial", range(TRIALS))
def test_a_late_loss_racing_drop_never_both_succeed(gym_dir, trial: int) -> None:
    rollout_id = f"race-{trial}"
    GymWriter(gym_dir).put(entry_payload(rollout_id, 0))
    store = TokenCaptureStore(gym_dir)
    snapshot = store.freeze_now(rollout_id)
    go = os.path.join(os.path.dirname(gym_dir), f"go-{trial}")
    marker = WriterProcess("mark", gym_dir, rollout_id, go)
    wait_until(lambda: marker.lines == ["ready"], DEADLINE, "the marking process")
    with open(go, "wb"):
        pass
    if trial % 2:
        wait_until(lambda: len(marker.lines) == 2, DEADLINE, "the loss report")
    dropped = store.drop_now(rollout_id, snapshot.snapshot_id, snapshot.version)
    _ready, outcome = marker.finish()
    assert dropped != (outcome == "marked"), "either the loss fails the drop or is refused"
    if not dropped:
        assert store.freeze_now(rollout_id).incomplete, "the loss is kept as evidence"
    record_case("NeMo Gym mark_incomplete process racing drop", records_lost=0)


def test_a_torn_final_line_is_truncated_and_the_rest_is_kept(gym_dir) -> None:
    writer = GymWriter(gym_dir)
    for call in range(2):
        writer.put(entry_payload("t-1", call))
    with open(writer.path("t-1", "jsonl"), "ab") as f:
        f.write(b'{"model_call_id": "c0002", "prompt_tok')
    snapshot = TokenCaptureStore(gym_dir).freeze_now("t-1")
    assert [e.model_call_id for e in snapshot.entries] == ["c0000", "c0001"]
    assert not snapshot.incomplete
    with open(writer.path("t-1", "jsonl"), "rb") as f:
        assert f.read().endswith(b"}\n"), "the torn bytes are gone"
    record_case("NeMo Gym torn final JSONL line")


def test_a_line_written_before_a_crash_is_indexed_and_bumps_the_version(gym_dir) -> None:
    writer = GymWriter(gym_dir)
    writer.put(entry_payload("t-2", 0))
    writer.put(entry_payload("t-2", 1), crash_before_state=True)
    before = writer.state("t-2")["version"]
    snapshot = TokenCaptureStore(gym_dir).freeze_now("t-2")
    assert len(snapshot.entries) == 2 and snapshot.version == before + 2, "one line + freeze"
    assert writer.state("t-2")["indexed_size"] == os.path.getsize(writer.path("t-2", "jsonl"))
    record_case("NeMo Gym line durable before its state update")


def test_corruption_before_more_content_masks_and_is_kept(gym_dir) -> None:
    writer = GymWriter(gym_dir)
    writer.put(entry_payload("t-3", 0), crash_before_state=True)
    with open(writer.path("t-3", "jsonl"), "r+b") as f:
        f.seek(1)
        f.write(b"#")
        f.seek(0, os.SEEK_END)
        f.write(orjson.dumps(entry_payload("t-3", 1), option=orjson.OPT_SORT_KEYS) + b"\n")
    with pytest.raises(UnreadableCaptureError, match="t-3.tokens.jsonl"):
        TokenCaptureStore(gym_dir).freeze_now("t-3")
    built = trajectories_for_rollout("t-3", [gym_dir])
    assert built["mask_sample"] and "UnreadableCaptureError" in built["error"]
    assert os.path.getsize(writer.path("t-3", "jsonl")) > 0, "the evidence stays"
    record_case("NeMo Gym corrupt JSONL line before more content")


def test_two_payloads_for_one_call_mark_the_rollout_incomplete(gym_dir) -> None:
    writer = GymWriter(gym_dir)
    writer.put(entry_payload("t-4", 0))
    other = {**entry_payload("t-4", 0), "generation_token_ids": [5, 6]}
    with open(writer.path("t-4", "jsonl"), "ab") as f:
        f.write(orjson.dumps(other, option=orjson.OPT_SORT_KEYS) + b"\n")
    with pytest.raises(CaptureConflictError, match="two different durable payloads"):
        TokenCaptureStore(gym_dir).freeze_now("t-4")
    assert writer.state("t-4")["incomplete"] is True
    built = trajectories_for_rollout("t-4", [gym_dir])
    assert built["mask_sample"], "a conflicting capture never trains"
    record_case("NeMo Gym call id with two payloads", wrong_tokens_delivered=0)


def test_a_parsable_non_entry_last_line_is_corruption_not_a_torn_write(gym_dir) -> None:
    writer = GymWriter(gym_dir)
    writer.put(entry_payload("t-5", 0))
    with open(writer.path("t-5", "jsonl"), "ab") as f:
        f.write(b"{}\n")
    with pytest.raises(UnreadableCaptureError, match="no model_call_id"):
        TokenCaptureStore(gym_dir).freeze_now("t-5")
    assert os.path.getsize(writer.path("t-5", "jsonl")) == writer.state("t-5")["indexed_size"] + 3
    record_case("NeMo Gym parsable garbage as the last JSONL line")


def _flock_waiters(path: str) -> bool:
    """Whether some process waits in `flock` on the file now at `path` (from /proc/locks)."""
    inode = os.stat(path).st_ino
    with open("/proc/locks") as locks:
        return any("->" in line and f":{inode} " in line for line in locks)


def test_an_operation_waiting_on_a_swept_lock_file_waits_for_its_successor(gym_dir) -> None:
    import fcntl

    store = TokenCaptureStore(gym_dir)
    lock_path = GymWriter(gym_dir).path("seed-0", "lock")
    with open(lock_path, "a+b") as sweeper:
        fcntl.flock(sweeper.fileno(), fcntl.LOCK_EX)
        putter = threading.Thread(target=store.put_now, args=(entry_payload("seed-0", 1),))
        putter.start()
        wait_until(lambda: _flock_waiters(lock_path), DEADLINE, "the put waiting for the lock")
        for kind in ("state.json", "lock"):
            os.unlink(GymWriter(gym_dir).path("seed-0", kind))
        with open(lock_path, "a+b") as successor:
            fcntl.flock(successor.fileno(), fcntl.LOCK_EX)
            fcntl.flock(sweeper.fileno(), fcntl.LOCK_UN)
            wait_until(
                lambda: not putter.is_alive() or _flock_waiters(lock_path),
                DEADLINE,
                "the put to finish or to wait on the new lock file",
            )
            assert putter.is_alive(), "a lock on an unlinked lock file excludes nobody"
            with open(GymWriter(gym_dir).path("seed-0", "jsonl"), "rb") as f:
                assert f.read().count(b"\n") == 1, "nothing is written without the lock"
        putter.join(timeout=DEADLINE)
    assert not putter.is_alive()
    record_case("NeMo Gym operation queued on a lock file the sweep removed")


def test_an_edited_digit_in_an_indexed_line_masks_instead_of_training(gym_dir) -> None:
    """The state indexes every line by its sha256; a line that no longer matches is corrupt."""
    writer = GymWriter(gym_dir)
    for call in range(2):
        writer.put(entry_payload("t-6", call))
    path = writer.path("t-6", "jsonl")
    with open(path, "rb") as f:
        data = f.read()
    assert b"[100,200]" in data
    with open(path, "r+b") as f:
        f.write(data.replace(b"[100,200]", b"[109,200]", 1))
    with pytest.raises(UnreadableCaptureError, match="t-6.tokens.jsonl.*digest"):
        TokenCaptureStore(gym_dir).freeze_now("t-6")
    built = trajectories_for_rollout("t-6", [gym_dir])
    delivered = not built["mask_sample"]
    record_case("NeMo Gym indexed line edited in place", wrong_tokens_delivered=int(delivered))
    assert not delivered and "digest" in built["error"]


def test_an_indexed_line_blanked_in_place_masks_instead_of_vanishing(gym_dir) -> None:
    """Every call the state indexes must still be in the JSONL; a blank line is not a call."""
    writer = GymWriter(gym_dir)
    for call in range(3):
        writer.put(entry_payload("t-7", call))
    path = writer.path("t-7", "jsonl")
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    lines[1] = b" " * len(lines[1])
    with open(path, "r+b") as f:
        f.write(b"\n".join(lines))
    with pytest.raises(UnreadableCaptureError, match="c0001"):
        TokenCaptureStore(gym_dir).freeze_now("t-7")
    built = trajectories_for_rollout("t-7", [gym_dir])
    record_case("NeMo Gym indexed line blanked in place", records_lost=0)
    assert built["mask_sample"], "a call the index knows and the file lost masks"
