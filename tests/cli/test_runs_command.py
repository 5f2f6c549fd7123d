"""`tokcap runs`: a destination's runs, newest first, and the same table as the `tokcap-runs`
artifact every finalize run updates.

The runs are real `tokcap finalize` subprocesses against the session's Prefect server; an
interrupted run is one whose report was never written (its ledger and summary removed, its
manifest and receipts kept). `tokcap runs` itself needs no server.
"""

from __future__ import annotations

import re
from pathlib import Path

import orjson
import pytest

from capture_core.operator.run_index import record_summary
from capture_core.operator.run_report import summarize
from capture_core.run.run_layout import LEDGER, SUMMARY, LedgerLine
from capture_core.storage import open_byte_store
from tests.conftest import make_bucket
from tests.support.claimed_runs import claimed_layout
from tests.support.pipeline_helpers import finalize_args, run_cli, with_storage_options
from tests.support.prefect_api_reads import artifacts_of, flow_runs_named
from tokcap.flows.inputs import make_inputs
from tokcap.tasks.report import RUNS_ARTIFACT

HEADER = re.compile(r"^run id +updated \(UTC\) +state +rollouts +masked +retired +waiting")


@pytest.mark.usefixtures("prefect_api")
def test_runs_lists_a_complete_and_an_interrupted_run_newest_first(
    tmp_path: Path, prefect_api: str
) -> None:
    store, dest = str(tmp_path / "store"), tmp_path / "dest"
    made = make_inputs(store, str(tmp_path / "out"), 8, files=2, prefix="runs")
    for rollouts, run_id in zip(made.files, ("older", "newer"), strict=True):
        args = finalize_args(rollouts.url, store, str(dest), run_id, "--batch-size", "2")
        done = run_cli(args, prefect_api)
        assert done.returncode == 0, done.stderr[-2000:]
    (newer,) = flow_runs_named(f"finalize newer from {made.files[1].url}")
    (artifact,) = [a for a in artifacts_of(flow_run_id=newer.id) if a.key == RUNS_ARTIFACT]
    table = artifact.data if isinstance(artifact.data, list) else orjson.loads(artifact.data)
    assert [(row["run id"], row["state"]) for row in table] == [
        ("newer", "complete"),
        ("older", "complete"),
    ]
    assert table[0]["rollouts"] == "4" and table[0]["rollouts/s"] != "-"
    assert str(dest) in artifact.description
    for name in (LEDGER, SUMMARY):  # the older run stopped before its report
        (dest / "older" / name).unlink()
    listed = run_cli(["runs", "--dest", str(dest)], None)
    assert listed.returncode == 0, listed.stderr
    header, *lines = listed.stdout.splitlines()
    assert HEADER.match(header), header
    assert [line.split()[0] for line in lines] == ["newer", "older"]
    assert re.search(r" complete +4 +\d+ \(\d+\.\d%\) +\d+ +0 +\d+\.\d", lines[0]), lines[0]
    assert " interrupted " in lines[1] and "2/2 batches handed off, 2 retired" in lines[1]
    assert "could not tell whether it is live: no PREFECT_API_URL is set" in lines[1], lines[1]
    as_json = run_cli(["runs", "--dest", str(dest), "--json"], None)
    body = orjson.loads(as_json.stdout)
    assert body["total"] == 2 and [r["run_id"] for r in body["runs"]] == ["newer", "older"]
    assert [r["state"] for r in body["runs"]] == ["complete", "interrupted"]
    assert body["runs"][0]["complete"] is True and body["runs"][1]["batches_handed_off"] == 2


def test_runs_reads_an_s3_destination(s3_options: dict, s3_endpoint: str) -> None:
    dest = f"s3://{make_bucket(s3_options)}/dest"
    s3_paths = {"rollouts": "s3://b/in.jsonl", "store": "s3://b/store", "started_at": 1.0}
    layout = claimed_layout(open_byte_store(dest, s3_options), "on-s3", **s3_paths)
    ledger = [LedgerLine(rollout_id="a", line=1, finalized=True, handed_off=True, retired=True)]
    layout.write_ledger(ledger)
    record_summary(layout, summarize("on-s3", ledger), seconds=0.5, now=2.0)
    args = with_storage_options(["runs", "--dest", dest], {"endpoint_url": s3_endpoint})
    listed = run_cli(args, None)
    assert listed.returncode == 0, listed.stderr
    assert re.search(r"^on-s3 +1970-01-01 00:00:02 +complete +1 ", listed.stdout, re.MULTILINE)


def test_runs_of_a_missing_folder_exits_2_and_of_an_empty_one_says_so(tmp_path: Path) -> None:
    missing = run_cli(["runs", "--dest", str(tmp_path / "nowhere")], None)
    assert missing.returncode == 2 and "--dest" in missing.stderr
    (tmp_path / "empty").mkdir()
    empty = run_cli(["runs", "--dest", str(tmp_path / "empty")], None)
    assert empty.returncode == 0 and empty.stdout == ""
    assert f"no runs at {tmp_path / 'empty'}" in empty.stderr
