"""What `tokcap status` and `tokcap runs` call a run, on a real Prefect server.

A submitted file not started yet is `queued` (exit 3, with JSON), not an unknown run id.
A run held mid-batch by a real `tokcap finalize` is `running` (exit 3, its last heartbeat,
no command to run); once its process is killed and Prefect marks its flow run Crashed (as
the shipped silence automation does), it is `interrupted` (exit 1, naming `tokcap
retrigger`); a Scheduled retrigger naming it makes it `retrigger-scheduled` (exit 3, when it
starts); a retrigger that ended `NeedsAttention` makes it `needs-attention` (exit 1). With
the API unreachable, status says it could not tell whether the run is live. `status --json`
and `runs --json` carry the same `state`.
"""

from __future__ import annotations

from datetime import UTC
from pathlib import Path
from typing import Any

import orjson
import pytest

from capture_core.run.inbox import run_id_for_file
from tests.support.interrupted_run import StalledRun, start_cli
from tests.support.pipeline_helpers import run_cli
from tests.support.prefect_api_reads import crash_running, eventually
from tests.support.prefect_workers import kill_tree
from tests.support.servers import free_port

pytestmark = [pytest.mark.integrity, pytest.mark.usefixtures("prefect_api")]

WAIT, ACT = 3, 1


def status(run: StalledRun, api_url: str | None) -> tuple[int, str, dict[str, Any]]:
    """`tokcap status` of the run: exit code, text, and the JSON `state`'s body."""
    text = run_cli(run.status_args(), api_url)
    as_json = run_cli(run.status_args("--json"), api_url)
    assert as_json.returncode == text.returncode, as_json.stderr
    return text.returncode, text.stdout + text.stderr, orjson.loads(as_json.stdout)


def runs_state(run: StalledRun, api_url: str | None) -> str:
    listed = run_cli(["runs", "--dest", run.dest, "--json"], api_url)
    assert listed.returncode == 0, listed.stderr
    (row,) = [r for r in orjson.loads(listed.stdout)["runs"] if r["run_id"] == run.run_id]
    return row["state"]


def test_a_submitted_file_not_started_is_queued(tmp_path: Path, prefect_api: str) -> None:
    inbox, dest = tmp_path / "inbox", str(tmp_path / "dest")
    inbox.mkdir()
    source = tmp_path / "rollouts.jsonl"
    source.write_bytes(b'{"rollout_id": "a"}\n')
    submitted = run_cli(["submit", "--inbox", str(inbox), str(source)], prefect_api)
    assert submitted.returncode == 0, submitted.stderr  # announced; no deployment takes it
    run_id = run_id_for_file(f"{inbox}/rollouts.jsonl")
    assert f"run id: {run_id}" in submitted.stdout
    args = ["status", "--dest", dest, "--run-id", run_id]
    found = eventually(
        lambda: run_cli([*args, "--json"], prefect_api),
        lambda done: done.returncode == WAIT,
        "status to find the submit event",
        timeout=60,
    )
    body = orjson.loads(found.stdout)
    assert body["state"] == "queued" and "announced" in body["reason"], body
    text = run_cli(args, prefect_api)
    assert text.returncode == WAIT and text.stdout.startswith(f"queued: run {run_id}: "), text
    assert "tokcap retrigger" not in text.stdout
    from_inbox = run_cli([*args, "--inbox", str(inbox), "--json"], None)  # no API: the inbox
    assert from_inbox.returncode == WAIT, from_inbox.stderr
    assert orjson.loads(from_inbox.stdout)["state"] == "queued"
    assert orjson.loads(from_inbox.stdout)["inbox_file"] == f"{inbox}/rollouts.jsonl"
    unknown = run_cli(args, None)
    assert unknown.returncode == 2 and "add --inbox" in unknown.stderr, unknown.stderr


def test_a_run_is_running_then_interrupted_then_retriggered_in_words_and_exit_codes(
    tmp_path: Path, prefect_api: str
) -> None:
    run = StalledRun(tmp_path, "states")
    proc = start_cli(run.finalize_args(), {"PREFECT_API_URL": prefect_api})
    try:
        run.wait_stalled(proc)
        code, text, body = status(run, prefect_api)
        assert code == WAIT and text.startswith(f"running: run {run.run_id}: "), text
        assert "last heartbeat" in text and "tokcap retrigger" not in text, text
        assert body["state"] == "running" and body["flow_run"]["state_type"] == "RUNNING"
        assert runs_state(run, prefect_api) == "running"
    finally:
        kill_tree(proc.pid)
    run.release()
    (crashed,) = crash_running(run.run_id)
    code, text, body = status(run, prefect_api)
    assert code == ACT and text.startswith(f"interrupted: run {run.run_id}: "), text
    assert "nothing is scheduled" in text, text
    assert f"complete it with: {run.completing_command()}" in text, text
    assert body["state"] == "interrupted" and runs_state(run, prefect_api) == "interrupted"

    retrigger = schedule_retrigger(run, crashed, in_seconds=600)
    code, text, body = status(run, prefect_api)
    assert code == WAIT and text.startswith(f"retrigger-scheduled: run {run.run_id}: "), text
    assert "starts at" in text and "(in 5" in text and "complete it with" not in text, text
    assert body["state"] == "retrigger-scheduled" and body["flow_run"]["id"] == retrigger
    assert runs_state(run, prefect_api) == "retrigger-scheduled"

    end_needing_attention(retrigger, run.run_id)
    code, text, body = status(run, prefect_api)
    assert code == ACT and text.startswith(f"needs-attention: run {run.run_id}: "), text
    assert "settings unknown (set by a test)" in text, text
    assert f"complete it with: {run.completing_command()}" in text, text
    assert runs_state(run, prefect_api) == "needs-attention"

    gone = f"http://127.0.0.1:{free_port()}/api"
    code, text, body = status(run, gone)
    assert code == ACT and text.startswith(f"interrupted: run {run.run_id}: "), text
    assert f"could not tell whether it is live: the Prefect API at {gone}" in text, text
    assert f"if nothing runs it, complete it with: {run.completing_command()}" in text, text
    assert runs_state(run, gone) == "interrupted"


def schedule_retrigger(run: StalledRun, crashed: str, in_seconds: float) -> str:
    """A Scheduled run of `retrigger-failed` naming the crashed flow run, as the shipped
    automation creates it (its name not yet the flow's; no worker serves it here); its id."""
    from datetime import datetime, timedelta

    from prefect.client.orchestration import get_client
    from prefect.states import Scheduled

    from tokcap.flows.retrigger import retrigger_failed

    at = datetime.now(UTC) + timedelta(seconds=in_seconds)
    parameters = {"dest": run.dest, "run_id": run.run_id, "store": run.root}
    with get_client(sync_client=True) as client:
        created = client.create_flow_run(
            retrigger_failed,
            name="silver-heron",  # a deployment's run: Prefect's name until it starts
            parameters={**parameters, "failed_run": crashed, "retrigger": 1},
            state=Scheduled(scheduled_time=at),
        )
    return str(created.id)


def end_needing_attention(flow_run_id: str, run_id: str) -> None:
    """The retrigger starts (taking its flow's run name, as the engine renames it) and ends
    `NeedsAttention`, as `retrigger_failed` does for a run it cannot re-run."""
    from uuid import UUID

    from prefect.client.orchestration import get_client
    from prefect.states import Failed

    state = Failed(name="NeedsAttention", message="settings unknown (set by a test)")
    with get_client(sync_client=True) as client:
        client.update_flow_run(UUID(flow_run_id), name=f"retrigger {run_id}")
        client.set_flow_run_state(UUID(flow_run_id), state, force=True)


DECOYS = 400
"""Flow runs whose names contain the run id but are another run's: a lookup capped at 50 by
Prefect's default order (random uuid4 ids) and matching names by substring left the run's
own flow run out in about 7 of 8 commands."""


def test_a_backlog_of_similar_names_cuts_off_no_flow_run(tmp_path: Path, prefect_api: str) -> None:
    from uuid import uuid4

    from prefect.client.orchestration import get_client
    from prefect.states import Completed, Running, Scheduled

    from tokcap.flows.retrigger import retrigger_failed

    run_id = f"backlog-{uuid4().hex[:8]}"
    dest = tmp_path / "dest"
    dest.mkdir()
    base = {"dest": str(dest), "store": str(tmp_path / "store"), "failed_run": "x"}
    with get_client(sync_client=True) as client:
        for i in range(DECOYS):
            client.create_flow_run(
                retrigger_failed,
                name=f"retrigger {run_id}{i}",
                parameters={**base, "run_id": f"{run_id}{i}", "retrigger": 1},
                state=Completed(),  # ended: no other test's waiting runs are crowded out
            )
        mine = client.create_flow_run(
            retrigger_failed,
            name=f"retrigger {run_id}",
            parameters={**base, "run_id": run_id, "retrigger": 1},
            state=Scheduled(),
        )
        client.set_flow_run_state(mine.id, Running(), force=True)
    try:
        args = ["status", "--dest", str(dest), "--run-id", run_id, "--json"]
        found = run_cli(args, prefect_api)
        assert found.returncode == WAIT, found.stdout + found.stderr
        body = orjson.loads(found.stdout)
        assert body["state"] == "retriggering" and body["flow_run"]["id"] == str(mine.id), body
    finally:
        with get_client(sync_client=True) as client:
            client.set_flow_run_state(mine.id, Completed(), force=True)
