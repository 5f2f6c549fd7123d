"""Recovery from a killed worker: from the SIGKILL to the file's verified handoff, unattended.

A real `prefect server start` (SQLite) runs in a subprocess with the shipped `prefect.yaml`
deployed on a bench pool (its inbox settings as shipped, but `--batch-size`, so a file has
several batches) and the shipped automations applied; one process worker with `--limit 1`
(as deployments/README.md starts it) polls every `--poll-seconds` (Prefect's default 10 s).
No inbox schedule runs: the pass is deleted, so only the automations can finish the file.
First one file runs alone: a run's own time. Per repetition a file is submitted; once its
run handed off its first batch, the worker and the flow-run process are SIGKILLed (a new
worker replaces it) and a second file is submitted at once ("right after the kill"); a
third is submitted once the killed file's retrigger started ("meanwhile"). Timed from the
kill: the run marked Crashed (heartbeats every 30 s, 90 s of silence), the retrigger
started (a minute later), the killed file complete (handed off and retired:
`run_completed`; its claim lapses `claim_lease_seconds` after the kill, 300 s as shipped,
or `--lease`); and each other file from its submit to its completion, beside the run's own
time: a retrigger that held the only worker while the claim lapsed delays them. Asserts
nothing.
Usage: .venv/bin/python -m bench.zombie_bench [--reps N] [--rollouts R] [--batch-size B]
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import statistics
import subprocess
import sys
import time
from datetime import datetime
from typing import Any

import psutil
import yaml

from bench.latency_bench import apply_automations, submit_and_wait, workspace, write_file
from bench.scaling_bench import (
    INBOX,
    POOL,
    WORKER,
    prefect_server,
    wait_for,
    wait_for_workers,
)
from capture_core.operator.run_status import run_completed
from capture_core.storage import open_byte_store

FILE_DEPLOYMENT, RETRIGGERS = "inbox-file", "retrigger-failed"


def bench_yaml(directory: str, batch_size: int, lease: float) -> str:
    """The shipped `prefect.yaml` on the bench's pool, with this batch size and lease."""
    from tokcap.flows.serve import prefect_file

    spec = yaml.safe_load(prefect_file().read_text())
    for deployment in spec["deployments"]:
        deployment["work_pool"]["name"] = POOL
        settings = deployment["parameters"].get("settings")
        if settings is not None:
            settings.update(batch_size=batch_size, claim_lease_seconds=lease)
    path = os.path.join(directory, "prefect.yaml")
    with open(path, "w") as out:
        yaml.safe_dump(spec, out, sort_keys=False)
    return path


def deploy(env: dict[str, str], work: str, batch_size: int, lease: float) -> None:
    """Deploy the file onto the bench pool; delete the scheduled inbox pass."""
    from prefect.client.orchestration import get_client

    for args in (
        ["work-pool", "create", POOL, "--type", "process", "--overwrite"],
        ["--no-prompt", "deploy", "--all", "--prefect-file", bench_yaml(work, batch_size, lease)],
    ):
        subprocess.run(
            [sys.executable, "-m", "prefect", *args],
            env=env,
            cwd=work,
            check=True,
            capture_output=True,
            timeout=300,
        )
    with get_client(sync_client=True) as client:
        client.delete_deployment(client.read_deployment_by_name(INBOX).id)


class Workers:
    """Process workers on the bench pool; a killed one is replaced, all stop on exit."""

    def __init__(self, count: int, env: dict[str, str]) -> None:
        self.env, self.procs = env, []
        for _ in range(count):
            self.start()

    def start(self) -> None:
        name = f"zombie-{len(self.procs)}"
        self.procs.append(
            subprocess.Popen(
                [*WORKER, "--name", name],
                env=self.env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        )

    def kill_busy(self) -> None:
        """SIGKILL the worker running a flow run (the one with a child) and that run's
        process, as a machine dying would; start a replacement."""
        for proc in self.procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                if proc.poll() is None and psutil.Process(proc.pid).children(recursive=True):
                    kill_tree(proc.pid)
                    self.start()
                    return
        raise RuntimeError("no worker is running a flow run")

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            kill_tree(proc.pid)


def kill_tree(pid: int) -> None:
    """SIGKILL a process and everything it started."""
    with contextlib.suppress(psutil.NoSuchProcess):
        family = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
        for member in family:
            with contextlib.suppress(psutil.NoSuchProcess):
                member.kill()
        psutil.wait_procs(family, timeout=30)


def runs_of(deployment: str, run_id: str) -> list[Any]:
    """The flow runs of a deployment of the bench pool for this run id."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterName

    with get_client(sync_client=True) as client:
        found = client.read_flow_runs(
            deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=[deployment])),
            limit=200,
        )
    return [r for r in found if r.parameters.get("run_id") == run_id]


def kill_mid_file(work: str, sources: list[str], workers: Workers) -> dict[str, float]:
    """Submit, kill the run's worker after its first receipt, submit a file right after the
    kill and one once the retrigger started; seconds from the kill to each step of the
    recovery, and from each other file's submit to its completion."""
    from tokcap.flows.submit import submit_files
    from tokcap.tasks.receipts import list_receipt_keys

    killed_file, after_kill, meanwhile = sources
    (submitted,) = submit_files(os.path.join(work, "inbox"), [killed_file])
    assert submitted.announced, "the bench's server did not accept the event"
    dest, run_id = os.path.join(work, "dest"), submitted.run_id
    wait_for(lambda: list_receipt_keys(dest, run_id, None), 600, "the first receipt")
    workers.kill_busy()
    killed, killed_at = time.perf_counter(), datetime.now().astimezone()
    next_file, _ = submit_and_wait(work, after_kill)
    started = lambda: [r for r in runs_of(RETRIGGERS, run_id) if r.start_time]  # noqa: E731
    wait_for(lambda: bool(started()), 1800, f"the retrigger of {run_id} to start")
    waiting_file, _ = submit_and_wait(work, meanwhile)
    done = open_byte_store(dest)
    wait_for(lambda: run_completed(done, run_id), 1800, f"{run_id} to complete")
    complete = time.perf_counter() - killed
    (original,) = runs_of(FILE_DEPLOYMENT, run_id)
    first = min(started(), key=lambda r: r.start_time)
    assert original.state.is_crashed(), original.state
    return {
        "crashed": (original.state.timestamp - killed_at).total_seconds(),
        "retrigger started": (first.start_time - killed_at).total_seconds(),
        "complete": complete,
        "file submitted right after the kill: submit -> complete": next_file,
        "file submitted once the retrigger started: submit -> complete": waiting_file,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--rollouts", type=int, default=200, help="rollouts per file")
    parser.add_argument("--batch-size", type=int, default=50)
    parser.add_argument("--lease", type=float, default=300.0, help="claim_lease_seconds")
    parser.add_argument("--poll-seconds", type=float, default=10.0)
    args = parser.parse_args()
    logging.getLogger("capture_core").setLevel(logging.ERROR)
    work = workspace("zombie", args.poll_seconds)
    try:
        sources = [write_file(work, i, args.rollouts, "zombie") for i in range(3 * args.reps + 1)]
        print(
            f"{args.reps} files x {args.rollouts} rollouts, batches of {args.batch_size}, claim "
            f"lease {args.lease:g} s, workers poll every {args.poll_seconds:g} s; "
            f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}"
        )
        with prefect_server(os.environ["PREFECT_HOME"]) as (api, _server):
            os.environ["PREFECT_API_URL"] = api
            deploy(dict(os.environ), work, args.batch_size, args.lease)
            apply_automations(dict(os.environ))
            with Workers(1, dict(os.environ)) as running:
                wait_for_workers(1)
                alone, _ = submit_and_wait(work, sources[0])
                print(f"a file alone, submit -> complete (a run's own time): {alone:.0f} s")
                measured = []
                for rep in range(args.reps):
                    files = sources[1 + 3 * rep : 4 + 3 * rep]
                    measured.append(kill_mid_file(work, files, running))
                    print(", ".join(f"{k} {v:.0f} s" for k, v in measured[-1].items()))
                report(measured)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def report(measured: list[dict[str, float]]) -> None:
    for step in measured[0]:
        values = [m[step] for m in measured]
        name = step if ":" in step else f"kill -> {step}"
        print(
            f"{name}: median {statistics.median(values):.0f} s, "
            f"min {min(values):.0f} s, max {max(values):.0f} s"
        )
    print("load average (1, 5, 15 min): " + ", ".join(f"{x:.1f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()
