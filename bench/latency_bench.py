"""Latency of the event path: from `submit_files` returning to the file's verified handoff.

A real `prefect server start` (SQLite) runs in a subprocess with the whole shipped
`prefect.yaml` deployed on a bench pool, the shipped automations applied, and two process
workers (`--limit 1`, polling every `--poll-seconds`, Prefect's default 10 s). Files are
submitted one at a time through the library call of `tokcap submit`; each is timed until its
run is complete in the destination (handed off, verified and retired: `run_completed`). Also
printed: the triggered run's own duration from its start to its end (so the rest is the
event, the worker's poll and its process start), and the schedule path it replaces (on
average half the 10-minute interval before the run starts, plus the run). Asserts nothing.
Usage: .venv/bin/python -m bench.latency_bench [--files N] [--rollouts R] [--poll-seconds S]
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import orjson

from bench.scaling_bench import (
    FILE_DEPLOYMENT,
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


def workspace(name: str, poll_seconds: float) -> str:
    """A new folder with an inbox, an outbox and a destination, named in the environment
    (`TOKCAP_*`, a Prefect home of its own) for the shipped deployments; returns it."""
    work = tempfile.mkdtemp(prefix=f"tokcap-{name}-bench-")
    for folder in ("inbox", "outbox", "dest"):
        os.makedirs(os.path.join(work, folder))
    os.environ.update(
        PREFECT_HOME=os.path.join(work, "prefect"),
        PREFECT_LOGGING_LEVEL="ERROR",
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_WORKER_QUERY_SECONDS=f"{poll_seconds:g}",
        TOKCAP_INBOX=os.path.join(work, "inbox"),
        TOKCAP_STORE=os.path.join(work, "store"),
        TOKCAP_DEST=os.path.join(work, "dest"),
    )
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
    parser.add_argument(
        "--poll-seconds",
        type=float,
        default=10.0,
        help="PREFECT_WORKER_QUERY_SECONDS of the workers (default 10, Prefect's own)",
    )
    args = parser.parse_args()
    logging.getLogger("capture_core").setLevel(logging.ERROR)
    work = workspace("latency", args.poll_seconds)
    try:
        sources = [write_file(work, i, args.rollouts) for i in range(args.files)]
        print(
            f"{args.files} files x {args.rollouts} rollouts x {SHAPE.turns} calls, submitted one "
            f"at a time; workers poll every {args.poll_seconds:g} s; {os.cpu_count()} cores, "
            f"load average {os.getloadavg()[0]:.1f}"
        )
        with prefect_server(os.environ["PREFECT_HOME"]) as (api, _server):
            os.environ["PREFECT_API_URL"] = api
            env = dict(os.environ)
            deploy(env, work)
            apply_automations(env)
            with Workers(2, env):
                wait_for_workers(2)
                measured = [submit_and_wait(work, source) for source in sources]
                report(measured)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def report(measured: list[tuple[float, str]]) -> None:
    latencies = [seconds for seconds, _ in measured]
    runs = file_runs([run_id for _, run_id in measured])
    durations = [(r.end_time - r.start_time).total_seconds() for r in runs]
    median = statistics.median(latencies)
    run_median = statistics.median(durations) if durations else float("nan")
    schedule = SCHEDULE_SECONDS / 2 + run_median
    print(
        "submit -> verified handoff: median "
        f"{median:.1f} s, min {min(latencies):.1f} s, max {max(latencies):.1f} s"
    )
    print(f"the triggered run itself ({FILE_DEPLOYMENT}), start to end: median {run_median:.1f} s")
    print(
        f"schedule path (mean wait {SCHEDULE_SECONDS / 2:.0f} s + the run): {schedule:.0f} s; "
        f"the event path is {schedule / median:.0f}x faster"
    )
    print("load average (1, 5, 15 min): " + ", ".join(f"{x:.1f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()
