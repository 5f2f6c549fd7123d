"""Attacks on a pass that lost its hold on a run: it never overwrites what the holder wrote.

A pass paused past its lease (SIGSTOP) loses its inbox claim to another pass, which finishes
the file and retires every capture. When the paused pass resumes it must stop before any
write that decides the run's state, and a batch another pass handed off meanwhile is never
rebuilt (its captures are retired: the rebuild would be masked). The ledger always agrees
with the parts. Passes run against the session's real Prefect server; S3 is a real moto
server; the paused pass is a real subprocess.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import BinaryIO

import orjson
import pytest

from capture_core.errors import ClaimLostError
from capture_core.operator.run_report import RunSummary, summarize
from capture_core.run.inbox import (
    Claim,
    claim_is_live,
    keep_claim,
    read_claim,
    run_id_for_file,
    take_claim,
)
from capture_core.run.run_layout import RunLayout, read_ledger
from capture_core.storage import open_byte_store
from capture_core.store import TokenCaptureStore
from tests.support.pipeline_helpers import (
    REPO,
    dest_records,
    make_batch,
    rollout_ids,
    write_rollouts,
)
from tests.support.reliability_figures import record_case
from tests.support.servers import wait_until
from tests.support.stalling_source import read_flag, release, run_while_stalled
from tokcap.flows.finalize import finalize_run
from tokcap.flows.inbox import FileSettings, finalize_inbox
from tokcap.tasks.receipts import list_receipt_keys

pytestmark = [pytest.mark.integrity, pytest.mark.usefixtures("prefect_api")]

STALLING = "tests.support.stalling_source:StallingStore"
# Long enough that renewals every quarter lease keep a claim alive on a loaded 2-core machine.
LEASE = 15.0


def stalling(locations: dict, flag: str, rollout: str) -> dict:
    """`source_kwargs` of a `StallingStore` over the locations' store."""
    return {
        "root": locations["store"],
        "stall_rollout": rollout,
        "flag": flag,
        "storage_options": locations["options"],
    }


def check_ledger_agrees_with_parts(locations: dict, run_id: str, count: int) -> None:
    """Every rollout is in one part, unmasked, and the ledger says handed off and retired."""
    dest = open_byte_store(locations["dest"], locations["options"])
    records = dest_records(locations["dest"], run_id, locations["options"])
    assert sorted(rollout_ids(records)) == sorted(f"7-{i}" for i in range(count))
    assert not any(r.get("mask_sample") for r in records)
    ledger = read_ledger(dest, run_id)
    assert ledger is not None and len(ledger) == count
    assert all(line.handed_off and line.retired and not line.masked for line in ledger)
    assert summarize(run_id, ledger).ok


def test_a_pass_whose_claim_was_taken_over_writes_nothing(locations) -> None:
    options = locations["options"]
    records = make_batch(TokenCaptureStore(locations["store"], options), 2)
    write_rollouts(locations["rollouts"], records, options)
    dest = open_byte_store(locations["dest"], options)
    paused = take_claim(dest, "taken", "paused pass", "t1", LEASE, 3, now=time.time() - 60)
    holder = take_claim(dest, "taken", "holder", "t2", LEASE, 3)
    assert paused.claim is not None and holder.claim is not None

    def run_holding(claim: Claim) -> RunSummary:
        return finalize_run(
            locations["rollouts"],
            locations["store"],
            locations["dest"],
            "taken",
            storage_options=options,
            claim=claim,
        )

    with pytest.raises(ClaimLostError, match="now held by attempt 2 \\(holder\\)"):
        run_holding(paused.claim)
    assert [k for k in dest.list_prefix("taken") if "/attempts/" not in k] == []
    assert RunLayout(dest, "taken").read_manifest() is None
    with keep_claim(locations["dest"], holder.claim, options):
        summary = run_holding(holder.claim)
    assert summary.ok and summary.retired == 2
    record_case("a pass that lost its claim writes under the run")


def test_a_batch_handed_off_meanwhile_is_not_rebuilt_as_masked(locations, tmp_path) -> None:
    options = locations["options"]
    records = make_batch(TokenCaptureStore(locations["store"], options), 12)
    write_rollouts(locations["rollouts"], records, options)
    flag = str(tmp_path / "stalled")
    settings = {
        "batch_size": 2,
        "max_mask_fraction": 0.1,
        "mask_fraction_min_samples": 4,
        "storage_options": options,
        "source_kwargs": stalling(locations, flag, "7-2"),
    }

    def run_pass():
        return finalize_run(locations["rollouts"], STALLING, locations["dest"], "twice", **settings)

    late, fast = run_while_stalled(run_pass, flag)
    assert fast.ok and fast.retired == 12
    assert late.ok and late.handed_off == 12, late.errors
    check_ledger_agrees_with_parts(locations, "twice", 12)
    record_case("a late pass rebuilds a batch handed off meanwhile as masked")


def start_inbox_pass(arguments: dict, api_url: str, log: BinaryIO) -> subprocess.Popen:
    """`finalize_inbox` of the settings `arguments` in a real subprocess against the session's
    Prefect server."""
    code = "import sys; from tests.support.workers import inbox_pass; inbox_pass(sys.argv[1])"
    return subprocess.Popen(
        [sys.executable, "-c", code, orjson.dumps(arguments).decode()],
        cwd=REPO,
        env={**os.environ, "PREFECT_API_URL": api_url, "PYTHONPATH": REPO},
        stdout=subprocess.PIPE,
        stderr=log,
    )


def retired_batches(dest, run_id: str) -> int:
    return sum("-retired-" in key for key in dest.list_prefix(f"{run_id}/receipts"))


@pytest.mark.slow
def test_a_resumed_pass_that_lost_its_claim_leaves_the_ledger_alone(
    locations, tmp_path, prefect_api: str
) -> None:
    options = locations["options"]
    inbox = locations["inbox"]
    records = make_batch(TokenCaptureStore(locations["store"], options), 60)
    url = write_rollouts(f"{inbox}/a.jsonl", records, options)
    run_id, flag = run_id_for_file(url), str(tmp_path / "stalled")
    arguments = {
        "inbox": inbox,
        "store": STALLING,
        "dest": locations["dest"],
        "batch_size": 10,
        "max_mask_fraction": 0.1,
        "storage_options": options,
        "source_kwargs": stalling(locations, flag, "7-15"),
        "claim_lease_seconds": LEASE,
    }
    log_path = tmp_path / "paused.log"
    with open(log_path, "wb") as log:
        paused = start_inbox_pass(arguments, prefect_api, log)
        out = pause_past_lease_then_resume(paused, arguments, locations, flag, url)
    assert paused.returncode == 0, log_path.read_text()[-3000:]
    assert orjson.loads(out)["busy"] == [url], "the resumed pass leaves the file to the holder"
    check_ledger_agrees_with_parts(locations, run_id, 60)
    assert len(list_receipt_keys(locations["dest"], run_id, options)) == 6
    record_case("a worker paused past its lease resumes and overwrites the ledger")


def pause_past_lease_then_resume(
    paused: subprocess.Popen, arguments: dict, locations: dict, flag: str, url: str
) -> bytes:
    """Stop the stalled pass past its lease, finish the file in this process, resume it.

    Returns the resumed pass's output, once the ledger the holder wrote was left alone.
    """
    run_id = run_id_for_file(url)
    dest = open_byte_store(locations["dest"], locations["options"])
    try:
        wait_until(lambda: read_flag(flag) is not None, 240, "the first pass to stall")
        wait_until(lambda: retired_batches(dest, run_id) == 1, 120, "batch 0 to retire")
        os.kill(paused.pid, signal.SIGSTOP)
        release(flag)
        claim = read_claim(dest, run_id, 0)
        assert claim is not None
        wait_until(
            lambda: not claim_is_live(dest, claim, time.time()), 4 * LEASE, "the lease to lapse"
        )
        report = finalize_inbox(FileSettings(**arguments))
        assert report.finalized == [url]
        check_ledger_agrees_with_parts(locations, run_id, 60)
        ledger = dest.get(RunLayout(dest, run_id).ledger_key)
        os.kill(paused.pid, signal.SIGCONT)
        out, _ = paused.communicate(timeout=300)
    finally:
        if paused.poll() is None:
            os.kill(paused.pid, signal.SIGCONT)
            paused.kill()
            paused.wait(timeout=60)
    assert dest.get(RunLayout(dest, run_id).ledger_key) == ledger, "the ledger is the holder's"
    return out
