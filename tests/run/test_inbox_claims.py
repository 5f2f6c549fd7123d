"""Inbox claims: of passes racing for one file exactly one finalizes it; dead claims lapse."""

from __future__ import annotations

import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from capture_core.run.inbox import (
    attempts,
    keep_claim,
    outwait_silent_claim,
    read_claim,
    release_claim,
    renew_claim,
    run_id_for_file,
    take_claim,
)
from capture_core.storage import open_byte_store
from capture_core.store import TokenCaptureStore
from tests.support.pipeline_helpers import dest_records, make_batch, rollout_ids, write_rollouts
from tests.support.reliability_figures import record_case
from tests.support.servers import wait_until
from tests.support.stalling_source import run_while_stalled
from tokcap.flows.inbox import FileSettings, finalize_inbox

pytestmark = pytest.mark.integrity

LEASE = 30.0


def test_of_racing_passes_exactly_one_claims_a_file(store_location) -> None:
    root, options = store_location
    dest = open_byte_store(root, options)
    barrier = threading.Barrier(8)

    def race(n: int) -> str:
        barrier.wait(timeout=60)
        return take_claim(dest, "run-a", f"pass {n}", uuid.uuid4().hex, LEASE, 3).status

    with ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(race, range(8)))
    assert sorted(statuses) == ["claimed"] + ["held"] * 7
    assert attempts(dest, "run-a") == 1
    record_case("two inbox passes race for one file")


def test_a_claim_lapses_only_when_its_holder_stops_renewing_it(tmp_path) -> None:
    dest = open_byte_store(str(tmp_path / "dest"))
    first = take_claim(dest, "run-b", "dead pass", "t1", LEASE, 3, now=1000.0)
    assert first.status == "claimed" and first.claim is not None
    assert take_claim(dest, "run-b", "dead pass", "t1", LEASE, 3, now=1001.0).claim == first.claim
    assert take_claim(dest, "run-b", "other", "t2", LEASE, 3, now=1029.0).status == "held"
    renew_claim(dest, first.claim, now=1025.0)
    assert take_claim(dest, "run-b", "other", "t2", LEASE, 3, now=1050.0).status == "held"
    later = take_claim(dest, "run-b", "other", "t2", LEASE, 3, now=1056.0)
    assert later.status == "claimed" and later.claim is not None and later.claim.number == 1
    release_claim(dest, later.claim, ok=False)
    again = take_claim(dest, "run-b", "third", "t3", LEASE, 3, now=1057.0)
    assert again.status == "claimed" and again.claim is not None
    release_claim(dest, again.claim, ok=False)
    assert take_claim(dest, "run-b", "fourth", "t4", LEASE, 3, now=1058.0).status == "given_up"
    assert read_claim(dest, "run-b", 0).owner == "dead pass"


class FakeTime:
    """A clock that `sleep` advances, calling `during_sleep` once per sleep."""

    def __init__(self, now: float, during_sleep=lambda now: None) -> None:
        self.now, self.during_sleep, self.sleeps = now, during_sleep, 0

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.sleeps += 1
        self.during_sleep(self.now)


def test_a_silent_claim_is_waited_out_and_a_renewed_one_left_to_its_holder(tmp_path) -> None:
    dest = open_byte_store(str(tmp_path / "dest"))
    dead = take_claim(dest, "run-d", "killed pass", "t1", LEASE, 3, now=1000.0).claim
    assert dead is not None
    renew_claim(dest, dead, now=1010.0)
    silent = FakeTime(1020.0)
    assert outwait_silent_claim(dest, "run-d", lambda: silent.now, silent.sleep)
    assert 1040.0 <= silent.now < 1040.0 + LEASE / 20 + 1, "returns once the lease lapsed"

    live = take_claim(dest, "run-e", "live pass", "t2", LEASE, 3, now=1000.0).claim
    assert live is not None
    renewing = FakeTime(1001.0, lambda now: renew_claim(dest, live, now=now))
    assert not outwait_silent_claim(dest, "run-e", lambda: renewing.now, renewing.sleep)
    assert renewing.sleeps == 1, "a renewal shows a live holder: left to it at once"

    taken = take_claim(dest, "run-f", "first pass", "t3", LEASE, 3, now=1000.0).claim
    assert taken is not None

    def another_takes_over(now: float) -> None:
        release_claim(dest, taken, ok=False)
        take_claim(dest, "run-f", "second pass", "t4", LEASE, 3, now=now)

    newer = FakeTime(1001.0, another_takes_over)
    assert not outwait_silent_claim(dest, "run-f", lambda: newer.now, newer.sleep)
    release_claim(dest, read_claim(dest, "run-f", 1), ok=True)
    ended = FakeTime(1002.0)
    assert outwait_silent_claim(dest, "run-f", lambda: ended.now, ended.sleep)
    assert ended.sleeps == 0, "an ended claim needs no wait"


def test_keep_claim_renews_while_its_body_runs(tmp_path) -> None:
    dest = open_byte_store(str(tmp_path / "dest"))
    claim = take_claim(dest, "run-c", "slow pass", "t1", 0.4, 3).claim
    assert claim is not None
    beat = f"run-c/attempts/{claim.number:04d}.beat"
    with keep_claim(str(tmp_path / "dest"), claim):
        wait_until(lambda: dest.exists(beat), 30, "the first renewal")
        first = dest.get(beat)
        wait_until(lambda: dest.get(beat) != first, 30, "a second renewal")
        assert take_claim(dest, "run-c", "other", "t2", 0.4, 3).status == "held"


@pytest.mark.usefixtures("prefect_api")
def test_a_pass_leaves_a_file_that_another_live_pass_is_finalizing(tmp_path) -> None:
    inbox, root, dest = str(tmp_path / "inbox"), str(tmp_path / "store"), str(tmp_path / "dest")
    url = write_rollouts(f"{inbox}/a.jsonl", make_batch(TokenCaptureStore(root), 4))
    flag = str(tmp_path / "stalled")
    source = {"root": root, "stall_rollout": "7-3", "flag": flag}
    spec = "tests.support.stalling_source:StallingStore"

    def run_pass():
        return finalize_inbox(
            FileSettings(inbox=inbox, store=spec, dest=dest, batch_size=2, source_kwargs=source)
        )

    report, second = run_while_stalled(run_pass, flag)
    assert second.busy == [url] and second.finalized == []
    assert report.finalized == [url]
    run_id = run_id_for_file(url)
    assert sorted(rollout_ids(dest_records(dest, run_id))) == [f"7-{i}" for i in range(4)]
    assert attempts(open_byte_store(dest), run_id) == 1
    record_case("an inbox pass overlaps one that holds a file")
