"""Racing writers and freezers in real processes, on local disk and S3 (moto server)."""

from __future__ import annotations

import multiprocessing
import threading
import uuid

import pytest

from capture_core.errors import CaptureFencedError
from capture_core.store import TokenCaptureStore
from tests.support import workers
from tests.support.backends import PROCESS_SHARED_BACKENDS, store_location

WRITERS = 8


@pytest.fixture(params=PROCESS_SHARED_BACKENDS)
def shared_root(request: pytest.FixtureRequest, tmp_path) -> tuple[str, dict[str, object]]:
    return store_location(request.param, request, tmp_path)


SPAWN = multiprocessing.get_context("spawn")


def test_eight_processes_put_overlapping_entries(shared_root) -> None:
    root, options = shared_root
    rollouts = [f"r{i}" for i in range(4)]
    shared_calls, own_calls = 6, 3
    with SPAWN.Manager() as manager, SPAWN.Pool(WRITERS) as pool:
        barrier = manager.Barrier(WRITERS)
        results = [
            pool.apply_async(
                workers.put_overlapping,
                (root, options, w, rollouts, shared_calls, own_calls, barrier),
            )
            for w in range(WRITERS)
        ]
        errors = [error for result in results for error in result.get(timeout=300)]
    assert errors == [], "no false conflict and no lost write"
    store = TokenCaptureStore(root, options)
    for rollout_id in rollouts:
        snapshot = store.freeze_now(rollout_id)
        calls = [e.model_call_id for e in snapshot.entries]
        assert len(calls) == len(set(calls)) == shared_calls + WRITERS * own_calls
        assert not snapshot.incomplete
        for entry in snapshot.entries:
            if entry.model_call_id.startswith("shared-"):
                call = int(entry.model_call_id.split("-")[1])
                assert entry == workers.shared_entry(rollout_id, call), "torn or mixed payload"


def test_two_processes_freezing_at_once_get_the_same_snapshot(shared_root) -> None:
    root, options = shared_root
    store = TokenCaptureStore(root, options)
    rollouts = [f"race-{i}" for i in range(5)]
    for rollout_id in rollouts:
        store.put_now(workers.own_entry(rollout_id, 0, 0))
    with SPAWN.Manager() as manager, SPAWN.Pool(2) as pool:
        for rollout_id in rollouts:
            barrier = manager.Barrier(2)
            pending = [
                pool.apply_async(workers.freeze_together, (root, options, rollout_id, barrier))
                for _ in range(2)
            ]
            first, second = (p.get(timeout=120) for p in pending)
            assert first == second, f"{rollout_id}: two freezers saw different snapshots"


def test_put_racing_freeze_never_slips_in_silently(shared_root) -> None:
    root, options = shared_root
    trials = 60 if root.startswith("s3://") else 200
    outcomes = {"raised": 0, "in_snapshot": 0, "drop_refused": 0}
    for trial in range(trials):
        rollout_id = f"t{trial}-{uuid.uuid4().hex[:6]}"
        writer, freezer = TokenCaptureStore(root, options), TokenCaptureStore(root, options)
        writer.put_now(workers.own_entry(rollout_id, 0, 0))
        late = workers.own_entry(rollout_id, 1, 1)
        raised: list[bool] = []
        go = threading.Barrier(2)

        def put_late(writer=writer, late=late, raised=raised, go=go) -> None:
            go.wait()
            try:
                writer.put_now(late)
            except CaptureFencedError:
                raised.append(True)

        thread = threading.Thread(target=put_late)
        thread.start()
        go.wait()
        snapshot = freezer.freeze_now(rollout_id)
        thread.join()
        if raised:
            outcomes["raised"] += 1
        elif late in snapshot.entries:
            outcomes["in_snapshot"] += 1
        else:
            dropped = freezer.drop_now(rollout_id, snapshot.snapshot_id, snapshot.version)
            assert not dropped, f"trial {trial}: a late put slipped in and retirement succeeded"
            outcomes["drop_refused"] += 1
    assert sum(outcomes.values()) == trials
