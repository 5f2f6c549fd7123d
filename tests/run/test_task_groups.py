"""Batch planning with `group_by="task"`: whole task groups per batch, refusals by name.

Plans are made from real files on local disk and on S3 (a moto server), where the reads
differ (ranged object reads against file reads).
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from capture_core.errors import InvalidInputError
from capture_core.run.rollout_io import plan_rollout_file, read_batch
from capture_core.run.run_layout import RunManifest
from capture_core.run.task_groups import TaskGroups
from capture_core.testing.synthetic import rollout_record
from tests.conftest import make_bucket
from tests.support.pipeline_helpers import write_rollouts


@pytest.fixture(params=["local", "s3"])
def rollouts_url(request: pytest.FixtureRequest, tmp_path) -> tuple[str, dict[str, Any] | None]:
    """Where a test writes its rollout file, with the storage options to read it."""
    if request.param == "local":
        return str(tmp_path / "in" / "rollouts.jsonl"), None
    options = request.getfixturevalue("s3_options")
    return f"s3://{make_bucket(options)}/in/rollouts.jsonl", options


def interleaved(seed: int, tasks: int, window: int) -> list[dict]:
    """Tasks of 1 to 7 rollouts each; the rollouts of every `window` consecutive tasks are
    shuffled together, so groups interleave but each closes within its window."""
    rng = random.Random(seed)
    sizes = {task: rng.randint(1, 7) for task in range(tasks)}
    records = []
    for start in range(0, tasks, window):
        block = [
            rollout_record(task, i)
            for task in range(start, min(start + window, tasks))
            for i in range(sizes[task])
        ]
        rng.shuffle(block)
        records += block
    return records


def written(url: str, options: dict | None, records: list[dict]) -> str:
    return write_rollouts(url, records, options, extra_lines=[b"\n"])


def test_a_batch_never_splits_a_task_and_grows_only_to_close_its_groups(rollouts_url) -> None:
    url, options = rollouts_url
    for seed in range(4):
        records = interleaved(seed, tasks=30, window=3)
        written(url, options, records)
        sizes: dict[int, int] = {}
        for record in records:
            sizes[record["_ng_task_index"]] = sizes.get(record["_ng_task_index"], 0) + 1
        batch_size = 1 + seed * 3
        plan = plan_rollout_file(url, batch_size, options, group_by="task", max_group_size=25)
        where: dict[int, int] = {}
        for batch in plan.batches:
            tasks = [p.record["_ng_task_index"] for p in read_batch(url, batch, options)]
            assert len(tasks) == batch.lines
            for task in tasks:
                assert where.setdefault(task, batch.index) == batch.index, (seed, task)
            assert batch.group_sizes == {task: sizes[task] for task in set(tasks)}
            for n in range(batch_size, batch.lines):  # no earlier cut held whole groups
                before = tasks[:n]
                assert any(before.count(t) < sizes[t] for t in before), (seed, batch.index, n)
            last = batch is plan.batches[-1]
            assert batch.lines >= batch_size or last
        assert plan.rollouts == len(records)
        assert sum(b.group_sizes[t] for b in plan.batches for t in b.group_sizes) == len(records)


def test_the_default_plan_is_unchanged_and_carries_no_groups(rollouts_url) -> None:
    url, options = rollouts_url
    written(url, options, interleaved(7, tasks=12, window=4))
    plan = plan_rollout_file(url, 5, options)
    assert plan == plan_rollout_file(url, 5, options, group_by="none", max_group_size=1)
    assert [b.lines for b in plan.batches][:-1] == [5] * (len(plan.batches) - 1)
    assert all(b.group_sizes == {} for b in plan.batches)
    assert "group_sizes" in plan.batches[0].model_dump()  # a field, empty: no row column filled
    assert plan.batches[0].group_size({"_ng_task_index": 0}) is None


def test_a_sorted_file_with_a_group_at_the_cap_is_planned(rollouts_url) -> None:
    url, options = rollouts_url
    records = [
        rollout_record(task, i) for task, size in ((0, 4), (1, 1), (2, 4)) for i in range(size)
    ]
    written(url, options, records)
    plan = plan_rollout_file(url, 2, options, group_by="task", max_group_size=4)
    assert [(b.first_line, b.lines, b.group_sizes) for b in plan.batches] == [
        (1, 4, {0: 4}),
        (5, 5, {1: 1, 2: 4}),
    ]
    assert plan.batches[1].group_size({"_ng_task_index": "2"}) == 4  # read as rows read it


def test_a_task_larger_than_the_cap_is_refused_by_name(rollouts_url) -> None:
    url, options = rollouts_url
    records = [rollout_record(0, 0)] + [rollout_record(9, i) for i in range(5)]
    written(url, options, records)
    with pytest.raises(InvalidInputError) as refused:
        plan_rollout_file(url, 2, options, group_by="task", max_group_size=4)
    message = str(refused.value)
    assert "task 9 has 5 rollouts (lines 2-6)" in message
    assert "--max-group-size 4" in message and "at least 5" in message
    assert "Nothing was finalized" in message


def test_a_task_spread_across_the_file_is_refused_naming_its_lines(rollouts_url) -> None:
    url, options = rollouts_url
    records = [rollout_record(3, 0)] + [rollout_record(t, 0) for t in range(10, 20)]
    records.append(rollout_record(3, 1))
    written(url, options, records)
    with pytest.raises(InvalidInputError) as refused:
        plan_rollout_file(url, 2, options, group_by="task", max_group_size=3)
    message = str(refused.value)
    assert "the batch from line 1 cannot close" in message
    assert "task 3's 2 rollouts are spread over lines 1-12" in message
    assert "Sort the file by task index (_ng_task_index)" in message
    assert "raise --max-group-size" in message
    assert (
        plan_rollout_file(url, 2, options, group_by="task", max_group_size=11).batches[0].lines
        == 12
    )


def test_records_without_an_integer_task_index_are_refused_by_line(rollouts_url) -> None:
    url, options = rollouts_url
    no_index = {"_ng_rollout_id": "free-form", "reward": 1.0}
    fractional = {**rollout_record(0, 1), "_ng_task_index": 1.5}
    records = [rollout_record(0, 0), no_index, fractional]
    write_rollouts(url, records, options, extra_lines=[b"{not json\n"])
    with pytest.raises(InvalidInputError) as refused:
        plan_rollout_file(url, 10, options, group_by="task")
    message = str(refused.value)
    assert "line 2, line 3 (_ng_task_index 1.5 is not an integer) have none" in message
    assert "finalize without --group-by task" in message
    plan = plan_rollout_file(url, 10, options)  # the default still plans it (and masks them)
    assert plan.rollouts == 4


def test_a_bad_group_setting_is_refused() -> None:
    with pytest.raises(InvalidInputError, match="unknown group_by 'prompt'; use one of none, task"):
        plan_rollout_file("/nonexistent", 1, group_by="prompt")
    with pytest.raises(InvalidInputError, match="max_group_size must be at least 1"):
        plan_rollout_file("/nonexistent", 1, group_by="task", max_group_size=0)


def test_a_default_manifest_is_unchanged_and_a_grouped_one_records_its_setting() -> None:
    fields = {
        "run_id": "r",
        "rollouts": "/in.jsonl",
        "rollouts_sha256": "0" * 64,
        "store": "/store",
        "builder": "prefix_merging",
        "batch_size": 500,
        "batches": 1,
    }
    default = RunManifest(**fields).encoded()
    assert b"group" not in default
    assert RunManifest(**fields, group_by=None, max_group_size=1000).encoded() == default
    grouped = RunManifest(**fields, group_by="task", max_group_size=64).encoded()
    assert b'"group_by":"task"' in grouped and b'"max_group_size":64' in grouped
    assert RunManifest.model_validate_json(grouped).group_by == "task"


def test_a_task_the_first_pass_did_not_count_means_the_file_changed() -> None:
    first = [(1, b"{}\n", rollout_record(0, 0))]
    groups = TaskGroups.count("/in.jsonl", iter(first), cap=4)
    with pytest.raises(InvalidInputError, match="changed while it was planned"):
        groups.add(rollout_record(1, 0))
