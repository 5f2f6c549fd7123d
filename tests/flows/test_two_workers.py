"""Two real process workers on one pool share one scheduled inbox; each file is handed off once.

The shipped inbox deployment is deployed with a 4-second interval schedule. The harness server
runs no scheduler service, so the test materializes the schedule's runs through the server's
own `POST /deployments/{id}/schedule`, as the scheduler would. Files keep arriving while the
runs execute. One worker is SIGKILLed (with its flow-run process) while its run is mid-file,
after one of the file's two batches was handed off; the other worker finishes that file on a
later run, once the dead run's claim lapsed. Every bound is a deadline; nothing sleeps to wait.
"""

from __future__ import annotations

import datetime
import json
import os
import re
from collections import Counter
from pathlib import Path

import httpx
import orjson
import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterStartTime

from capture_core.operator.run_status import run_completed
from capture_core.run.inbox import attempts, read_claim, run_id_for_file
from capture_core.run.run_layout import read_ledger
from capture_core.storage import open_byte_store
from capture_core.store import TokenCaptureStore
from tests.support.pipeline_helpers import REPO, dest_records, make_batch, rollout_ids
from tests.support.prefect_workers import kill_tree, prefect_cli, start_worker
from tests.support.reliability_figures import record_case
from tests.support.servers import wait_until
from tests.support.stalling_source import WORKER_ENV, read_flag
from tokcap.tasks.receipts import list_receipt_keys

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_api")]

POOL = "tokcap-two-workers"
# Long enough that renewals every quarter lease keep a live claim on a loaded 2-core machine
# (as in tests/run/test_lost_claim.py): only the killed worker's claim may lapse.
LEASE = 15.0
STALL_FILE = "a-stall.jsonl"
# Waves of (file, task index, rollouts); each wave arrives once the previous one is claimed.
# The stall file sorts first, so the next run to scan claims it and stalls in its batch 1.
WAVES = [
    [("f01.jsonl", 11, 2), ("f02.jsonl", 12, 2)],
    [(STALL_FILE, 1, 4), ("f03.jsonl", 13, 3)],
    [("f04.jsonl", 14, 3)],
]


def write_atomically(path: Path, records: list[dict]) -> str:
    """Publish an inbox file by rename, as producers must, so no pass reads half of it."""
    draft = path.with_suffix(".part")
    draft.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    os.replace(draft, path)
    return str(path)


def materialize_schedule(api: str, deployment_id: str, seconds: float) -> None:
    now = datetime.datetime.now(datetime.UTC)
    reply = httpx.post(
        f"{api}/deployments/{deployment_id}/schedule",
        json={
            "start_time": now.isoformat(),
            "end_time": (now + datetime.timedelta(seconds=seconds)).isoformat(),
            "max_runs": 100,
        },
        timeout=60,
    )
    reply.raise_for_status()


def flow_runs(since: datetime.datetime) -> list:
    """Every flow run that started after `since`."""
    with get_client(sync_client=True) as client:
        recent = FlowRunFilter(start_time=FlowRunFilterStartTime(after_=since))
        return client.read_flow_runs(flow_run_filter=recent, limit=200)


def state_names(flow_run_id) -> Counter:
    """How often the run entered each state; the history holds only accepted transitions.

    A run a worker claimed goes Pending (the claim), Submitting, Running, once each.
    """
    with get_client(sync_client=True) as client:
        return Counter(s.name for s in client.read_flow_run_states(flow_run_id))


@pytest.mark.integrity
def test_two_workers_hand_each_file_off_once_and_finish_a_killed_workers_file(
    tmp_path: Path, prefect_api: str
) -> None:
    inbox, root, dest = tmp_path / "inbox", str(tmp_path / "store"), str(tmp_path / "dest")
    inbox.mkdir()
    store, flag = TokenCaptureStore(root), str(tmp_path / "stalled")
    env = {
        **os.environ,
        "PREFECT_API_URL": prefect_api,
        "PYTHONPATH": REPO,  # only for tests.support.stalling_source; tokcap itself is installed
        "PREFECT_WORKER_QUERY_SECONDS": "1",
        "TOKCAP_INBOX": str(inbox),
        "TOKCAP_STORE": "tests.support.stalling_source:StallingStore",
        "TOKCAP_DEST": dest,
    }
    settings = {  # the whole `settings` parameter: `--params` replaces the file's
        "inbox": env["TOKCAP_INBOX"],
        "store": env["TOKCAP_STORE"],
        "dest": dest,
        "batch_size": 2,
        "claim_lease_seconds": LEASE,
        "source_kwargs": {"root": root, "stall_rollout": "1-3", "flag": flag},
    }
    # fan_out None: each pass finalizes in-process, so overlapping passes race for files
    params = {"fan_out": None, "settings": settings}
    prefect_cli(["work-pool", "create", POOL, "--type", "process", "--overwrite"], env, tmp_path)
    deploy = ["--no-prompt", "deploy", "--prefect-file", f"{REPO}/deployments/prefect.yaml"]
    schedule = ["--name", "inbox", "--pool", POOL, "--interval", "4"]
    prefect_cli([*deploy, *schedule, "--params", json.dumps(params)], env, tmp_path)
    with get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name("finalize-inbox/inbox")
    deployment_id = str(deployment.id)

    expected: dict[str, list[str]] = {}

    def arrive(name: str, task: int, count: int) -> str:
        url = write_atomically(inbox / name, make_batch(store, count, task=task))
        expected[url] = [f"{task}-{i}" for i in range(count)]
        return url

    started = datetime.datetime.now(datetime.UTC)
    workers = {
        name: start_worker(POOL, name, {**env, WORKER_ENV: name}, tmp_path) for name in ("a", "b")
    }
    killed: str | None = None
    dest_store = open_byte_store(dest)
    stalled = str(inbox / STALL_FILE)
    try:
        materialize_schedule(prefect_api, deployment_id, 300)
        for wave in WAVES:
            urls = [arrive(name, task, count) for name, task, count in wave]
            wait_until(
                lambda urls=urls: all(attempts(dest_store, run_id_for_file(u)) for u in urls),
                240,
                f"a run to claim {urls}",
            )
            if killed is None and read_flag(flag) is not None:
                killed = kill_stalled_worker(flag, workers, dest, stalled)
        if killed is None:
            wait_until(lambda: read_flag(flag) is not None, 240, "a run to stall mid-file")
            killed = kill_stalled_worker(flag, workers, dest, stalled)
        wait_until(
            lambda: all(run_completed(dest_store, run_id_for_file(u)) for u in expected),
            300,
            "every inbox file to be finalized",
        )
    finally:
        for proc in workers.values():
            kill_tree(proc.pid)
        stalled_pid = (read_flag(flag) or {}).get("pid")
        if stalled_pid:
            kill_tree(stalled_pid)
    try:
        check_each_file_handed_off_once(expected, dest, stalled)
        check_no_run_claimed_twice(deployment_id, tmp_path, started, expected, stalled)
    finally:
        with get_client(sync_client=True) as client:
            client.delete_deployment(deployment.id)
    record_case("two workers share one scheduled inbox; one is killed mid-file")


def kill_stalled_worker(flag: str, workers: dict, dest: str, stalled: str) -> str:
    """SIGKILL the worker whose run stalled, once that run handed off the file's batch 0."""
    run_id = run_id_for_file(stalled)
    wait_until(
        lambda: len(list_receipt_keys(dest, run_id, None)) == 1,
        120,
        "the stalled run to hand off batch 0",
    )
    stalled_by = read_flag(flag)
    assert stalled_by is not None and stalled_by["worker"] in workers
    kill_tree(workers[stalled_by["worker"]].pid)
    kill_tree(stalled_by["pid"])
    return stalled_by["worker"]


def check_each_file_handed_off_once(expected: dict[str, list[str]], dest: str, stalled: str):
    dest_store = open_byte_store(dest)
    for url, ids in expected.items():
        run_id = run_id_for_file(url)
        records = dest_records(dest, run_id)
        assert sorted(rollout_ids(records)) == sorted(ids), f"{url}: no duplicate, none lost"
        batches = (len(ids) + 1) // 2
        assert len(dest_store.list_prefix(f"{run_id}/records")) == batches
        assert len(list_receipt_keys(dest, run_id, None)) == batches, f"{url}: one receipt each"
        ledger = read_ledger(dest_store, run_id)
        assert ledger is not None and all(line.handed_off for line in ledger)
    run_id = run_id_for_file(stalled)
    first, second = read_claim(dest_store, run_id, 0), read_claim(dest_store, run_id, 1)
    assert first is not None and second is not None and first.owner != second.owner
    assert second.claimed_at >= first.claimed_at + LEASE, "taken over only after the lease"


def check_no_run_claimed_twice(
    deployment_id: str,
    logs: Path,
    since: datetime.datetime,
    expected: dict[str, list[str]],
    stalled: str,
) -> None:
    """Each inbox run started on one worker and ran once; each file was finalized once.

    A worker logs "submitting" before it asks the server for Pending; the server refuses all
    but one worker ("Aborted submission"), so a run starts on the worker that was not refused.
    """
    started: dict[str, set[str]] = {}
    for log in logs.glob("worker-*.log"):
        text = log.read_text()
        offered = set(re.findall(r"submitting flow run '([0-9a-f-]+)'", text))
        refused = set(re.findall(r"Aborted submission of flow run '([0-9a-f-]+)'", text))
        started[log.stem] = offered - refused
    assert all(started.values()) and len(started) == 2, f"both workers ran runs: {started}"
    assert not started["worker-a"] & started["worker-b"], "a run started on both workers"
    recent = flow_runs(since)
    mine = [r for r in recent if str(r.deployment_id) == deployment_id]
    entered = {str(r.id): state_names(r.id) for r in mine}
    twice = {run: names for run, names in entered.items() if max(names.values()) > 1}
    assert not twice, f"runs claimed (Pending) or started (Running) twice: {twice}"
    ran = {run for run, names in entered.items() if names["Running"]}
    assert ran and ran <= set().union(*started.values()), "every run ran on one of the workers"
    finalize_runs = Counter(
        r.parameters.get("run_id") for r in recent if r.name.startswith("finalize ")
    )
    assert finalize_runs == {
        run_id_for_file(url): 2 if url == stalled else 1 for url in expected
    }, "each file is finalized by one run; the killed worker's file by one more"
