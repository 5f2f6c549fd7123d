"""Every task run is named, in one style, for what it did to which batch, run or file.

The names are read back from the session's Prefect API after real runs: a finalize with a
batch that fails (its rollouts' captures are unavailable), the retire of what it handed off,
a dispatch-time clear and an inbox pass.
"""

from __future__ import annotations

import re

import orjson

from capture_core.store import TokenCaptureStore
from tests.support.pipeline_helpers import FAILING_FREEZE_SOURCE, make_batch, write_rollouts
from tests.support.prefect_api_reads import eventually, task_runs_of
from tokcap.flows.clear import dispatch_clear
from tokcap.flows.finalize import finalize_run, retire_uploaded
from tokcap.flows.inbox import FileSettings, finalize_inbox

PREFECT_SUFFIX = re.compile(r"-[0-9a-f]{3}$")


def task_run_names(state, count: int) -> list[str]:
    """The task run names of a flow run, once `count` of them reached the API."""
    runs = eventually(
        lambda: task_runs_of(state.state_details.flow_run_id),
        lambda found: len(found) >= count,
        f"{count} task runs",
    )
    # A subflow's stand-in task run is shown by Prefect as the subflow run, with its name.
    return sorted(run.name for run in runs if not run.state.state_details.child_flow_run_id)


def assert_one_style(names: list[str]) -> None:
    """Each name says what was done to what: words, no task name with a Prefect suffix."""
    for name in names:
        assert not PREFECT_SUFFIX.search(name), name
        assert " " in name and name[0].islower(), name


def test_finalize_and_retire_task_runs_name_each_batch_in_one_style(tmp_path, prefect_api) -> None:
    root, dest = str(tmp_path / "store"), str(tmp_path / "dest")
    store = TokenCaptureStore(root)
    records = make_batch(store, 2) + make_batch(store, 2, task=8)  # batch 1 cannot be frozen
    rollouts = write_rollouts(str(tmp_path / "in.jsonl"), records)
    source = {"store": FAILING_FREEZE_SOURCE, "source_kwargs": {"root": root}}
    state = finalize_run(
        rollouts, dest=dest, run_id="names", batch_size=2, **source, return_state=True
    )
    assert state.is_failed()
    names = task_run_names(state, 12)
    assert_one_style(names)
    assert names == sorted(
        [
            f"check store {FAILING_FREEZE_SOURCE} and destination {dest}",
            f"check store {FAILING_FREEZE_SOURCE} holds captures of {rollouts}",
            f"plan batches of 2 from {rollouts}",
            f"claim run id names at {dest}",
            f"prepare receipt storage at {dest}",
            "find receipts of run names",
            "finalize batch 0 (lines 1-2)",
            "finalize batch 1 (lines 3-4)",
            "upload batch 0 (lines 1-2)",
            "retire batch 0 (lines 1-2)",
            "describe failed batch 1 (lines 3-4)",
            "write report of run names",
        ]
    ), names
    retired = retire_uploaded(dest, "names", root, return_state=True)
    assert retired.is_completed()
    names = task_run_names(retired, 4)
    assert_one_style(names)
    assert "retire batch 0 (lines 1-2)" in names and "load manifest of run names" in names
    assert "mark retired rollouts in ledger of run names" in names


def test_clear_and_inbox_task_runs_name_their_file(tmp_path, prefect_api) -> None:
    root, dest, inbox = (str(tmp_path / name) for name in ("store", "dest", "inbox"))
    records = make_batch(TokenCaptureStore(root), 1)
    rollouts = write_rollouts(f"{inbox}/day-1.jsonl", records)
    with open(tmp_path / "other.jsonl", "wb") as f:
        f.write(orjson.dumps({"_ng_task_index": 9, "_ng_rollout_index": 0}) + b"\n")
    cleared = dispatch_clear(str(tmp_path / "other.jsonl"), root, return_state=True)
    names = task_run_names(cleared, 2)
    assert_one_style(names)
    assert names == [
        f"clear captures of 1 rollout in {root}",
        f"read rollout ids of {tmp_path / 'other.jsonl'}",
    ], names
    state = finalize_inbox(FileSettings(inbox=inbox, store=root, dest=dest), return_state=True)
    assert state.is_completed()
    names = task_run_names(state, 4)
    assert_one_style(names)
    assert f"scan inbox {inbox}" in names, names
    assert any(name.startswith("claim attempt of run ") for name in names), names
    assert any(name.startswith("release attempt 0 of run ") for name in names), names
    assert rollouts.endswith("day-1.jsonl")
