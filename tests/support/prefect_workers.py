"""Real Prefect process workers and `prefect` CLI calls for tests that deploy the shipped file."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterName

PREFECT = (sys.executable, "-m", "prefect")


def prefect_cli(args: list[str], env: dict[str, str], cwd: Path) -> str:
    """Run `prefect ARGS`; its stdout, or fail with the end of its output."""
    done = subprocess.run(
        [*PREFECT, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def start_worker(pool: str, name: str, env: dict[str, str], cwd: Path) -> subprocess.Popen:
    """`prefect worker start` on `pool`, one flow run at a time, logging to `worker-NAME.log`."""
    log = open(cwd / f"worker-{name}.log", "wb")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(
        [*PREFECT, "worker", "start", "--pool", pool, "--limit", "1", "--name", f"worker-{name}"],
        cwd=cwd,
        env={**env, "PREFECT_LOGGING_LEVEL": "INFO"},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def kill_tree(pid: int) -> None:
    """SIGKILL a process and everything it started, as a machine dying would."""
    try:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.send_signal(signal.SIGKILL)
    psutil.wait_procs(procs, timeout=30)


def deployment_runs(deployment: str, run_id: str) -> list[Any]:
    """The flow runs of one deployment (`flow/name`) whose `run_id` parameter is `run_id`."""
    name = deployment.split("/")[1]
    with get_client(sync_client=True) as client:
        found = client.read_flow_runs(
            deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=[name])), limit=200
        )
    return [r for r in found if r.parameters.get("run_id") == run_id]


def all_final(runs: list[Any]) -> bool:
    """Whether there are runs and every one of them ended."""
    return bool(runs) and all(r.state is not None and r.state.is_final() for r in runs)
