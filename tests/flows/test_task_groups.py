"""`finalize_run(group_by="task")` on a real Prefect test server, local disk and S3 (moto):
no part splits a task's rollouts, refusals come before anything runs, a retrigger keeps it."""

from __future__ import annotations

import random
from pathlib import Path

import orjson
import pyarrow.parquet as pq
import pytest

from capture_core.errors import InvalidInputError, RunIdInUseError
from capture_core.run.receipt import receipt_key
from capture_core.run.rollout_io import plan_rollout_file, split_lines
from capture_core.run.run_layout import RunLayout, read_ledger
from capture_core.storage import open_byte_store
from capture_core.store import TokenCaptureStore
from capture_core.testing.synthetic import rollout_record
from capture_core.testing.trace_shapes import episode, write_episode
from tests.support.pipeline_helpers import (
    FAILING_FREEZE_SOURCE,
    batch_entries,
    finalize_locations,
    write_rollouts,
)
from tests.support.reliability_figures import record_case
from tokcap.flows.finalize import finalize_run
from tokcap.flows.retrigger import retrigger_failed

pytestmark = pytest.mark.usefixtures("prefect_api")


def captured_groups(store: TokenCaptureStore, sizes: dict[int, int], seed: int) -> list[dict]:
    """Capture every rollout of each task; records of each two neighbouring tasks shuffled
    together (interleaved, yet each group closes within its pair)."""
    rng = random.Random(seed)
    records = []
    tasks = sorted(sizes)
    for pair in (tasks[i : i + 2] for i in range(0, len(tasks), 2)):
        block = [rollout_record(task, i) for task in pair for i in range(sizes[task])]
        rng.shuffle(block)
        records += block
    for record in records:
        for entry in batch_entries(f"{record['_ng_task_index']}-{record['_ng_rollout_index']}"):
            store.put_now(entry)
    return records


def tasks_per_part(dest: str, run_id: str, options: dict | None, folder: str) -> list[list[int]]:
    """The task index of each record (or row) of each part of the run, part by part."""
    byte_store = open_byte_store(dest, options)
    parts = []
    for key in sorted(byte_store.list_prefix(f"{run_id}/{folder}")):
        data = byte_store.get(key) or b""
        if folder == "rows":
            import pyarrow as pa

            parts.append(pq.read_table(pa.BufferReader(data)).column("task_index").to_pylist())
        else:
            parts.append(
                [orjson.loads(x)["_ng_task_index"] for x in split_lines([data]) if x.strip()]
            )
    return parts


def rows_column(dest: str, run_id: str, options: dict | None, names: list[str]) -> list[tuple]:
    """The named columns of every row of the run's rows parts, row by row."""
    import pyarrow as pa

    byte_store = open_byte_store(dest, options)
    found = []
    for key in sorted(byte_store.list_prefix(f"{run_id}/rows")):
        table = pq.read_table(pa.BufferReader(byte_store.get(key) or b""), columns=names)
        found += list(zip(*(table.column(n).to_pylist() for n in names), strict=True))
    return found


def split_tasks(parts: list[list[int]]) -> set[int]:
    """The tasks found in more than one part."""
    seen: dict[int, set[int]] = {}
    for n, tasks in enumerate(parts):
        for task in tasks:
            seen.setdefault(task, set()).add(n)
    return {task for task, where in seen.items() if len(where) > 1}


@pytest.mark.integrity
def test_no_part_splits_a_task_group_of_any_size(locations) -> None:
    options = locations["options"]
    store = TokenCaptureStore(locations["store"], options)
    sizes = {0: 3, 1: 1, 2: 5, 3: 2, 4: 4, 5: 1}
    records = captured_groups(store, sizes, seed=50)
    write_rollouts(locations["rollouts"], records, options)
    summary = finalize_locations(
        locations, "grouped", batch_size=2, group_by="task", rows="parquet"
    )
    assert summary.ok and summary.handed_off == len(records) == 16 and summary.masked == 0
    for folder in ("records", "rows"):
        parts = tasks_per_part(locations["dest"], "grouped", options, folder)
        assert len(parts) > 2 and split_tasks(parts) == set(), (folder, parts)
        assert sorted(t for part in parts for t in part) == sorted(
            r["_ng_task_index"] for r in records
        )
    manifest = RunLayout(open_byte_store(locations["dest"], options), "grouped").read_manifest()
    assert manifest is not None and manifest.group_by == "task"
    carried = rows_column(locations["dest"], "grouped", options, ["task_index", "group_size"])
    assert carried and all(size == sizes[task] for task, size in carried), carried

    default = finalize_locations(locations, "plain", batch_size=2)
    assert default.ok
    plain = tasks_per_part(locations["dest"], "plain", options, "records")
    assert split_tasks(plain), "without group_by the same input splits groups across parts"
    assert all(len(part) == 2 for part in plain[:-1])
    record_case("a GRPO group is never split across parts")


@pytest.mark.integrity
def test_a_group_that_cannot_close_is_refused_before_anything_runs(locations) -> None:
    options = locations["options"]
    store = TokenCaptureStore(locations["store"], options)
    records = captured_groups(store, {3: 1, 10: 2, 11: 2}, seed=1)
    records = [rollout_record(3, 1), *records]  # task 3 now starts the file and ends far away
    write_rollouts(locations["rollouts"], records, options)
    with pytest.raises(InvalidInputError) as refused:
        finalize_locations(locations, "spread", batch_size=1, group_by="task", max_group_size=2)
    assert "task 3's 2 rollouts are spread over lines 1-" in str(refused.value)
    assert "Sort the file by task index" in str(refused.value)
    dest = open_byte_store(locations["dest"], options)
    assert dest.list_prefix("spread") == [], "no manifest, part or receipt was written"
    assert store.byte_store.list_prefix("10-0"), "no capture was touched"
    assert not any(key.endswith("FROZEN") for key in store.byte_store.list_prefix("10-0"))
    record_case("a task group that cannot close within the cap is refused before finalizing")


@pytest.mark.integrity
@pytest.mark.parametrize("delivery", ["main_chain", "all_traces"])
def test_rows_tell_how_many_of_a_group_were_delivered(locations, delivery) -> None:
    """Task 7: 7-0 forks (two traces under all_traces), 7-1 lost a call and masks; task 8's
    two rollouts deliver. Counting rows would take task 7 for whole under all_traces; the
    rows' `group_delivered` counts its delivered rollouts, as distinct rollout ids do."""
    options = locations["options"]
    store = TokenCaptureStore(locations["store"], options)
    shapes = {56: "fork", 57: "lost", 64: "plain", 65: "plain"}  # 7-0, 7-1, 8-0, 8-1
    episodes = [episode(index, shape, seed=4) for index, shape in shapes.items()]
    for ep in episodes:
        write_episode(store, ep)
    write_rollouts(locations["rollouts"], [ep.record for ep in episodes], options)
    run_id = f"members-{delivery.replace('_', '-')}"
    settings = {"rows": "parquet", "delivery": delivery, "retire_after_consumer": "trainer"}
    summary = finalize_locations(locations, run_id, batch_size=1, group_by="task", **settings)
    assert summary.handed_off == 4 and summary.masked >= 1
    names = ["task_index", "rollout_id", "group_size", "group_delivered"]
    rows = rows_column(locations["dest"], run_id, options, names)
    delivered: dict[int, set[str]] = {}
    for task, rollout_id, _, _ in rows:
        delivered.setdefault(task, set()).add(rollout_id)
    assert "7-1" not in delivered.get(7, set()) and delivered[8] == {"8-0", "8-1"}
    assert all(size == 2 and count == len(delivered[task]) for task, _, size, count in rows), rows
    if delivery == "all_traces":
        sevens = [row for row in rows if row[0] == 7]
        assert len(sevens) == 2, "7-0's two traces: as many rows as the group's size"
        assert all(count == 1 < size for _, _, size, count in sevens), sevens
    plain = finalize_locations(locations, f"{run_id}-plain", batch_size=1, **settings)
    assert plain.handed_off == 4
    ungrouped = rows_column(locations["dest"], f"{run_id}-plain", options, names[2:])
    assert ungrouped and all(row == (None, None) for row in ungrouped), ungrouped
    record_case(f"rows tell how many of a group's rollouts were delivered ({delivery})")


def test_a_retrigger_keeps_group_by_and_its_cap(tmp_path: Path) -> None:
    root, dest = str(tmp_path / "store"), str(tmp_path / "dest")
    store = TokenCaptureStore(root)
    sizes = {7: 3, 8: 2, 9: 3}  # task 8's freezes fail in the first run
    records = captured_groups(store, sizes, seed=8)
    rollouts = write_rollouts(str(tmp_path / "in.jsonl"), records)
    settings = {"batch_size": 2, "group_by": "task", "max_group_size": 3}
    failing = {"store": FAILING_FREEZE_SOURCE, "source_kwargs": {"root": root}}
    state = finalize_run(
        rollouts, dest=dest, run_id="regroup", **failing, **settings, return_state=True
    )
    assert state.is_failed()
    manifest = RunLayout(open_byte_store(dest), "regroup").read_manifest()
    assert manifest is not None and (manifest.group_by, manifest.max_group_size) == ("task", 3)

    report = retrigger_failed(dest, "regroup", root)
    assert not report.still_failing
    planned = plan_rollout_file(rollouts, 2, group_by="task", max_group_size=3)
    assert [b.group_sizes for b in planned.batches] == [{7: 3, 8: 2}, {9: 3}]
    stored = {
        key.rsplit("/", 1)[-1] for key in open_byte_store(dest).list_prefix("regroup/receipts")
    }
    assert {receipt_key(b) for b in planned.batches} <= stored, "the grouped batches' receipts"
    parts = tasks_per_part(dest, "regroup", None, "records")
    assert len(parts) == 2 and split_tasks(parts) == set()
    ledger = read_ledger(open_byte_store(dest), "regroup")
    assert ledger is not None and all(line.handed_off for line in ledger)
    with pytest.raises(RunIdInUseError, match="group by task is now None"):
        finalize_run(rollouts, root, dest, "regroup", batch_size=2)
