"""Each `tokcap` command as a real subprocess, with its summaries and error messages."""

from __future__ import annotations

import os
import re

import orjson
import pytest

from capture_core.run.rollout_io import plan_rollout_file
from capture_core.storage import open_byte_store
from tests.support.pipeline_helpers import finalize_args, finalize_args_for, receipt_args, run_cli

pytestmark = pytest.mark.usefixtures("prefect_api")


def run_args(run_inputs: dict[str, str], run_id: str) -> list[str]:
    return finalize_args_for(run_inputs, run_id, "--batch-size", "2")


def test_finalize_then_status(run_inputs, prefect_api: str) -> None:
    done = run_cli(run_args(run_inputs, "cli-1"), prefect_api)
    assert done.returncode == 0, done.stderr[-2000:]
    first, *rest = done.stdout.splitlines()
    assert first.startswith("run cli-1: complete: 4 of 4 rollouts handed off, 1 masked"), first
    assert any(line.startswith("  1 several conversations: ") for line in rest), done.stdout
    assert "roots" not in done.stdout, "no builder jargon"
    assert "#several-conversations)" in done.stdout
    status = run_cli(
        ["status", "--dest", run_inputs["dest"], "--run-id", "cli-1", "--json"], prefect_api
    )
    assert status.returncode == 0, status.stderr
    report = orjson.loads(status.stdout)
    assert report["summary"]["handed_off"] == 4 and report["summary"]["retired"] == 3
    assert report["summary"]["ledger"] == f"{run_inputs['dest']}/cli-1/ledger.jsonl"
    assert report["manifest"]["batches"] == 2


def test_retrigger_completes_a_failed_run_and_reports_changes(run_inputs, prefect_api: str) -> None:
    batch = plan_rollout_file(run_inputs["rollouts"], 2).batches[0]
    blocker = f"cli-2/records/part-00000-{batch.sha256[:16]}.jsonl"
    open_byte_store(run_inputs["dest"]).create(blocker, b"other\n")
    args = run_args(run_inputs, "cli-2")
    failed = run_cli(args, prefect_api)
    assert failed.returncode == 1 and "already exists with other content" in failed.stderr
    open_byte_store(run_inputs["dest"]).delete([blocker])
    again = run_cli(
        receipt_args("retrigger", run_inputs["dest"], "cli-2", run_inputs["store"]),
        prefect_api,
    )
    assert again.returncode == 0, again.stderr[-2000:]
    assert (
        "2 newly handed off (2 by an earlier run), 1 newly retired (2 by an earlier run), "
        "0 still failing" in again.stdout
    ), again.stdout
    retire = run_cli(
        receipt_args("retire", run_inputs["dest"], "cli-2", run_inputs["store"]),
        prefect_api,
    )
    assert retire.returncode == 0
    assert (
        "3 captures retired from 2 receipts (0 now, 3 by an earlier run against this store; "
        "1 kept as evidence)" in retire.stdout
    ), retire.stdout


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (
            finalize_args("{rollouts}", "{missing}", "{dest}", "x"),
            2,
            "--store .*missing is not a directory",
        ),
        (
            finalize_args("nope://bucket/in.jsonl", "{store}", "{dest}", "x"),
            2,
            "--rollouts nope://bucket/in.jsonl is .*: no filesystem knows the protocol nope://",
        ),
        (["status", "--dest", "{dest}", "--run-id", "never"], 2, "unknown run id never"),
        (
            receipt_args("retrigger", "{dest}", "never", "{store}"),
            2,
            "unknown run id never",
        ),
        (
            receipt_args("retire", "{dest}", "never-ran", "{store}"),
            2,
            "unknown run id never-ran",
        ),
        (
            finalize_args("{rollouts}", "{store}", "{dest}", "../up"),
            2,
            "malformed run id",
        ),
        (
            [
                "serve",
                "--inbox",
                "{missing}",
                "--store",
                "{store}",
                "--dest",
                "{dest}",
                "--cron",
                "x",
            ],
            2,
            "--cron 'x' is not a cron expression",
        ),
        (
            ["clear", "--rollouts", "{rollouts}", "--store", "{store}", "--storage-option", "oops"],
            2,
            "must look like key=value",
        ),
        (["demo", "--workdir", "{rollouts}/demo"], 2, r"--workdir .* cannot be created: .* file"),
        (
            finalize_args("{rollouts}", "{store}", "{rollouts}/out", "r"),
            2,
            r"--dest .* cannot be created: .* is a file",
        ),
    ],
)
def test_errors_name_the_problem(
    run_inputs, tmp_path, prefect_api: str, args: list[str], code: int, message: str
) -> None:
    values = {**run_inputs, "missing": str(tmp_path / "missing")}
    os.makedirs(run_inputs["dest"], exist_ok=True)
    result = run_cli([a.format(**values) for a in args], prefect_api)
    assert result.returncode == code, result.stderr[-1500:]
    assert re.search(message, result.stderr), result.stderr[-1500:]
    assert "Traceback" not in result.stderr
    if code == 2:
        assert len(result.stderr.strip().splitlines()) <= 2, result.stderr
