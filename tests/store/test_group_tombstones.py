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
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any

import orjson
import pytest

from capture_core.errors import CaptureRetiredError, UnreadableCaptureError
from capture_core.protocols import DECIDED, DropRequest
from capture_core.storage import TMP_DIR, LocalStore
from capture_core.store import TokenCaptureStore, retirement
from capture_core.store.stored_json import encode_json
from capture_core.store.tokcap_removal import LOCAL_DECISIONS_AT_ONCE
from tests.store.test_store_attacks import REPO, two_turns
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


def test_on_s3_each_tombstone_names_only_its_own_rollout(s3_url, s3_options) -> None:
    """S3 shares no write between keys, so groups there are of one rollout."""
    store = TokenCaptureStore(s3_url, s3_options)
    drops = [frozen(store, f"r{i}") for i in range(3)]
    assert asyncio.run(store.drop_many(drops, concurrency=3)) == [True] * 3
    for drop in drops:
        document = orjson.loads(store.byte_store.get(f"{drop.rollout_id}/RETIRED") or b"{}")
        assert list(document[retirement.GROUP_KEY]) == [drop.rollout_id]


def test_staged_tombstones_are_released_before_any_deletion(tmp_path) -> None:
    store = TokenCaptureStore(str(tmp_path))
    drops = [frozen(store, f"r{i}") for i in range(5)]
    staged_at_decided: list[list[str]] = []

    def checkpoint(moment: str) -> None:
        if moment == DECIDED:
            staged_at_decided.append(os.listdir(tmp_path / TMP_DIR))

    assert asyncio.run(store.drop_many(drops, concurrency=2, checkpoint=checkpoint)) == [True] * 5
    assert staged_at_decided == [[]]


def test_one_malformed_request_fails_alone(store) -> None:
    good = [frozen(store, f"r{i}") for i in range(3)]
    bad = DropRequest("../r0", snapshot_id="s", version=1)
    odd = DropRequest("r0", snapshot_id=["s"], version=1)  # type: ignore[arg-type]
    results = asyncio.run(store.drop_many([*good, bad, odd], concurrency=2))
    assert results[:3] == [True] * 3 and isinstance(results[3], ValueError)
    assert results[4] is False


RERUN_WITHOUT_SPACE = """
import asyncio, resource, signal, sys
from capture_core.protocols import DropRequest
from capture_core.store import TokenCaptureStore
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (16, resource.RLIM_INFINITY))
store = TokenCaptureStore(sys.argv[1])
drops = [DropRequest(*line.split()[:2], version=int(line.split()[2])) for line in sys.argv[2:]]
print(asyncio.run(store.drop_many(drops[1:], concurrency=2)))
first = drops[0]
print(store.drop_now(first.rollout_id, first.snapshot_id, first.version))
"""


@pytest.mark.integrity
def test_a_rerun_on_a_full_disk_completes_a_retirement_killed_after_its_decisions(
    tmp_path,
) -> None:
    """The re-run of a batch whose tombstones are all durable writes nothing: it only
    deletes, which is what frees a full disk (a file size limit stands in for one)."""
    store = TokenCaptureStore(str(tmp_path / "store"))
    drops = [frozen(store, f"r{i}") for i in range(6)]

    class Killed(Exception):
        pass

    def kill(moment: str) -> None:
        if moment == DECIDED:
            raise Killed(moment)

    with pytest.raises(Killed):
        asyncio.run(store.drop_many(drops, concurrency=2, checkpoint=kill))
    lines = [f"{d.rollout_id} {d.snapshot_id} {d.version}" for d in drops]
    run = subprocess.run(
        [sys.executable, "-c", RERUN_WITHOUT_SPACE, str(tmp_path / "store"), *lines],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.split("\n")[:2] == [str([True] * 5), "True"], run.stdout
    for drop in drops:
        keys = store.byte_store.list_prefix(drop.rollout_id)
        assert keys == [f"{drop.rollout_id}/FROZEN", f"{drop.rollout_id}/RETIRED"]
    record_case("retirement re-run on a full disk", records_lost=0)


def in_flight_probe(limit: int, calls: int) -> tuple[Callable[..., Any], list[int]]:
    """A wrapper that records how many of `calls` calls run at once, each waiting (up to
    30 s) until `limit` are in flight or every call started, so a phase allowed to be
    wider is seen to be wider."""
    peak = [0]
    running = [0]
    started = [0]
    cond = threading.Condition()

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        def probed(*args: Any) -> Any:
            with cond:
                running[0] += 1
                started[0] += 1
                peak[0] = max(peak[0], running[0])
                cond.notify_all()
                cond.wait_for(lambda: running[0] >= limit or started[0] == calls, timeout=30)
            try:
                return fn(*args)
            finally:
                with cond:
                    running[0] -= 1
                    cond.notify_all()

        return probed

    return wrap, peak


@pytest.mark.parametrize("backend", ["local", "memory"])
def test_decisions_run_two_at_once_on_local_disk_and_deletions_as_wide_as_asked(
    tmp_path, backend: str
) -> None:
    """Local decisions are interpreter work and an fsync: more than two at once only
    contend (docs/perf.md). A store whose operations are round trips decides as wide as
    the deletions."""
    root = str(tmp_path) if backend == "local" else f"memory://tokcap-decide-{tmp_path.name}"
    store = TokenCaptureStore(root)
    drops = [frozen(store, f"r{i}") for i in range(12)]
    wide = 4
    decisions_at_once = LOCAL_DECISIONS_AT_ONCE if backend == "local" else wide
    probe_decide, decided_peak = in_flight_probe(decisions_at_once, len(drops))
    probe_delete, deleted_peak = in_flight_probe(wide, len(drops))
    store._decide_drop = probe_decide(store._decide_drop)  # type: ignore[method-assign]
    store._delete_retired = probe_delete(store._delete_retired)  # type: ignore[method-assign]
    assert asyncio.run(store.drop_many(drops, concurrency=wide)) == [True] * 12
    assert decided_peak == [decisions_at_once]
    assert deleted_peak == [wide]
