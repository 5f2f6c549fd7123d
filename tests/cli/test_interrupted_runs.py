"""Runs interrupted for real: a killed worker, a stopped Prefect server, an S3 outage.

Each run hands off batches 0 and 1, stalls in batch 2 (`tests.support.interrupted_run`),
and is then interrupted. `tokcap status` must call it interrupted (exit 1, once Prefect
knows its flow run is dead), not unknown;
`tokcap retrigger` must count as new only what it did; the interrupted command must say
what stopped it, what was handed off, and the command that completes the run.
"""

from __future__ import annotations

import re
import time

import orjson
import pytest

from tests.support.fault_proxy import FaultPlan, fault_proxy
from tests.support.interrupted_run import StalledRun, start_cli
from tests.support.pipeline_helpers import dest_records, rollout_ids, run_cli
from tests.support.prefect_api_reads import crash_running
from tests.support.prefect_workers import kill_tree
from tests.support.reliability_figures import record_case
from tests.support.servers import PrefectServer

pytestmark = [pytest.mark.integrity, pytest.mark.usefixtures("prefect_api")]

INTERRUPTED = 1
"""`tokcap status`'s exit status for a run that stopped with nothing scheduled, and that of
a command the Prefect API left mid-run (it prints `interrupted`): a person runs the command
it prints."""
LOST_WITHIN = 30
"""Seconds from a stopped Prefect server to the CLI's exit (it notices within about 6 s;
Prefect's client alone took 217 s)."""


def assert_started_status(run: StalledRun, api_url: str) -> None:
    """`tokcap status` of the interrupted run, once Prefect marked its dead flow run Crashed
    (as the shipped silence automation does): interrupted, batches 0 and 1 handed off, the
    command that completes it, exit 1."""
    crash_running(run.run_id, api_url)
    batches = run.rollouts_count // 2
    status = run_cli(run.status_args(), api_url)
    assert status.returncode == INTERRUPTED, status.stdout + status.stderr
    assert "unknown run id" not in status.stderr
    assert status.stdout.startswith(f"interrupted: run {run.run_id}: stopped"), status.stdout
    assert (
        f"so far: 2 of {batches} batches handed off (4 rollouts), no ledger yet" in status.stdout
    ), status.stdout
    assert run.completing_command() in status.stdout, status.stdout
    as_json = orjson.loads(run_cli(run.status_args("--json"), api_url).stdout)
    assert as_json["state"] == "interrupted" and as_json["summary"] is None
    progress = {"batches": batches, "batches_handed_off": 2, "rollouts_handed_off": 4}
    assert as_json["progress"] == progress


def assert_retrigger_completes(run: StalledRun, api_url: str) -> None:
    """`tokcap retrigger` hands off what batches 0 and 1 did not and says so; status then
    agrees with it, exit 0."""
    count = run.rollouts_count
    again = run_cli(run.retrigger_args(), api_url)
    assert again.returncode == 0, again.stdout + again.stderr[-2000:]
    assert (
        f"run {run.run_id}: {count - 4} newly handed off (4 by an earlier run), {count - 4} "
        "newly retired (4 by an earlier run), 0 still failing" in again.stdout
    ), again.stdout
    status = run_cli(run.status_args("--json"), api_url)
    assert status.returncode == 0, status.stdout + status.stderr
    summary = orjson.loads(status.stdout)["summary"]
    counts = (summary["handed_off"], summary["already_handed_off"], summary["retired"])
    assert counts == (count, 4, count)
    records = dest_records(run.dest, run.run_id, run.options)
    assert rollout_ids(records) == [f"7-{i}" for i in range(count)], "nothing lost or duplicated"


def test_a_killed_worker_leaves_a_started_run_that_retrigger_completes(
    tmp_path, prefect_api: str
) -> None:
    run = StalledRun(tmp_path, "killed")
    proc = start_cli(run.finalize_args(), {"PREFECT_API_URL": prefect_api})
    try:
        run.wait_stalled(proc)
    finally:
        kill_tree(proc.pid)
    run.release()
    assert_started_status(run, prefect_api)
    assert_retrigger_completes(run, prefect_api)
    record_case("status calls a run whose worker was killed unknown")
    record_case("retrigger counts an interrupted run's handoffs as its own")


def test_status_of_a_run_id_never_started_is_unknown(tmp_path, prefect_api: str) -> None:
    (tmp_path / "dest").mkdir()
    status = run_cli(["status", "--dest", str(tmp_path / "dest"), "--run-id", "never"], prefect_api)
    assert status.returncode == 2
    assert re.search(r"unknown run id never at .*: no manifest", status.stderr), status.stderr


@pytest.mark.slow
def test_a_prefect_server_stopped_mid_finalize_is_one_line_the_summary_and_the_command(
    tmp_path,
) -> None:
    server = PrefectServer(str(tmp_path / "prefect-home"))
    server.start()
    try:
        run = StalledRun(tmp_path, "server-stopped")
        env = {"PREFECT_API_URL": server.api_url, "PREFECT_LOGGING_LEVEL": "INFO"}  # as a user's
        proc = start_cli(run.finalize_args(), env)
        try:
            run.wait_stalled(proc)
            server.stop()
            stopped = time.monotonic()
            out, err = proc.communicate(timeout=LOST_WITHIN)
            took = time.monotonic() - stopped
        finally:
            kill_tree(proc.pid)
        run.release()
        assert proc.returncode == INTERRUPTED, out + err
        (line,) = [line for line in err.splitlines() if "stopped answering" in line]
        assert line.startswith(f"tokcap finalize: the Prefect API at {server.api_url} "), err
        assert "start that server again" in line and "the command below" in line, err
        for internal in ("Traceback", "Error logging to API", "Service '", "ConnectError"):
            assert internal not in out + err, err
        assert "interrupted: 2 of 3 batches handed off (4 rollouts); no ledger yet" in out, out
        assert f"complete it with: {run.completing_command()}" in out, out
        assert took < LOST_WITHIN
        server.start()
        assert_started_status(run, server.api_url)
        assert_retrigger_completes(run, server.api_url)
    finally:
        server.stop()
    record_case("a Prefect server stopped mid-run leaves the CLI silent for minutes")


@pytest.mark.slow
def test_an_s3_outage_mid_run_names_each_failed_batch_and_still_prints_the_summary(
    tmp_path, s3_options, prefect_api: str
) -> None:
    """The outage begins right after batch 2's part was written and read back, before its
    receipt: that receipt, batch 3's upload, and the ledger all fail."""
    from tests.conftest import make_bucket

    bucket = make_bucket(s3_options)
    plan = FaultPlan(kinds=("drop-before",), outage_after=("GET", "/records/part-00002-"))
    with fault_proxy(str(s3_options["endpoint_url"]), plan) as proxy:
        options = {"endpoint_url": proxy}
        prefix = f"s3://{bucket}"
        run = StalledRun(tmp_path, "outage", prefix=prefix, options=options, rollouts_count=8)
        env = {"PREFECT_API_URL": prefect_api, "PREFECT_LOGGING_LEVEL": "INFO"}  # as a user's
        proc = start_cli(run.finalize_args(), env)
        try:
            run.wait_stalled(proc)
            run.release()
            out, err = proc.communicate(timeout=400)
        finally:
            kill_tree(proc.pid)
        plan.rate = 0.0
        assert proc.returncode == 1, out + err
        assert re.search(r"^handed off\s+4$", out, re.M) and re.search(r"^failed\s+4$", out, re.M)
        assert "ledger:  not written (the next run of this run id writes it)" in out, out
        live, _, block = err.partition("tokcap finalize failed:\n")
        failures = [line.strip() for line in block.splitlines() if line.startswith("  ")]
        assert [line.split(":")[0] for line in failures] == [
            "batch 2",
            "batch 3",
            "the ledger could not be written",
        ]
        assert failures[0].startswith(
            "batch 2: its part was written and verified, but its receipt could not be stored"
        ), failures
        assert (
            failures[1].startswith("batch 3: upload failed: storage at")
            and "unreachable" in failures[1]
        )
        for line in failures[:2]:
            assert sum(line in shown for shown in live.splitlines()) == 1, "one line as it fails"
        assert f"complete the run with: {run.completing_command()}" in block, block
        for internal in ("Failed to write result", "committing transaction", "Task run failed"):
            assert internal not in err, err
        assert_started_status(run, prefect_api)
        assert_retrigger_completes(run, prefect_api)
    record_case("an S3 outage mid-run leaves no summary and logs receipts as lost")
