"""A killed worker's run is marked Crashed and retriggered; its file completes exactly once.

On the session's Prefect server: the shipped `inbox-file` and `retrigger-failed` deployments
(a copy of `prefect.yaml` that differs in the pool's name, the inbox store's arguments and a
3-second retrigger delay in place of 60; rows, delivery, batch size and claim lease set by
their `TOKCAP_*` variables at deploy time), the shipped automations applied, two real
process workers. No inbox schedule runs (the harness server has no scheduler) and no person
acts. A submitted file's run stalls in its second batch, after its first receipt; its
worker and its flow-run process are SIGKILLed. The run's heartbeats stop, the shipped
automation marks it (and its subflow) Crashed, the retrigger deployment's trigger starts a
retrigger with the run's own settings (the deploy-time ones included), which takes the
file's claim once the dead run's lapsed, and completes the file.
Every wait is a deadline on something observable.
"""

from __future__ import annotations

import datetime
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterStartTime

from capture_core.operator.run_status import run_completed
from capture_core.run.inbox import read_claim
from capture_core.run.run_layout import RunLayout
from capture_core.storage import open_byte_store
from capture_core.store import TokenCaptureStore
from tests.support.pipeline_helpers import (
    REPO,
    dest_records,
    make_batch,
    rollout_ids,
    run_cli,
    write_rollouts,
)
from tests.support.prefect_workers import (
    all_final,
    deployment_runs,
    kill_tree,
    prefect_cli,
    start_worker,
)
from tests.support.reliability_figures import record_case
from tests.support.servers import wait_until
from tests.support.shipped_triggers import SHIPPED, remove_deployed
from tests.support.stalling_source import WORKER_ENV, read_flag
from tokcap.flows.submit import submit_files
from tokcap.tasks.receipts import list_receipt_keys

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_api")]

POOL = "tokcap-killed-worker"
FILE_RUNS, RETRIGGERS = "finalize-inbox-file/inbox-file", "retrigger-failed/retrigger-failed"
LEASE = 20.0  # lapses before the crash is detected (90 s of silence), so no wait for it here
# Heartbeat every 30 s + 90 s of silence + the 5 s proactive evaluation + the 3 s retrigger
# delay + a worker's poll, process start and the rest of the file, on a loaded machine.
DEADLINE = 420
SETTINGS = {
    "TOKCAP_BATCH_SIZE": "2",
    "TOKCAP_CLAIM_LEASE_SECONDS": str(LEASE),
    "TOKCAP_ROWS": "parquet",
    "TOKCAP_DELIVERY": "all_traces",
}


def deployable_yaml(directory: Path, settings: dict[str, Any]) -> Path:
    """The shipped file on this module's pool, with these inbox settings for file runs."""
    spec = yaml.safe_load(SHIPPED.read_text())
    for deployment in spec["deployments"]:
        deployment["work_pool"]["name"] = POOL
        if deployment["name"] == "inbox-file":
            deployment["parameters"]["settings"].update(settings)
        for trigger in deployment.get("triggers") or []:
            if trigger.get("schedule_after"):
                trigger["schedule_after"] = 3
    path = directory / "prefect.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


@pytest.fixture()
def killed_worker_path(tmp_path: Path, prefect_api: str) -> Iterator[dict[str, Any]]:
    inbox, dest, root = tmp_path / "inbox", str(tmp_path / "dest"), str(tmp_path / "store")
    flag = str(tmp_path / "stalled")
    env = {
        **os.environ,
        "PREFECT_API_URL": prefect_api,
        "PYTHONPATH": REPO,  # only for tests.support.stalling_source; tokcap itself is installed
        "PREFECT_WORKER_QUERY_SECONDS": "1",
        "TOKCAP_INBOX": str(inbox),
        "TOKCAP_STORE": "tests.support.stalling_source:StallingStore",
        "TOKCAP_DEST": dest,
        **SETTINGS,  # the inbox settings at deploy time, which the retrigger must keep
    }
    settings = {"source_kwargs": {"root": root, "stall_rollout": "51-3", "flag": flag}}
    prefect_cli(["work-pool", "create", POOL, "--type", "process", "--overwrite"], env, tmp_path)
    deploy = ["--no-prompt", "deploy", "--prefect-file", str(deployable_yaml(tmp_path, settings))]
    prefect_cli([*deploy, "--name", "inbox-file", "--name", "retrigger-failed"], env, tmp_path)
    applied = run_cli(["automations", "apply"], prefect_api)
    assert applied.returncode == 0, applied.stderr
    workers = {n: start_worker(POOL, n, {**env, WORKER_ENV: n}, tmp_path) for n in ("a", "b")}
    try:
        yield {"inbox": inbox, "dest": dest, "root": root, "flag": flag, "workers": workers}
    finally:
        for worker in workers.values():
            kill_tree(worker.pid)
        remove_deployed(POOL)


@pytest.mark.integrity
def test_a_killed_workers_run_is_crashed_and_retriggered_to_completion_once(
    killed_worker_path: dict[str, Any], tmp_path: Path
) -> None:
    paths = killed_worker_path
    started = datetime.datetime.now(datetime.UTC)
    records = make_batch(TokenCaptureStore(paths["root"]), 4, task=51)
    source = write_rollouts(str(tmp_path / "outbox" / "killed.jsonl"), records)
    (submitted,) = submit_files(str(paths["inbox"]), [source])
    assert submitted.announced, submitted
    run_id, dest = submitted.run_id, paths["dest"]

    wait_until(lambda: read_flag(paths["flag"]) is not None, 240, "the file's run to stall")
    wait_until(
        lambda: len(list_receipt_keys(dest, run_id, None)) == 1,
        120,
        "the stalled run to hand off its first batch",
    )
    stalled_by = read_flag(paths["flag"])
    assert stalled_by is not None
    kill_tree(paths["workers"][stalled_by["worker"]].pid)
    kill_tree(stalled_by["pid"])
    killed = time.monotonic()

    wait_until(lambda: run_completed(open_byte_store(dest), run_id), DEADLINE, "the file", 1)
    completed = time.monotonic() - killed
    (crashed,) = deployment_runs(FILE_RUNS, run_id)
    assert crashed.state.is_crashed(), crashed.state
    wait_until(lambda: all_final(deployment_runs(RETRIGGERS, run_id)), 120, "the retrigger", 1)
    (retrigger,) = deployment_runs(RETRIGGERS, run_id)
    assert retrigger.state.is_completed(), retrigger.state
    assert retrigger.parameters["failed_run"] == str(crashed.id)
    assert retrigger.parameters["retrigger"] == 1

    ids = rollout_ids(dest_records(dest, run_id))
    assert sorted(ids) == [f"51-{i}" for i in range(4)], "each rollout handed off exactly once"
    assert len(list_receipt_keys(dest, run_id, None)) == 2, "one receipt per batch"
    layout = RunLayout(open_byte_store(dest), run_id)
    manifest = layout.read_manifest()
    assert manifest is not None
    assert (manifest.rows, manifest.delivery, manifest.batch_size) == ("parquet", "all_traces", 2)
    assert crashed.parameters["settings"]["rows"] == "parquet", "as deployed from TOKCAP_ROWS"
    first, second = read_claim(layout.dest, run_id, 0), read_claim(layout.dest, run_id, 1)
    assert first is not None and str(crashed.id) in first.owner
    assert second is not None and str(retrigger.id) in second.owner, "under the file's claim"
    check_nothing_left_running(started)
    print(f"killed -> file complete: {completed:.0f} s")
    record_case("a killed worker's run is marked Crashed and retriggered to completion once")


def check_nothing_left_running(since: datetime.datetime) -> None:
    """Every flow run since `since` ended: the killed run's subflow too."""
    with get_client(sync_client=True) as client:
        recent = FlowRunFilter(start_time=FlowRunFilterStartTime(after_=since))
        runs = client.read_flow_runs(flow_run_filter=recent, limit=200)
    assert runs, "the runs of this test"
    running = {r.name: r.state.name for r in runs if not r.state.is_final()}
    assert not running, f"runs left running: {running}"
    crashed = sorted(r.name for r in runs if r.state.is_crashed())
    assert len(crashed) == 2, f"the killed run and its subflow are Crashed: {crashed}"
