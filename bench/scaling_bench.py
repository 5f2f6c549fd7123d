"""Scale-out: inbox rollouts/s with one process worker and with two, and whether runs overlap.

A real `prefect server start` runs in a subprocess; its CPU time is read with psutil, so the
server's cost per task run and per flow run is measured, not guessed. The shipped
`prefect.yaml` is deployed whole (a copy on the bench's pool). Each configuration finalizes
its own copy of the same inbox (N files of R rollouts, local store and destination):
- one worker / two workers: `prefect worker start --limit 1` each, one inbox run of the
  shipped deployment, which fans out one `inbox-file` run per file through the pool;
  "overlap" says whether two file runs were on workers at the same time (from a worker
  taking each, its process start included, to its end);
- dask (with `--dask`): one process finalizing each file on a two-process Dask cluster;
- plain: the same steps as direct capture_core calls in one process, no Prefect at all.
Server CPU is reported net of its idle rate (services, worker polls) measured just before.
Prints figures and ratios against the one-worker run measured here, and the load average
(the machine may be shared); asserts nothing. `bench.latency_bench` reuses its parts.
Usage: .venv/bin/python -m bench.scaling_bench [--files N] [--rollouts R] [--batch-size B]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import orjson
import psutil

from capture_core.operator.run_status import run_completed
from capture_core.run.inbox import run_id_for_file
from capture_core.storage import open_byte_store
from capture_core.store import TokenCaptureStore
from capture_core.testing.synthetic import RolloutShape, rollout_record, synthetic_rollout

SHAPE = RolloutShape(turns=4, prompt_tokens=128, generated_tokens=32, tool_tokens=16)
POOL = "tokcap-scaling-bench"
INBOX = "finalize-inbox/inbox"
FILE_DEPLOYMENT = "finalize-inbox-file/inbox-file"
WORKER = [sys.executable, "-m", "prefect", "worker", "start", "--pool", POOL, "--limit", "1"]
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.2)


def make_inbox(work: str, files: int, rollouts: int) -> str:
    """Capture `files` x `rollouts` rollouts into `<work>/store` and write `<work>/inbox`."""
    store = TokenCaptureStore(os.path.join(work, "store"))
    os.makedirs(os.path.join(work, "inbox"))
    for f in range(files):
        ids = range(f * rollouts, (f + 1) * rollouts)
        entries = [e for i in ids for e in synthetic_rollout(f"{i}-0", SHAPE)]
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(store.put_now, entries))
        with open(os.path.join(work, "inbox", f"batch-{f:03d}.jsonl"), "wb") as out:
            out.write(b"".join(orjson.dumps(rollout_record(i, 0)) + b"\n" for i in ids))
    return work


@contextlib.contextmanager
def prefect_server(home: str) -> Iterator[tuple[str, psutil.Process]]:
    """`prefect server start` on a free loopback port; yields its API URL and process."""
    from tests.support.servers import free_port

    port = free_port()
    env = {**os.environ, "PREFECT_HOME": home, "PREFECT_UI_ENABLED": "false"}
    command = ["server", "start", "--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "prefect", *command],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    api = f"http://127.0.0.1:{port}/api"

    def healthy() -> bool:
        try:
            return httpx.get(f"{api}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(healthy, 180, "the Prefect server")
        yield api, psutil.Process(proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def cpu_seconds(proc: psutil.Process) -> float:
    """CPU time of a process and all its children (the server runs uvicorn workers)."""
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            times = p.cpu_times()
            total += times.user + times.system
    return total


def task_overhead(server: psutil.Process, tasks: int) -> tuple[float, float]:
    """Client and server milliseconds per task run, from `tasks` no-op tasks in one flow."""
    from prefect import flow, task

    @task
    def nothing(i: int) -> int:
        return i

    @flow
    def many(n: int) -> None:
        for i in range(n):
            nothing(i)

    many(1)
    before, start = cpu_seconds(server), time.perf_counter()
    many(tasks)
    client = time.perf_counter() - start
    return 1000 * client / tasks, 1000 * (cpu_seconds(server) - before) / tasks


class Workers:
    """Process workers on the bench pool, stopped (with everything they started) on exit."""

    def __init__(self, count: int, env: dict[str, str]) -> None:
        self.procs = [
            subprocess.Popen(
                [*WORKER, "--name", f"bench-{n}"],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            for n in range(count)
        ]

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(True)]
                for member in family:
                    member.kill()
                psutil.wait_procs(family, timeout=30)


def run_inbox(work: str, batch_size: int) -> tuple[float, bool]:
    """One fanned-out inbox run on `work`'s inbox: seconds until every file completed, and
    whether two of its file runs overlapped in time."""
    from prefect.deployments import run_deployment

    dest = open_byte_store(os.path.join(work, "dest"))
    inbox = os.path.join(work, "inbox")
    urls = [os.path.join(inbox, name) for name in sorted(os.listdir(inbox))]
    store = os.path.join(work, "store")
    settings = {"inbox": inbox, "store": store, "dest": dest.url, "batch_size": batch_size}
    started = time.perf_counter()
    run_deployment(INBOX, parameters={"settings": settings}, timeout=0)
    wait_for(lambda: all(run_completed(dest, run_id_for_file(u)) for u in urls), 3600, "the inbox")
    seconds = time.perf_counter() - started
    return seconds, overlapped([run_id_for_file(u) for u in urls])


def file_runs(run_ids: list[str]) -> list[object]:
    """The finished `inbox-file` flow runs of these run ids."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterName

    name = FILE_DEPLOYMENT.split("/")[1]
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=[name])), limit=200
        )
    return [r for r in runs if r.parameters.get("run_id") in run_ids and r.end_time]


def taken_at(flow_run: object) -> object:
    """When a worker took the run (its first Pending state), so its process start counts."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        states = client.read_flow_run_states(flow_run.id)
    pending = [s.timestamp for s in states if s.name == "Pending"]
    return min(pending) if pending else flow_run.start_time


def overlapped(run_ids: list[str]) -> bool:
    """Whether any two file runs of these run ids were on workers at the same time, from
    a worker taking each (its process start included) to its end."""
    spans = sorted((taken_at(r), r.end_time) for r in file_runs(run_ids))
    return any(b[0] < a[1] for a, b in itertools.pairwise(spans))


def run_dask(work: str, batch_size: int) -> float:
    """Finalize each inbox file in this process, its batches on a two-process Dask cluster."""
    from distributed import LocalCluster
    from prefect_dask import DaskTaskRunner

    from tokcap.flows.finalize import finalize_run

    inbox = os.path.join(work, "inbox")
    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None) as cluster:
        flow = finalize_run.with_options(
            task_runner=DaskTaskRunner(address=cluster.scheduler_address)
        )
        started = time.perf_counter()
        for name in sorted(os.listdir(inbox)):
            url = os.path.join(inbox, name)
            locations = (os.path.join(work, "store"), os.path.join(work, "dest"))
            flow(url, *locations, run_id_for_file(url), batch_size=batch_size)
        return time.perf_counter() - started


def wait_for_workers(count: int) -> None:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        wait_for(
            lambda: (
                sum(w.status.value == "ONLINE" for w in client.read_workers_for_work_pool(POOL))
                >= count
            ),
            180,
            f"{count} workers to come online",
        )


def bench_yaml(directory: str) -> str:
    """The shipped `prefect.yaml` with every deployment on the bench's pool."""
    import yaml

    from tokcap.flows.serve import prefect_file

    spec = yaml.safe_load(prefect_file().read_text())
    for deployment in spec["deployments"]:
        deployment["work_pool"]["name"] = POOL
    path = os.path.join(directory, "prefect.yaml")
    with open(path, "w") as out:
        yaml.safe_dump(spec, out, sort_keys=False)
    return path


def deploy(env: dict[str, str], directory: str) -> None:
    """Deploy every deployment of the shipped file onto the bench pool."""
    prefect = [sys.executable, "-m", "prefect"]
    for args in (
        ["work-pool", "create", POOL, "--type", "process", "--overwrite"],
        ["--no-prompt", "deploy", "--all", "--prefect-file", bench_yaml(directory)],
    ):
        subprocess.run(
            [*prefect, *args], env=env, cwd=directory, check=True, capture_output=True, timeout=300
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--rollouts", type=int, default=150, help="rollouts per file")
    parser.add_argument("--batch-size", type=int, default=50)
    parser.add_argument("--dask", action="store_true", help="also measure a Dask cluster")
    args = parser.parse_args()
    logging.getLogger("capture_core").setLevel(logging.ERROR)
    work = tempfile.mkdtemp(prefix="tokcap-scaling-bench-")
    os.environ.update(
        DASK_LOGGING__DISTRIBUTED="error",
        PREFECT_HOME=os.path.join(work, "prefect"),
        PREFECT_LOGGING_LEVEL="ERROR",
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_WORKER_QUERY_SECONDS="1",
        TOKCAP_INBOX=work,
        TOKCAP_STORE=work,
        TOKCAP_DEST=work,
    )
    try:
        template = make_inbox(os.path.join(work, "template"), args.files, args.rollouts)
        for side in ("one", "two", "dask", "plain"):
            shutil.copytree(template, os.path.join(work, side))
        total = args.files * args.rollouts
        print(
            f"inbox: {args.files} files x {args.rollouts} rollouts x {SHAPE.turns} calls, "
            f"batch size {args.batch_size}, {os.cpu_count()} cores, load average "
            f"{os.getloadavg()[0]:.1f}"
        )
        with prefect_server(os.environ["PREFECT_HOME"]) as (api, server):
            os.environ["PREFECT_API_URL"] = api
            measure(server, dict(os.environ), work, total, args.batch_size, args.dask)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def idle_cpu_rate(server: psutil.Process, seconds: float = 5.0) -> float:
    """Server CPU seconds per second while nothing runs (its services and the worker polls)."""
    before = cpu_seconds(server)
    time.sleep(seconds)
    return (cpu_seconds(server) - before) / seconds


def run_plain(work: str, batch_size: int) -> float:
    """Every inbox file through direct capture_core calls, one after the other."""
    from bench.pipeline_bench import plain_run

    inbox = os.path.join(work, "inbox")
    started = time.perf_counter()
    for name in sorted(os.listdir(inbox)):
        url = os.path.join(inbox, name)
        locations = (os.path.join(work, "store"), os.path.join(work, "dest"))
        plain_run(url, *locations, run_id_for_file(url), batch_size)
    return time.perf_counter() - started


def measure(
    server: psutil.Process, env: dict[str, str], work: str, total: int, batch: int, dask: bool
) -> None:
    client_ms, server_ms = task_overhead(server, 200)
    print(f"per task run: {client_ms:.1f} ms in the flow process, {server_ms:.1f} ms server CPU")
    deploy(env, work)
    results: dict[str, tuple[float, float]] = {}
    overlaps: dict[str, bool] = {}
    for side, workers in (("one", 1), ("two", 2)):
        with Workers(workers, env):
            wait_for_workers(workers)
            idle = idle_cpu_rate(server)
            before = cpu_seconds(server)
            seconds, overlaps[side] = run_inbox(f"{work}/{side}", batch)
            results[side] = (seconds, cpu_seconds(server) - before - idle * seconds)
    if dask:
        idle = idle_cpu_rate(server)
        before = cpu_seconds(server)
        seconds = run_dask(f"{work}/dask", batch)
        results["dask"] = (seconds, cpu_seconds(server) - before - idle * seconds)
    results["plain"] = (run_plain(f"{work}/plain", batch), 0.0)
    report(results, total, overlaps)


def report(results: dict[str, tuple[float, float]], total: int, overlaps: dict[str, bool]) -> None:
    base = total / results["one"][0]
    labels = {
        "one": "one process worker",
        "two": "two process workers",
        "dask": "one process, Dask (2 procs)",
        "plain": "plain calls, no Prefect",
    }
    for side, (seconds, cpu) in results.items():
        rate = total / seconds
        overlap = (
            f"  runs overlapped: {'yes' if overlaps[side] else 'no'}" if side in overlaps else ""
        )
        print(
            f"{labels[side]:<28} {seconds:6.1f} s  {rate:7.1f} rollouts/s  "
            f"{rate / base:.2f}x one worker  server CPU {1000 * cpu / total:.2f} ms/rollout"
            + overlap
        )
    print("load average (1, 5, 15 min): " + ", ".join(f"{x:.1f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()
