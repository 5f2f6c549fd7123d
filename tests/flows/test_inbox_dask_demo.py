"""The inbox flow (local and S3), the Dask task runner, and the one-command demo."""

from __future__ import annotations

import os
import re

import pytest

from capture_core.run.inbox import run_id_for_file
from capture_core.run.receipt import receipt_key
from capture_core.run.rollout_io import plan_rollout_file
from capture_core.run.run_layout import read_ledger
from capture_core.storage import open_byte_store
from capture_core.store import TokenCaptureStore
from tests.support.pipeline_helpers import (
    dest_records,
    locations_inbox,
    make_batch,
    run_cli,
    write_rollouts,
)
from tokcap.flows.finalize import finalize_run
from tokcap.flows.inbox import FileSettings, InboxFailedError, finalize_inbox
from tokcap.flows.runners import task_runner_from_spec
from tokcap.tasks.receipts import read_receipt

pytestmark = pytest.mark.usefixtures("prefect_api")


def test_inbox_finalizes_new_files_once_and_picks_up_later_ones(locations) -> None:
    s = locations
    store = TokenCaptureStore(s["store"], s["options"])
    settings = locations_inbox(s)
    first = write_rollouts(f"{s['inbox']}/a.jsonl", make_batch(store, 2, task=1), s["options"])
    report = finalize_inbox(settings)
    assert report.finalized == [first] and report.already_done == []
    again = finalize_inbox(settings)
    assert again.finalized == [] and again.already_done == [first]
    second = write_rollouts(f"{s['inbox']}/b.jsonl", make_batch(store, 3, task=2), s["options"])
    later = finalize_inbox(settings)
    assert later.finalized == [second] and later.already_done == [first]
    assert len(dest_records(s["dest"], run_id_for_file(second), s["options"])) == 3


def test_inbox_gives_up_on_a_file_that_keeps_failing(tmp_path) -> None:
    inbox, store, dest = str(tmp_path / "inbox"), str(tmp_path / "store"), str(tmp_path / "dest")
    os.makedirs(store)
    write_rollouts(f"{inbox}/bad.jsonl", [], extra_lines=[b"{broken\n"])
    settings = FileSettings(inbox=inbox, store=store, dest=dest, max_attempts=2)
    for _ in range(2):
        state = finalize_inbox(settings, return_state=True)
        assert state.is_failed(), "an inbox pass that failed a file is not Completed"
        failed = state.result(raise_on_failure=False)
        assert list(failed.summary.failed) == [f"{inbox}/bad.jsonl"]
        assert "line 1: malformed JSON" in failed.summary.failed[f"{inbox}/bad.jsonl"]
    with pytest.raises(InboxFailedError, match=r"bad\.jsonl: given up") as given_up:
        finalize_inbox(settings)
    assert given_up.value.summary.given_up == [f"{inbox}/bad.jsonl"]


def test_dask_runner_gives_the_same_records_receipts_and_ledger(tmp_path) -> None:
    results = {}
    for name, runner in (("default", None), ("dask", task_runner_from_spec("dask"))):
        store, dest = str(tmp_path / name / "store"), str(tmp_path / name / "dest")
        rollouts = write_rollouts(
            str(tmp_path / f"{name}.jsonl"), make_batch(TokenCaptureStore(store), 5, masked={2})
        )
        flow = finalize_run.with_options(task_runner=runner) if runner else finalize_run
        flow(rollouts, store, dest, "same", batch_size=2)
        receipts = [
            read_receipt(dest, "same", receipt_key(b), None)
            for b in plan_rollout_file(rollouts, 2).batches
        ]
        results[name] = (
            dest_records(dest, "same"),
            [
                r.model_dump(
                    exclude={"handed_off_at": True, "rollouts": {"__all__": {"snapshot_id"}}}
                )
                for r in receipts
            ],
            [line.model_dump() for line in read_ledger(open_byte_store(dest), "same")],
        )
    assert results["dask"] == results["default"]


def test_demo_runs_end_to_end_and_its_summary_matches_the_destination(
    tmp_path, prefect_api: str
) -> None:
    done = run_cli(["demo", "--workdir", str(tmp_path)], prefect_api)
    assert done.returncode == 0, done.stderr[-3000:]
    run_id = next(
        line.split()[1].rstrip(":") for line in done.stdout.splitlines() if line.startswith("run ")
    )
    counts = {
        line.rsplit(None, 1)[0].strip(): int(line.rsplit(None, 1)[1])
        for line in done.stdout.splitlines()
        if line[:1].isalpha() and line.rsplit(None, 1)[-1].isdigit()
    }
    ledger = read_ledger(open_byte_store(str(tmp_path / "dest")), run_id)
    records = dest_records(str(tmp_path / "dest"), run_id)
    assert counts["rollouts"] == len(records) == len(ledger) == 7
    assert counts["handed off"] == sum(line.handed_off for line in ledger) == 7
    assert counts["masked"] == sum(bool(r.get("mask_sample")) for r in records) == 1, "1-1"
    assert counts["retired"] == sum(line.retired for line in ledger) == 6
    carried = next(r for r in records if r["_ng_task_index"] == 1 and r["_ng_rollout_index"] == 3)
    assert carried["response"]["output"][0]["generation_token_ids"] == [4, 5]
    again = run_cli(["demo", "--workdir", str(tmp_path)], prefect_api)
    assert again.returncode == 0, "the demo can run again in the same workdir"
    assert re.search(r"^handed off\s+7$", again.stdout, re.MULTILINE), again.stdout[-2000:]
