"""A new user's first commands: usage errors, paths, failures and what the runs show.

Every command runs as a real `tokcap` subprocess; run states, task runs, artifacts and logs
are read back from the session's Prefect server.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import orjson
import pytest

from capture_core.errors import CaptureRetiredError
from capture_core.operator.run_report import reason_category
from capture_core.run.run_layout import read_ledger, read_manifest
from capture_core.storage import open_byte_store
from capture_core.store import TokenCaptureStore
from capture_core.testing.synthetic import RolloutShape, synthetic_rollout
from tests.conftest import make_bucket
from tests.support.fault_proxy import FaultPlan, fault_proxy
from tests.support.pipeline_helpers import (
    REPO,
    finalize_args,
    finalize_args_for,
    make_batch,
    receipt_args,
    run_cli,
    write_rollouts,
)
from tests.support.prefect_api_reads import (
    artifacts_of,
    eventually,
    flow_run,
    flow_runs_named,
    logs_of,
    task_runs_of,
)
from tokcap.flows.inbox import FileSettings, InboxFailedError, finalize_inbox
from tokcap.flows.runners import STARTING
from tokcap.flows.temporary_server import LOG_START, MAX_STARTS, error_lines

pytestmark = pytest.mark.usefixtures("prefect_api")


def flow_run_id_from(stderr: str) -> str:
    line = next(line for line in stderr.splitlines() if "prefect flow-run logs" in line)
    return line.rsplit(None, 1)[-1]


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (["--batch-size", "0"], "--batch-size: 0 is not at least 1"),
        (["--batch-size", "-1"], "--batch-size: -1 is not at least 1"),
        (["--builder", "nonsense"], "invalid choice: 'nonsense'"),
        (["--max-mask-fraction", "1.5"], "1.5 is not between 0 and 1"),
        (["--task-runner", "ray"], "unknown task runner 'ray'"),
    ],
)
def test_bad_parameters_exit_2_in_two_lines_before_any_flow_run(
    run_inputs, prefect_api: str, extra: list[str], expected: str
) -> None:
    run_id = f"usage-{abs(hash(tuple(extra))) % 10**8}"
    args = finalize_args_for(run_inputs, run_id, *extra)
    result = run_cli(args, prefect_api)
    assert result.returncode == 2, result.stderr[-1500:]
    assert expected in result.stderr
    assert len(result.stderr.strip().splitlines()) <= 2 and result.stdout == ""
    assert flow_runs_named(f"finalize {run_id} from {run_inputs['rollouts']}") == []
    assert not os.path.exists(run_inputs["dest"]), "nothing was written"


def test_help_lists_the_builders(prefect_api: str) -> None:
    result = run_cli(["finalize", "--help"], prefect_api)
    assert result.returncode == 0
    assert "prefix_merging" in result.stdout and "per_request" in result.stdout


def test_relative_paths_are_resolved_and_stored_absolute(tmp_path, prefect_api: str) -> None:
    work = tmp_path / "work"
    store = TokenCaptureStore(str(work / "store"))
    write_rollouts(str(work / "in.jsonl"), make_batch(store, 2))
    args = finalize_args("in.jsonl", "store", "dest", "rel", "--batch-size", "1")
    done = run_cli(args, prefect_api, cwd=str(work))
    assert done.returncode == 0, done.stderr[-2000:]
    manifest = read_manifest(open_byte_store(str(work / "dest")), "rel")
    assert manifest is not None and manifest.rollouts == str(work / "in.jsonl")
    assert manifest.store == str(work / "store")
    elsewhere = run_cli(
        receipt_args("retrigger", str(work / "dest"), "rel", "store"),
        prefect_api,
        cwd=str(work),
    )
    assert elsewhere.returncode == 0, elsewhere.stderr[-2000:]
    assert "0 still failing" in elsewhere.stdout


def test_a_file_as_dest_is_named_as_the_destination(run_inputs, tmp_path, prefect_api: str) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    args = finalize_args(run_inputs["rollouts"], run_inputs["store"], str(blocker), "file-dest")
    result = run_cli(args, prefect_api)
    assert result.returncode == 2
    assert f"--dest {blocker} is a file" in result.stderr
    assert "store location" not in result.stderr and "store root" not in result.stderr


def test_malformed_lines_fail_finalize_status_and_the_inbox_alike(tmp_path, prefect_api) -> None:
    inbox, dest, store = (str(tmp_path / name) for name in ("inbox", "dest", "store"))
    records = make_batch(TokenCaptureStore(store), 2)
    bad = write_rollouts(f"{inbox}/bad.jsonl", records, extra_lines=[b"{oops\n"])
    result = run_cli(finalize_args(bad, store, dest, "bad-line"), prefect_api)
    assert result.returncode == 1, result.stderr[-2000:]
    assert f"{bad} line 3: malformed JSON" in result.stderr
    assert "Traceback" not in result.stderr
    assert re.search(r"^malformed input lines\s+1$", result.stdout, re.MULTILINE)
    status = run_cli(["status", "--dest", dest, "--run-id", "bad-line"], prefect_api)
    assert status.returncode == 1
    state = flow_run(flow_run_id_from(result.stderr)).state
    assert state.is_failed(), state
    report = eventually(
        lambda: artifacts_of(flow_run_id=flow_run_id_from(result.stderr)),
        lambda found: any(a.type == "markdown" for a in found),
        "the run's markdown report",
    )
    markdown = next(a.data for a in report if a.type == "markdown")
    assert "1 malformed input line" in markdown and "1 malformed input lines" not in markdown
    assert "| 1 | 3 | " in markdown and "line 3: malformed JSON" in markdown, markdown

    with pytest.raises(InboxFailedError) as failed:
        finalize_inbox(FileSettings(inbox=inbox, store=store, dest=str(tmp_path / "dest2")))
    assert failed.value.failures[0].startswith(f"{bad}: ")
    assert "line 3: malformed JSON" in failed.value.failures[0]


def test_finalizing_a_retired_capture_says_so_and_names_tokcap_clear(
    run_inputs, prefect_api: str
) -> None:
    first = run_cli(
        finalize_args_for(run_inputs, "r1"),
        prefect_api,
    )
    assert first.returncode == 0, first.stderr[-2000:]
    again = run_cli(
        finalize_args_for(run_inputs, "r2"),
        prefect_api,
    )
    assert again.returncode == 0, again.stderr[-2000:]
    ledger = read_ledger(open_byte_store(run_inputs["dest"]), "r2") or []
    reasons = [line.mask_reason or "" for line in ledger if line.rollout_id == "7-0"]
    assert "already retired after an earlier handoff" in reasons[0]
    assert "tokcap clear" in reasons[0] and "retired tombstone" in reasons[0]
    assert "delete()" not in reasons[0]
    assert re.search(r"^  3 capture already retired: .*tokcap clear", again.stdout, re.M)


def test_retired_capture_reasons_of_different_rollouts_group_as_one(tmp_path) -> None:
    store = TokenCaptureStore(str(tmp_path / "store"))
    reasons = []
    for rollout_id in ("3-0", "3-1"):
        for entry in synthetic_rollout(rollout_id, RolloutShape(turns=2)):
            store.put_now(entry)
        snapshot = store.freeze_now(rollout_id)
        assert store.drop_now(rollout_id, snapshot.snapshot_id, snapshot.version)
        with pytest.raises(CaptureRetiredError) as retired:
            store.freeze_now(rollout_id)
        reasons.append(f"CaptureRetiredError: {retired.value}")
    assert reasons[0] != reasons[1], "each names its own rollout and snapshot"
    groups = {reason_category(reason) for reason in reasons}
    assert groups == {"was already retired after an earlier handoff"}


def test_retire_of_an_unknown_run_id_is_a_usage_error(run_inputs, prefect_api: str) -> None:
    args = receipt_args("retire", run_inputs["dest"], "never-ran", run_inputs["store"])
    os.makedirs(run_inputs["dest"])
    result = run_cli(args, prefect_api)
    assert result.returncode == 2
    assert "unknown run id never-ran" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_run_id_reuse_names_the_changed_setting(run_inputs, prefect_api: str) -> None:
    args = finalize_args_for(run_inputs, "reuse")
    assert run_cli([*args, "--batch-size", "2"], prefect_api).returncode == 0
    other = run_cli([*args, "--batch-size", "3", "--builder", "per_request"], prefect_api)
    assert other.returncode == 2, "refused before any flow run, from the manifest"
    assert other.stdout == "", "the earlier run's summary is not shown as this command's"
    assert len(other.stderr.strip().splitlines()) == 1, other.stderr
    assert (
        "batch size 2 is now 3" in other.stderr
        and "builder prefix_merging is now per_request" in other.stderr
    )
    assert len(flow_runs_named(f"finalize reuse from {run_inputs['rollouts']}")) == 1


def test_an_outage_after_the_checks_fails_with_one_line_and_traces_in_the_run_logs(
    tmp_path, prefect_api: str, s3_options
) -> None:
    """The bucket answers the CLI's checks, then drops every write: the run retries, fails,
    and prints the failure once; the retries and the tracebacks stay in the run's logs."""
    bucket = make_bucket(s3_options)
    plan = FaultPlan(rate=1.0, kinds=("drop-before",), operations=("write",))
    captured = make_batch(TokenCaptureStore(f"s3://{bucket}/store", s3_options), 1)
    rollouts = write_rollouts(str(tmp_path / "in.jsonl"), captured)  # the store holds it
    with fault_proxy(str(s3_options["endpoint_url"]), plan) as endpoint:
        args = finalize_args(
            rollouts,
            f"s3://{bucket}/store",
            f"s3://{bucket}/dest",
            "s3-down",
            *(f"--storage-option={o}" for o in (f"endpoint_url={endpoint}", "key=testing")),
            "--storage-option=secret=testing",
        )
        result = run_cli(args, prefect_api, env={"PREFECT_LOGGING_LEVEL": "INFO"})
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    mentions = [line for line in result.stderr.splitlines() if "is unreachable" in line]
    retries = [line for line in mentions if re.search(r"Retry [123]/3 will start", line)]
    failures = [line for line in mentions if line not in retries]
    assert retries == [], "a retry is not a failure: it stays in the run's logs"
    assert len(failures) == 1, result.stderr
    assert f"the S3 endpoint {endpoint} dropped the connection" in failures[0], failures[0]
    assert "check that it is running and reachable" in failures[0], failures[0]
    logs = eventually(
        lambda: logs_of(flow_run_id_from(result.stderr)),
        lambda found: any("Traceback" in log.message for log in found),
        "the traceback in the flow-run logs",
    )
    assert any("ConnectionClosedError" in log.message for log in logs)


def test_runs_name_batches_show_receipts_and_list_masked_rollouts(run_inputs, prefect_api) -> None:
    args = finalize_args_for(
        run_inputs,
        "named",
        "--batch-size",
        "2",
    )
    done = run_cli(args, prefect_api)
    assert done.returncode == 0, done.stderr[-2000:]
    run = flow_runs_named(f"finalize named from {run_inputs['rollouts']}")[0]
    tasks = eventually(
        lambda: {t.name: t for t in task_runs_of(run.id)},
        lambda names: {"upload batch 0 (lines 1-2)", "upload batch 1 (lines 3-4)"} <= set(names),
        "named upload task runs",
    )
    assert "finalize batch 1 (lines 3-4)" in tasks
    assert "retire batch 0 (lines 1-2)" in tasks
    upload = tasks["upload batch 0 (lines 1-2)"]
    receipt = upload.state.result()
    assert receipt.part_key.startswith("named/records/part-00000-") and receipt.records == 2
    table = eventually(
        lambda: artifacts_of(task_run_id=upload.id),
        lambda found: any(a.type == "table" for a in found),
        "the receipt artifact of the upload task run",
    )
    (card,) = [a for a in table if a.type == "table"]
    assert receipt.sha256 in str(card.data) and receipt.part_key in str(card.data)
    assert card.description == "receipt of batch 0 (lines 1-2), run named"
    found = eventually(
        lambda: artifacts_of(flow_run_id=run.id),
        lambda found: any(a.type == "markdown" for a in found),
        "the run report",
    )
    (report,) = [a for a in found if a.task_run_id is None]  # the UI lists these first
    assert (report.key, report.type) == ("tokcap-report-named", "markdown")
    assert not [a for a in found if a.type == "progress"], "done: the report replaced it"
    markdown = report.data
    assert markdown.splitlines()[2].startswith("run named: complete: 4 of 4 rollouts handed off")
    assert "## Masked rollouts (1)" in markdown
    assert "- 7-1 (line 2): several conversations: `2 roots" in markdown
    retire = run_cli(
        receipt_args("retire", run_inputs["dest"], "named", run_inputs["store"]),
        prefect_api,
    )
    assert retire.returncode == 0 and "; 1 kept as evidence)" in retire.stdout, retire.stdout


def test_status_json_says_where_the_records_are(run_inputs, prefect_api: str) -> None:
    args = finalize_args_for(run_inputs, "where")
    assert run_cli(args, prefect_api).returncode == 0
    status = run_cli(
        ["status", "--dest", run_inputs["dest"], "--run-id", "where", "--json"], prefect_api
    )
    summary = orjson.loads(status.stdout)["summary"]
    assert summary["records_prefix"] == f"{run_inputs['dest']}/where/records/"
    assert summary["ledger"] == f"{run_inputs['dest']}/where/ledger.jsonl"


DEMO_DEADLINE = 1200
"""Seconds the busy demo may take: a fresh database under two burners and a loaded machine."""


def cpu_burner() -> subprocess.Popen:
    """A CPU-bound process that runs until it is terminated or its parent is gone."""
    code = "import os\nparent = os.getppid()\nwhile os.getppid() == parent:\n    pass\n"
    return subprocess.Popen([sys.executable, "-c", code])


def fresh_prefect_env(home: str, **extra: str) -> dict[str, str]:
    """The environment of a new user: no Prefect settings at all, an empty `PREFECT_HOME`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    return {**env, "PREFECT_HOME": home, "PYTHONPATH": REPO, **extra}


def test_first_demo_succeeds_on_a_busy_machine_with_a_fresh_prefect_home(tmp_path) -> None:
    """The command is judged by its own output (exit code, summary, ledger, its one note):
    what a loaded server or Prefect's background services print around it is not the
    command's, and it varies with the load."""
    burners = [cpu_burner(), cpu_burner()]
    try:
        result = subprocess.run(
            [sys.executable, "-m", "tokcap.flows.cli", "demo", "--workdir", "demo"],
            cwd=str(tmp_path),
            env=fresh_prefect_env(str(tmp_path / "prefect-home")),
            capture_output=True,
            text=True,
            timeout=DEMO_DEADLINE,
        )
        competed = [burner.poll() is None for burner in burners]
    finally:
        for burner in burners:
            burner.terminate()
            burner.wait(timeout=60)
    assert competed == [True, True], "both CPU burners ran for the whole demo"
    assert result.returncode == 0, result.stderr[-3000:]
    assert re.search(r"^handed off\s+7$", result.stdout, re.MULTILINE), result.stdout
    assert "prefect server start` and open http://127.0.0.1:4200" in result.stdout
    dest = tmp_path / "demo" / "dest"
    assert dest.is_dir(), "the relative workdir is under the cwd"
    (run_id,) = re.findall(r"--run-id (\S+)", result.stdout)  # its `tokcap status` hint
    ledger = read_ledger(open_byte_store(str(dest)), run_id) or []
    assert len(ledger) == 7 and all(line.handed_off for line in ledger), ledger
    notes = [line for line in result.stderr.splitlines() if line.startswith("note:")]
    assert len(notes) <= 1, notes
    if notes:  # the loaded server logged errors: to its log, named once
        server_log = tmp_path / "prefect-home" / "tokcap-temporary-server.log"
        assert notes[0].endswith(str(server_log)) and error_lines(str(server_log), LOG_START)


def test_tokcap_deployments_prints_the_path_without_starting_a_server(tmp_path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "tokcap.flows.cli", "deployments"],
        cwd=str(tmp_path),
        env=fresh_prefect_env(str(tmp_path / "prefect-home")),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert os.path.isfile(result.stdout.strip()), "stdout is only the file's path"
    assert "temporary server" not in result.stderr, result.stderr


def demo_on_a_failing_server(tmp_path, **settings: str) -> list[str]:
    """Run the demo on a temporary server set up with `settings`; it must fail having run
    nothing and printed no traceback. Returns its `tokcap demo:` lines."""
    result = subprocess.run(
        [sys.executable, "-m", "tokcap.flows.cli", "demo", "--workdir", str(tmp_path / "demo")],
        cwd=REPO,
        env=fresh_prefect_env(str(tmp_path / "prefect-home"), **settings),
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert not os.path.exists(tmp_path / "demo"), "nothing ran"
    lines = [line for line in result.stderr.splitlines() if line.startswith("tokcap demo:")]
    assert lines[0] == f"tokcap demo: {STARTING}", "the wait is announced first"
    return lines[1:]


def test_a_server_that_cannot_start_says_what_to_do_in_one_line(tmp_path) -> None:
    ours = demo_on_a_failing_server(tmp_path, PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="1")
    assert len(ours) == 1, ours
    assert "did not start within 1 s" in ours[0] and "prefect server start`" in ours[0]
    assert "PREFECT_API_URL=http://127.0.0.1:4200/api" in ours[0]


def test_a_server_that_keeps_crashing_at_startup_is_reported_with_its_error(tmp_path) -> None:
    """Prefect restarts a server that exits at startup without counting the time; the CLI
    stops after a few starts and names the cause from the server's log."""
    ours = demo_on_a_failing_server(
        tmp_path,
        PREFECT_API_DATABASE_CONNECTION_URL="sqlite+aiosqlite:////proc/no-such-dir/prefect.db",
    )
    assert len(ours) == 1, ours
    assert f"exited at startup {MAX_STARTS} times" in ours[0]
    assert "unable to open database file" in ours[0] and "fix what the log names" in ours[0]


def test_the_demo_points_at_the_configured_server(tmp_path, prefect_api: str) -> None:
    result = run_cli(["demo", "--workdir", str(tmp_path)], prefect_api)
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"open {prefect_api.removesuffix('/api')} " in result.stdout
    assert (
        "dispatch-time clear of 7 rollout ids: 1 held a stale capture from an earlier "
        "attempt, now removed (0-0)" in result.stdout
    ), "only 0-0 held a stale capture"
    assert ":4200" not in result.stdout
