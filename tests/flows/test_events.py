"""The event path on real parts: the shipped deployments and automations on the session's
Prefect server, two real process workers, the capture store on the moto S3 server behind a
fault proxy that can make it unreachable.

The file is deployed once per module from a copy of the shipped `prefect.yaml` that differs
only in the work pool's name, the S3 endpoint (`storage_options`) and a 3-second retrigger
delay in place of 60. `tokcap submit` places files and announces them; the deployment
triggers start their runs; nothing here starts a finalize run by hand. Every wait is a
deadline on something observable (a ledger, a flow run's state).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import orjson
import pytest
import yaml
from prefect.client.orchestration import get_client
from prefect.deployments import run_deployment

from capture_core.operator.run_status import run_completed
from capture_core.run.inbox import run_id_for_file
from capture_core.storage import open_byte_store
from capture_core.store import TokenCaptureStore
from tests.conftest import make_bucket
from tests.support.fault_proxy import FaultPlan, fault_proxy
from tests.support.pipeline_helpers import REPO, dest_records, make_batch, rollout_ids, run_cli
from tests.support.prefect_workers import (
    all_final,
    deployment_runs,
    kill_tree,
    prefect_cli,
    start_worker,
)
from tests.support.reliability_figures import record_case
from tests.support.servers import wait_until
from tests.support.shipped_triggers import remove_deployed, shipped_automation_names
from tokcap.flows.alerts import MASK_ALERT
from tokcap.flows.finalize import finalize_run
from tokcap.tasks.receipts import list_receipt_keys

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_api")]

POOL = "tokcap-events"
RUN_DEADLINE = 300


def module_yaml(proxy: str, directory: Path) -> Path:
    """The shipped file with this module's pool, S3 endpoint and a short retrigger delay."""
    spec = yaml.safe_load(Path(REPO, "deployments", "prefect.yaml").read_text())
    for deployment in spec["deployments"]:
        deployment["work_pool"]["name"] = POOL
        parameters = deployment["parameters"]
        for holder in (parameters, parameters.get("settings") or {}):  # the inbox's settings
            if "store" in holder:
                holder["storage_options"] = {"endpoint_url": proxy}
        for trigger in deployment.get("triggers") or []:
            if trigger.get("schedule_after"):
                trigger["schedule_after"] = 3
    path = directory / "prefect.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def event_path(
    tmp_path_factory: pytest.TempPathFactory, prefect_api: str, s3_endpoint: str, s3_options
) -> Iterator[dict[str, Any]]:
    """Deployed shipped file, applied automations, two workers; the store behind a proxy."""
    home = tmp_path_factory.mktemp("events")
    plan = FaultPlan(rate=0.0, kinds=("drop-before",))
    with fault_proxy(s3_endpoint, plan) as proxy:
        store = f"s3://{make_bucket(s3_options)}/captures"
        inbox, dest, sources = home / "inbox", home / "dest", home / "sources"
        for folder in (inbox, dest, sources):
            folder.mkdir()
        env = {
            **os.environ,
            "PREFECT_API_URL": prefect_api,
            "PREFECT_WORKER_QUERY_SECONDS": "1",
            "TOKCAP_INBOX": str(inbox),
            "TOKCAP_STORE": store,
            "TOKCAP_DEST": str(dest),
        }
        prefect_cli(["work-pool", "create", POOL, "--type", "process", "--overwrite"], env, home)
        deploy = ["--no-prompt", "deploy", "--all", "--prefect-file", str(module_yaml(proxy, home))]
        prefect_cli(deploy, env, home)
        applied = run_cli(["automations", "apply"], prefect_api)
        assert applied.returncode == 0, applied.stderr
        workers = [start_worker(POOL, name, env, home) for name in ("a", "b")]
        try:
            yield {
                "inbox": str(inbox),
                "dest": str(dest),
                "sources": sources,
                "store": store,
                "capture_store": TokenCaptureStore(store, s3_options),
                "plan": plan,
                "env": env,
                "home": home,
                "api": prefect_api,
                "applied": applied.stdout,
            }
        finally:
            for worker in workers:
                kill_tree(worker.pid)
            remove_deployed(POOL)


def rollout_file(paths: dict[str, Any], name: str, task: int, count: int, **kwargs: Any) -> str:
    """Capture `count` rollouts of `task` in the store and write their rollout file."""
    records = make_batch(paths["capture_store"], count, task=task, **kwargs)
    path = paths["sources"] / name
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    return str(path)


def inbox_url(paths: dict[str, Any], source: str) -> str:
    return f"{paths['inbox']}/{os.path.basename(source)}"


def submit(paths: dict[str, Any], *sources: str):
    return run_cli(["submit", "--inbox", paths["inbox"], *sources], paths["api"])


def wait_finished(deployment: str, run_ids: list[str], what: str) -> None:
    """Wait until every run id has a run of the deployment and all of them ended."""
    wait_until(
        lambda: all(all_final(deployment_runs(deployment, r)) for r in run_ids),
        RUN_DEADLINE,
        what,
        0.5,
    )


def wait_completed(paths: dict[str, Any], run_ids: list[str], what: str) -> None:
    dest = open_byte_store(paths["dest"])
    wait_until(lambda: all(run_completed(dest, r) for r in run_ids), RUN_DEADLINE, what, 0.5)


def events_named(name: str) -> list[dict[str, Any]]:
    with get_client(sync_client=True) as client:
        body = {"filter": {"event": {"name": [name]}}, "limit": 50}
        return client.request("POST", "/events/filter", json=body).json()["events"]


def handed_off_once(paths: dict[str, Any], run_id: str, ids: list[str], batches: int) -> None:
    dest = open_byte_store(paths["dest"])
    assert sorted(rollout_ids(dest_records(paths["dest"], run_id))) == sorted(ids)
    assert len(dest.list_prefix(f"{run_id}/records")) == batches, "one part per batch"
    assert len(list_receipt_keys(paths["dest"], run_id, None)) == batches, "one receipt each"


def test_deploying_and_applying_creates_every_shipped_automation(event_path) -> None:
    wide = {**event_path["env"], "COLUMNS": "400"}  # the table cuts names to fit the width
    listed = prefect_cli(["automation", "ls"], wide, event_path["home"])
    for name in shipped_automation_names():
        assert name in listed, f"{name} is listed by prefect automation ls"
    assert "concurrency limit: tokcap-store-requests = 64" in event_path["applied"]
    with get_client(sync_client=True) as client:
        limit = client.read_global_concurrency_limit_by_name("tokcap-store-requests")
    assert limit.limit == 64 and limit.active


def test_submitted_files_are_finalized_by_their_triggered_runs_two_at_once(event_path) -> None:
    first = rollout_file(event_path, "sub-one.jsonl", 31, 2, masked={0, 1})
    second = rollout_file(event_path, "sub-two.jsonl", 32, 2)
    done = submit(event_path, first, second)
    assert done.returncode == 0, done.stderr
    run_ids = [run_id_for_file(inbox_url(event_path, s)) for s in (first, second)]
    assert done.stdout.splitlines() == [f"run id: {r}" for r in run_ids]
    wait_completed(event_path, run_ids, "both submitted files to be handed off and retired")
    handed_off_once(event_path, run_ids[0], ["31-0", "31-1"], 1)
    handed_off_once(event_path, run_ids[1], ["32-0", "32-1"], 1)
    wait_finished("finalize-inbox-file/inbox-file", run_ids, "both triggered runs to end")
    runs = [deployment_runs("finalize-inbox-file/inbox-file", r) for r in run_ids]
    assert [len(r) for r in runs] == [1, 1], "one triggered run per submitted file"
    (one,), (two,) = runs
    assert one.state.is_completed() and two.state.is_completed()
    assert at_once(one, two), "the two workers finalized the two files at the same time"
    wait_until(
        lambda: any(
            e["resource"]["prefect.resource.id"] == f"tokcap.run.{run_ids[0]}"
            for e in events_named(MASK_ALERT)
        ),
        60,
        "the all-masked run's alert event",
    )
    wait_until(
        lambda: any(
            "tokcap-mask-fraction-alert" in str(e)
            for e in events_named("prefect.automation.triggered")
        ),
        60,
        "the mask-fraction automation to fire",
    )


@pytest.mark.integrity
def test_a_resubmitted_file_is_handed_off_once_under_two_workers(event_path) -> None:
    source = rollout_file(event_path, "again.jsonl", 33, 3)
    assert submit(event_path, source).returncode == 0
    again = submit(event_path, source)
    assert again.returncode == 0, again.stderr
    assert "already in the inbox with this content" in again.stderr
    run_id = run_id_for_file(inbox_url(event_path, source))
    wait_until(
        lambda: (
            len(deployment_runs("finalize-inbox-file/inbox-file", run_id)) == 2
            and all_final(deployment_runs("finalize-inbox-file/inbox-file", run_id))
        ),
        RUN_DEADLINE,
        "both runs of the resubmitted file to end",
        0.5,
    )
    runs = deployment_runs("finalize-inbox-file/inbox-file", run_id)
    assert all(r.state.is_completed() for r in runs), [r.state for r in runs]
    handed_off_once(event_path, run_id, ["33-0", "33-1", "33-2"], 1)
    other = event_path["sources"] / "elsewhere" / "again.jsonl"
    other.parent.mkdir()
    other.write_bytes(b'{"other": "content"}\n')
    refused = submit(event_path, str(other))
    assert refused.returncode == 2 and inbox_url(event_path, source) in refused.stderr
    assert Path(inbox_url(event_path, source)).read_bytes() == Path(source).read_bytes()
    record_case("a file submitted twice runs twice on two workers and is handed off once")


@pytest.mark.integrity
def test_a_run_failed_by_an_unreachable_store_is_retriggered_once_it_is_back(
    event_path, tmp_path: Path
) -> None:
    source = rollout_file(event_path, "unreachable.jsonl", 34, 3)
    run_id = run_id_for_file(inbox_url(event_path, source))
    event_path["plan"].rate = 1.0
    try:
        assert submit(event_path, source).returncode == 0
        wait_until(
            lambda: all_final(deployment_runs("finalize-inbox-file/inbox-file", run_id)),
            RUN_DEADLINE,
            "the file's run to fail on the unreachable store",
            0.5,
        )
    finally:
        event_path["plan"].rate = 0.0
    (failed,) = deployment_runs("finalize-inbox-file/inbox-file", run_id)
    assert failed.state.is_failed(), failed.state
    wait_completed(event_path, [run_id], "the retriggered run to hand the file off")
    wait_finished("retrigger-failed/retrigger-failed", [run_id], "the retrigger run to end")
    retriggers = deployment_runs("retrigger-failed/retrigger-failed", run_id)
    assert [r.state.name for r in retriggers] == ["Completed"]
    assert retriggers[0].parameters["retrigger"] == 1
    assert retriggers[0].parameters["rollouts"] == inbox_url(event_path, source)
    assert retriggers[0].parameters["failed_run"] == str(failed.id), "it names the failed run"
    uninterrupted = uninterrupted_records(event_path, source, tmp_path)
    assert comparable(dest_records(event_path["dest"], run_id)) == comparable(uninterrupted)
    record_case("a run failed by an unreachable store is retriggered by the automation")


def uninterrupted_records(paths: dict[str, Any], source: str, tmp_path: Path) -> list[dict]:
    """The same rollouts captured in a second store, finalized by one uninterrupted run."""
    store = str(tmp_path / "store")
    records = [orjson.loads(line) for line in Path(source).read_bytes().splitlines()]
    task = records[0]["_ng_task_index"]
    make_batch(TokenCaptureStore(store), len(records), task=task)
    shutil.copy(source, tmp_path / "in.jsonl")
    finalize_run(str(tmp_path / "in.jsonl"), store, str(tmp_path / "dest"), "uninterrupted")
    return dest_records(str(tmp_path / "dest"), "uninterrupted")


def comparable(records: list[dict]) -> list[bytes]:
    """Records without what names their run or snapshot, which differ between two runs."""

    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if "snapshot" not in k}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    return sorted(orjson.dumps(strip(r), option=orjson.OPT_SORT_KEYS) for r in records)


def test_an_inbox_pass_fans_out_one_run_per_file_copied_in_without_an_event(event_path) -> None:
    urls = []
    for name, task in (("copied-one.jsonl", 35), ("copied-two.jsonl", 36)):
        source = rollout_file(event_path, name, task, 2)
        draft = Path(event_path["inbox"], name + ".part")
        shutil.copy(source, draft)
        os.replace(draft, Path(event_path["inbox"], name))
        urls.append(f"{event_path['inbox']}/{name}")
    run_ids = [run_id_for_file(u) for u in urls]
    parent = run_deployment("finalize-inbox/inbox", timeout=0)
    wait_completed(event_path, run_ids, "the inbox pass's child runs to hand both files off")
    wait_finished("finalize-inbox-file/inbox-file", run_ids, "both child runs to end")
    children = [deployment_runs("finalize-inbox-file/inbox-file", r) for r in run_ids]
    assert [len(c) for c in children] == [1, 1], "one child run per file"
    wait_until(lambda: all_final([read_run(parent.id)]), 120, "the inbox pass to end")
    report = read_run(parent.id)
    assert report.state.is_completed()
    for (child,) in children:
        assert child.parent_task_run_id is not None, "started by the pass, as its child"
    (one,), (two,) = children
    assert fanned_out(one, two), "the pass started both child runs before either ended"


def fanned_out(one: Any, two: Any) -> bool:
    """Whether both runs existed before either ended: the pass did not wait for the first
    to start the second. (Whether two workers then ran them at once depends on when each
    worker polls, which a loaded machine does not promise.)"""
    return max(one.created, two.created) < min(one.end_time, two.end_time)


def at_once(one: Any, two: Any) -> bool:
    """Whether two runs were on workers at the same time: from a worker taking each (its
    first Pending state, so the run's process start counts) to its end."""

    def taken(run: Any) -> Any:
        with get_client(sync_client=True) as client:
            states = client.read_flow_run_states(run.id)
        return min(s.timestamp for s in states if s.name == "Pending")

    return max(taken(one), taken(two)) < min(one.end_time, two.end_time)


def read_run(flow_run_id: UUID) -> Any:
    with get_client(sync_client=True) as client:
        return client.read_flow_run(flow_run_id)


def test_a_batch_holds_its_share_of_the_store_request_limit(event_path) -> None:
    """Runs last: it changes the limit, so no run of the module may be in flight."""
    from tokcap.flows.automations import apply_automations
    from tokcap.tasks.store_limit import STORE_REQUESTS, _limit_at, store_requests

    def active() -> int:
        with get_client(sync_client=True) as client:
            return client.read_global_concurrency_limit_by_name(STORE_REQUESTS).active_slots

    _limit_at.cache_clear()
    with store_requests():
        assert active() == 16, "one batch holds one slot per rollout it works on at once"
    assert active() == 0
    apply_automations(store_request_limit=8)
    _limit_at.cache_clear()
    try:
        too_small = pytest.raises(ValueError, match="tokcap-store-requests is 8, below the 16")
        with too_small, store_requests():
            pass
    finally:
        apply_automations()
        _limit_at.cache_clear()
