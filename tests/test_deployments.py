"""`prefect deploy --all` registers every deployment; a triggered run executes via a worker."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from prefect.client.orchestration import get_client

from capture_core.store import TokenCaptureStore
from tests.pipeline_helpers import REPO, dest_records, make_batch, write_rollouts
from tests.servers import wait_until

pytestmark = pytest.mark.usefixtures("prefect_api")

EXPECTED = {
    "finalize-inbox/inbox",
    "finalize-run/finalize-run",
    "finalize-run/finalize-run-strict",
    "dispatch-clear/dispatch-clear",
    "retire-uploaded/retire-uploaded",
    "retrigger-failed/retrigger-failed",
}


def prefect(
    args: list[str], env: dict[str, str], timeout: float = 300
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "prefect", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_deploy_all_then_a_worker_runs_a_triggered_finalize(tmp_path, prefect_api: str) -> None:
    store, dest = str(tmp_path / "store"), str(tmp_path / "dest")
    rollouts = write_rollouts(str(tmp_path / "in.jsonl"), make_batch(TokenCaptureStore(store), 3))
    env = {
        **os.environ,
        "PREFECT_API_URL": prefect_api,
        "TOKCAP_HOME": REPO,
        "TOKCAP_INBOX": str(tmp_path / "inbox"),
        "TOKCAP_STORE": store,
        "TOKCAP_DEST": dest,
    }
    pool = prefect(
        ["work-pool", "create", "tokcap-process", "--type", "process", "--overwrite"], env
    )
    assert pool.returncode == 0, pool.stdout + pool.stderr
    deployed = prefect(
        ["--no-prompt", "deploy", "--all", "--prefect-file", "deployments/prefect.yaml"], env
    )
    assert deployed.returncode == 0, deployed.stdout[-3000:] + deployed.stderr[-3000:]

    async def registered() -> dict:
        async with get_client() as client:
            flows = {f.id: f.name for f in await client.read_flows()}
            return {f"{flows[d.flow_id]}/{d.name}": d for d in await client.read_deployments()}

    import asyncio

    deployments = asyncio.run(registered())
    assert set(deployments) >= EXPECTED
    inbox = deployments["finalize-inbox/inbox"]
    assert [s.schedule.cron for s in inbox.schedules] == ["*/10 * * * *"]
    assert inbox.parameters["store"] == store and inbox.parameters["dest"] == dest
    assert deployments["finalize-run/finalize-run-strict"].parameters["max_mask_fraction"] == 0.05

    triggered = prefect(
        [
            "deployment",
            "run",
            "finalize-run/finalize-run",
            "--param",
            f"rollouts={rollouts}",
            "--param",
            "run_id=deployed",
        ],
        env,
    )
    assert triggered.returncode == 0, triggered.stdout + triggered.stderr
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "prefect",
            "worker",
            "start",
            "--pool",
            "tokcap-process",
            "--run-once",
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        output, _ = worker.communicate(timeout=300)
    finally:
        worker.kill()

    async def final_state() -> str:
        async with get_client() as client:
            runs = await client.read_flow_runs()
            mine = [r for r in runs if r.parameters.get("run_id") == "deployed"]
            return mine[0].state.type.value if mine else "MISSING"

    wait_until(
        lambda: asyncio.run(final_state()) in ("COMPLETED", "FAILED", "CRASHED"),
        120,
        "the deployed flow run to finish",
    )
    assert asyncio.run(final_state()) == "COMPLETED", output[-3000:]
    assert len(dest_records(dest, "deployed")) == 3


def test_tokcap_serve_registers_the_scheduled_inbox_deployment(tmp_path, prefect_api: str) -> None:
    env = {**os.environ, "PREFECT_API_URL": prefect_api}
    served = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "flows.cli",
            "serve",
            "--inbox",
            str(tmp_path / "inbox"),
            "--store",
            str(tmp_path / "store"),
            "--dest",
            str(tmp_path / "dest"),
            "--cron",
            "*/5 * * * *",
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    async def inbox_cron() -> list[str]:
        async with get_client() as client:
            flows = {f.id: f.name for f in await client.read_flows()}
            return [
                s.schedule.cron
                for d in await client.read_deployments()
                if flows.get(d.flow_id) == "finalize-inbox"
                and d.name == "inbox"
                and d.parameters.get("inbox") == str(tmp_path / "inbox")
                for s in d.schedules
            ]

    import asyncio

    try:
        wait_until(
            lambda: asyncio.run(inbox_cron()) == ["*/5 * * * *"],
            120,
            "tokcap serve to register its deployments",
        )
    finally:
        served.terminate()
        served.wait(timeout=60)
