"""Latency of the event path: from `submit_files` returning to the file's verified handoff.

A real `prefect server start` (SQLite) runs in a subprocess with the whole shipped
`prefect.yaml` deployed on a bench pool, the shipped automations applied, and `--workers`
process workers (`--limit 1`, polling every `--poll-seconds`, by default the shipped
`PREFECT_WORKER_QUERY_SECONDS` of deployments/Dockerfile). Files are submitted one at a time
through the library call of `tokcap submit`; each is timed until its run is complete in the
destination (handed off, verified and retired: `run_completed`). The time is broken down from
the triggered run's state history (Prefect API): the event to the run's creation (the
automation), creation to Pending (the worker's poll), Pending to Running (the flow run's
process start, its imports and the flow's load), Running to the handoff seen (the task runs'
own time, and the rest: flow and task orchestration), with the imports of the flow's
entrypoint timed apart in a fresh process. Also printed: the schedule path it replaces (on
average half the 10-minute interval before the run starts, plus the run). Asserts nothing.
Usage: .venv/bin/python -m bench.latency_bench [--files N] [--rollouts R] [--workers W]
       [--poll-seconds S]
"""

from __future__ import annotations

import argparse
import logging
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import orjson

from bench.scaling_bench import (
    SHAPE,
    Workers,
    deploy,
    file_runs,
    prefect_server,
    wait_for,
    wait_for_workers,
)
from capture_core.operator.run_status import run_completed
from capture_core.storage import open_byte_store
from capture_core.store import TokenCaptureStore
from capture_core.testing.synthetic import rollout_record, synthetic_rollout

SCHEDULE_SECONDS = 600  # the shipped inbox cron: */10 * * * *


def workspace(name: str, poll_seconds: float | None = None) -> str:
    """A new folder with an inbox, an outbox and a destination, named in the environment
    (`TOKCAP_*`, a Prefect home of its own) for the shipped deployments; returns it."""
    work = tempfile.mkdtemp(prefix=f"tokcap-{name}-bench-")
    for folder in ("inbox", "outbox", "dest"):
        os.makedirs(os.path.join(work, folder))
    os.environ.update(
        PREFECT_HOME=os.path.join(work, "prefect"),
        PREFECT_LOGGING_LEVEL="ERROR",
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        TOKCAP_INBOX=os.path.join(work, "inbox"),
        TOKCAP_STORE=os.path.join(work, "store"),
        TOKCAP_DEST=os.path.join(work, "dest"),
    )
    if poll_seconds is not None:
        os.environ["PREFECT_WORKER_QUERY_SECONDS"] = f"{poll_seconds:g}"
    return work


def write_file(work: str, index: int, rollouts: int, name: str = "latency") -> str:
    """Capture `rollouts` rollouts and write their rollout file outside the inbox."""
    store = TokenCaptureStore(os.path.join(work, "store"))
    ids = range(index * rollouts, (index + 1) * rollouts)
    entries = [e for i in ids for e in synthetic_rollout(f"{i}-0", SHAPE)]
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(store.put_now, entries))
    path = os.path.join(work, "outbox", f"{name}-{index:03d}.jsonl")
    with open(path, "wb") as out:
        out.write(b"".join(orjson.dumps(rollout_record(i, 0)) + b"\n" for i in ids))
    return path


def submit_and_wait(work: str, source: str) -> tuple[float, str]:
    """Seconds from `submit_files` returning to the run's completion, and the run id."""
    from tokcap.flows.submit import submit_files

    (submitted,) = submit_files(os.path.join(work, "inbox"), [source])
    assert submitted.announced, "the bench's server did not accept the event"
    returned = time.perf_counter()
    dest = open_byte_store(os.path.join(work, "dest"))
    wait_for(lambda: run_completed(dest, submitted.run_id), 900, f"{source} to be handed off")
    return time.perf_counter() - returned, submitted.run_id


def submit_and_time(work: str, source: str) -> Timeline:
    """`submit_and_wait`, then wait for the file's flow run to end; its timeline."""
    seconds, run_id = submit_and_wait(work, source)
    seen = time.time()
    return timeline(wait_for_end(run_id), seen - seconds, seen)


@dataclass(frozen=True)
class Timeline:
    """One file's seconds from submit to handoff, by phase (wall clock of one machine)."""

    total: float  # submit returned -> handoff seen in the destination
    event: float  # submit returned -> the automation created the flow run
    poll: float  # created -> Pending: a worker's poll took it
    start: float  # Pending -> Running: process start, imports, the flow's load
    in_tasks: float  # Running -> handoff seen, inside task runs (the work and its engine)
    orchestration: float  # Running -> handoff seen, outside task runs: flows, subflow, states
    tail: float  # handoff seen -> the flow run Completed (not counted in `total`)


def wait_for_end(run_id: str) -> Any:
    """The file's `inbox-file` flow run once it is in a final state (so the next file finds
    its worker waiting)."""
    found: list[Any] = []

    def ended() -> bool:
        found[:] = file_runs([run_id])
        return bool(found)

    wait_for(ended, 300, f"the flow run of {run_id} to end")
    return found[0]


def timeline(flow_run: Any, submitted: float, seen: float) -> Timeline:
    """The phases of one file's latency, from its flow run's states and its task runs."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        states = client.read_flow_run_states(flow_run.id)
        ordered = sorted(states, key=lambda state: state.timestamp)
        stamps: dict[str, float] = {}
        for state in ordered:  # the first of each name
            stamps.setdefault(state.name, state.timestamp.timestamp())
        spans = task_spans(client, flow_run.id)
    created = flow_run.created.timestamp()
    pending, running = stamps.get("Pending", created), stamps.get("Running", created)
    in_tasks = covered(spans, running, seen)
    return Timeline(
        total=seen - submitted,
        event=created - submitted,
        poll=pending - created,
        start=running - pending,
        in_tasks=in_tasks,
        orchestration=seen - running - in_tasks,
        tail=flow_run.end_time.timestamp() - seen,
    )


def task_spans(client: Any, flow_run_id: Any) -> list[tuple[float, float]]:
    """(start, end) of every task run of the flow run and of its subflows (`finalize_run`)."""
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterParentFlowRunId,
        TaskRunFilter,
        TaskRunFilterFlowRunId,
    )

    children = client.read_flow_runs(
        flow_run_filter=FlowRunFilter(
            parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[flow_run_id])
        )
    )
    ids = [flow_run_id, *(c.id for c in children)]
    runs = client.read_task_runs(
        task_run_filter=TaskRunFilter(flow_run_id=TaskRunFilterFlowRunId(any_=ids))
    )
    return [
        (r.start_time.timestamp(), r.end_time.timestamp())
        for r in runs
        if r.start_time is not None and r.end_time is not None
    ]


def covered(spans: list[tuple[float, float]], low: float, high: float) -> float:
    """Seconds of [low, high] inside at least one span (task runs may overlap)."""
    total, reach = 0.0, low
    for start, end in sorted(spans):
        start, end = max(start, reach), min(end, high)
        if end > start:
            total += end - start
            reach = end
    return total


def import_seconds(module: str, repeats: int = 3) -> tuple[float, float]:
    """Median wall and CPU seconds of a fresh interpreter importing `module` (a flow run's
    start imports Prefect's flow engine and the flow's entrypoint module); CPU time says
    what the import costs on a shared machine, wall time what it took."""
    walls, cpus = [], []
    for _ in range(repeats):
        before, started = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
        subprocess.run([sys.executable, "-c", f"import {module}"], check=True, timeout=120)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        walls.append(time.perf_counter() - started)
        cpus.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return statistics.median(walls), statistics.median(cpus)


def apply_automations(env: dict[str, str]) -> None:
    subprocess.run(
        [sys.executable, "-m", "tokcap.flows.cli", "automations", "apply"],
        env=env,
        check=True,
        capture_output=True,
        timeout=300,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--files", type=int, default=6)
    parser.add_argument("--rollouts", type=int, default=50, help="rollouts per file")
    parser.add_argument("--workers", type=int, default=2, help="process workers (default 2)")
    parser.add_argument(
        "--poll-seconds",
        type=float,
        default=None,
        help="PREFECT_WORKER_QUERY_SECONDS of the workers (default: the shipped "
        "tokcap.flows.serve.WORKER_QUERY_SECONDS; Prefect's own is 10)",
    )
    args = parser.parse_args()
    logging.getLogger("capture_core").setLevel(logging.ERROR)
    work = workspace("latency")
    try:
        sources = [write_file(work, i, args.rollouts) for i in range(args.files)]
        with prefect_server(os.environ["PREFECT_HOME"]) as (api, _server):
            os.environ["PREFECT_API_URL"] = api
            poll = poll_seconds(args.poll_seconds)
            print(
                f"{args.files} files x {args.rollouts} rollouts x {SHAPE.turns} calls, submitted "
                f"one at a time to {args.workers} waiting workers polling every {poll:g} s; "
                f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}"
            )
            env = dict(os.environ)
            deploy(env, work)
            apply_automations(env)
            with Workers(args.workers, env):
                wait_for_workers(args.workers)
                measured = [submit_and_time(work, source) for source in sources]
        report(measured)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def poll_seconds(given: float | None) -> float:
    """The workers' poll: `given`, else the shipped one; set in the environment they get.
    Imported only now: Prefect reads `PREFECT_API_URL` and `PREFECT_HOME` once, on import."""
    poll = given
    if poll is None:
        from tokcap.flows.serve import WORKER_QUERY_SECONDS

        poll = WORKER_QUERY_SECONDS
    os.environ["PREFECT_WORKER_QUERY_SECONDS"] = f"{poll:g}"
    return poll


PHASES = {
    "event": "submit returned -> flow run created (the automation)",
    "poll": "created -> Pending (a worker's poll)",
    "start": "Pending -> Running (process start, imports, flow load)",
    "orchestration": "Running -> handoff, outside task runs (flows, subflow, states)",
    "in_tasks": "Running -> handoff, inside task runs (the work and its task engine)",
    "tail": "handoff -> flow run Completed (after the figure, not in it)",
}


def report(measured: list[Timeline]) -> None:
    latencies = [t.total for t in measured]
    median = statistics.median(latencies)
    schedule = SCHEDULE_SECONDS / 2 + median
    print(
        "submit -> verified handoff: median "
        f"{median:.1f} s, min {min(latencies):.1f} s, max {max(latencies):.1f} s"
    )
    print("where it goes, median (min-max) per file:")
    for phase, label in PHASES.items():
        values = [getattr(t, phase) for t in measured]
        print(
            f"  {label:<66} {statistics.median(values):5.2f} s "
            f"({min(values):.2f}-{max(values):.2f})"
        )
    for label, modules in (
        ("Prefect's flow engine", "prefect.flow_engine"),
        ("with the flow's module", "prefect.flow_engine, tokcap.flows.inbox"),
    ):
        wall, cpu = import_seconds(modules)
        print(f"imports in a fresh process, {label} ({modules}): {wall:.2f} s, CPU {cpu:.2f} s")
    print(
        f"schedule path (mean wait {SCHEDULE_SECONDS / 2:.0f} s + the same run): {schedule:.0f} s;"
        f" the event path is {schedule / median:.0f}x faster"
    )
    print("load average (1, 5, 15 min): " + ", ".join(f"{x:.1f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()
