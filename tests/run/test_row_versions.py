"""Trainer rows' weight versions: their cost in bytes, `group_size`, and staleness masking.

The seeded workload is the shipped agent captures (`capture_core.testing.agent_captures`),
finalized from a local store with one weight version per call; Parquet bytes do not depend
on the machine, so the cost of the version columns is pinned exactly as a ratio.
"""

from __future__ import annotations

import asyncio
import random

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from capture_core.dataset import (
    RowConsumer,
    stale_token_count,
    staleness_mask,
    unknown_version_count,
)
from capture_core.delivery import finalize_rollout_token_capture
from capture_core.errors import InvalidInputError, InvalidRecordError
from capture_core.records import TokenEntry
from capture_core.rows import trainer_rows
from capture_core.rows.row_provenance import NO_WEIGHT_VERSION
from capture_core.store import TokenCaptureStore
from capture_core.testing.agent_captures import agent_rollouts
from capture_core.testing.synthetic import RolloutShape, rollout_record
from tests.api.test_finalized_input import finalized
from tests.run.test_trainer_rows import item
from tests.run.test_trainer_rows import record as chain_record
from tests.support.reliability_figures import record_case
from tests.support.weight_versions import rule, versioned_rollout

VERSION_COLUMNS = [
    "weight_version",
    "min_weight_version",
    "max_weight_version",
    "replicas",
    "group_size",
    "group_delivered",
]
"""The columns rows gained for asynchronous RL: weight versions and GRPO groups."""
BYTES_GOAL = 1.05
"""Rows with one version per call grow by at most 5% in bytes over rows without those
columns (issue 50; 1.026x with the five of issue 50, 1.027x with `group_delivered`)."""


@pytest.fixture(scope="module")
def workload(tmp_path_factory) -> list[tuple[int, dict, bool]]:
    """64 seeded agent rollouts, finalized with one version per call (several per rollout:
    weights move between calls), as `(line, record, projected)`."""
    store = TokenCaptureStore(str(tmp_path_factory.mktemp("store")))
    emitted = []
    for n, rollout in enumerate(agent_rollouts(64, seed=3)):
        for i, entry in enumerate(rollout.entries):
            version = 10 + n // 8 + i // 3
            stamped = {"start_weight_version": version, "end_weight_version": version}
            data = {**entry.model_dump(), **stamped, "replica": f"replica-{n % 4}"}
            store.put_now(TokenEntry.model_validate(data))
        record = dict(rollout.record)
        built = asyncio.run(finalize_rollout_token_capture(record, store))
        assert built is not None
        emitted.append((n + 1, record, built["rebuilt_response"] is not None))
    return emitted


def without_version_columns(rows: list[trainer_rows.TrainerRow]) -> bytes:
    """The rows part as it was before rows carried versions: same options, fewer columns."""
    table = trainer_rows.rows_table(rows).drop_columns(VERSION_COLUMNS)
    options = dict(trainer_rows.WRITE_OPTIONS)
    options["use_dictionary"] = ["rollout_id", "trace_id", "delivery"]
    sink = pa.BufferOutputStream()
    with pq.ParquetWriter(sink, table.schema, **options) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def test_one_version_per_call_grows_row_bytes_by_at_most_five_percent(workload) -> None:
    rows = trainer_rows.emitted_rows(workload)
    assert len(rows) > 40
    table = trainer_rows.rows_table(rows)
    assert pc_distinct_versions(table) > 10, "the workload moves weights between calls"
    with_versions = trainer_rows.encode_rows(rows)
    ratio = len(with_versions) / len(without_version_columns(rows))
    assert ratio <= BYTES_GOAL, f"rows grew {ratio:.4f}x with versions"
    assert trainer_rows.encode_rows(trainer_rows.emitted_rows(workload)) == with_versions


def pc_distinct_versions(table: pa.Table) -> int:
    values = table.column("weight_version").combine_chunks().flatten().to_numpy()
    return len(set(values.tolist()) - {NO_WEIGHT_VERSION})


def test_group_size_is_the_given_task_size_else_null(workload) -> None:
    tasks = {record["_ng_task_index"] for _, record, _ in workload}
    sizes = {task: 3 + task for task in tasks}
    table = trainer_rows.rows_table(trainer_rows.emitted_rows(workload, sizes))
    assert table.schema.field("group_size").type == pa.int32()
    tasks_of_rows = table.column("task_index").to_pylist()
    assert table.column("group_size").to_pylist() == [sizes[t] for t in tasks_of_rows]
    plain = trainer_rows.rows_table(trainer_rows.emitted_rows(workload))
    assert plain.column("group_size").null_count == plain.num_rows


@pytest.mark.integrity
def test_group_delivered_counts_rollouts_not_rows(workload) -> None:
    """Each row's `group_delivered` is its task's distinct rollouts among the part's rows,
    the count docs/async.md tells a trainer to make; masked rollouts have no rows, and a
    record whose items do not extend one another has several."""
    sizes = {record["_ng_task_index"]: 8 for _, record, _ in workload}
    split = [item([1, 2], [3], [-0.5]), item([9, 9], [4], [-0.25])]  # two rows, one rollout
    extra = [(len(workload) + 1, {**chain_record(split), "_ng_task_index": 99}, False)]
    table = trainer_rows.rows_table(trainer_rows.emitted_rows([*workload, *extra], sizes | {99: 3}))
    assert table.schema.field("group_delivered").type == pa.int32()
    counted = table.group_by("task_index").aggregate(
        [("rollout_id", "count_distinct"), ("rollout_id", "count")]
    )
    distinct = dict(zip(*counted.select([0, 1]).to_pydict().values(), strict=True))
    carried = table.select(["task_index", "group_delivered"]).to_pylist()
    assert all(row["group_delivered"] == distinct[row["task_index"]] for row in carried)
    masked = sum(1 for _, record, _ in workload if record.get("mask_sample"))
    assert masked and any(count < 8 for count in distinct.values()), "masked rollouts show"
    assert [r["group_delivered"] for r in carried if r["task_index"] == 99] == [1, 1]
    plain = trainer_rows.rows_table(trainer_rows.emitted_rows(workload))
    assert plain.column("group_delivered").null_count == plain.num_rows
    record_case("group_delivered counts a group's rollouts, never its rows")


@pytest.mark.parametrize(("current", "lag"), [(10, 0), (14, 2), (20, 3), (12, 100), (3, 1)])
def test_trainable_mask_is_the_rule_at_every_position(workload, current, lag) -> None:
    table = pq.read_table(pa.BufferReader(trainer_rows.batch_rows(workload)))
    masked = staleness_mask(table, current, lag)
    assert masked.column_names == [*table.column_names, "trainable_mask"]
    assert masked.schema.field("trainable_mask").type == pa.list_(
        pa.field("element", pa.int8(), nullable=False)
    )
    wrong = stale = 0
    for row in masked.select(["loss_mask", "weight_version", "trainable_mask"]).to_pylist():
        expected = rule(row["loss_mask"], row["weight_version"], current, lag)
        wrong += row["trainable_mask"] != expected
        stale += sum(row["loss_mask"]) - sum(expected)
    assert wrong == 0 and stale_token_count(masked) == stale
    assert masked.drop_columns(["trainable_mask"]).equals(table), "nothing else changes"


def test_staleness_masking_follows_chunks_and_slices(workload) -> None:
    table = trainer_rows.rows_table(trainer_rows.emitted_rows(workload))
    pieces = pa.concat_tables([table.slice(0, 7), table.slice(7, 20), table.slice(27)])
    assert pieces.column("loss_mask").num_chunks == 3
    assert staleness_mask(pieces, 14, 2).equals(staleness_mask(table, 14, 2))
    again = staleness_mask(staleness_mask(table, 14, 2), 20, 0)
    assert again.equals(staleness_mask(table, 20, 0)), "a second mask replaces the first"


@pytest.mark.integrity
def test_unknown_versions_follow_the_stated_policy_and_are_never_stale(tmp_path) -> None:
    store = TokenCaptureStore(str(tmp_path))
    for entry in versioned_rollout("7-0", base=50, shape=RolloutShape(turns=4)):
        store.put_now(entry)
    record, _ = finalized(rollout_record(7, 0), store, "main_chain")
    table = trainer_rows.rows_table(trainer_rows.record_rows(record, 1, projected=True))
    with pytest.raises(InvalidInputError, match=r"row-table: \d+ of its \d+ trainable tokens"):
        staleness_mask(table, 60, 1, "row-table")
    for policy in ("mask", "keep"):
        masked = staleness_mask(table, 60, 1, unknown_version=policy)
        (row,) = masked.to_pylist()
        positions = zip(row["loss_mask"], row["weight_version"], row["trainable_mask"], strict=True)
        unknown = [trainable for loss, version, trainable in positions if loss and version < 0]
        assert unknown and set(unknown) == {int(policy == "keep")}, policy
        assert unknown_version_count(masked) == len(unknown)
        pairs = zip(row["loss_mask"], row["weight_version"], strict=True)
        stale = sum(bool(m) and 0 <= v < 59 for m, v in pairs)
        assert stale_token_count(masked) == stale > 0, "unknown is never counted as stale"
    with pytest.raises(InvalidInputError, match="'keep'.*'mask'"):
        staleness_mask(table, 60, 1, unknown_version="drop")  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="unknown_version was given without"):
        RowConsumer(str(tmp_path), "run", "trainer", unknown_version="keep")
    record_case("tokens of unknown version are neither stale nor masked without a policy")


@pytest.mark.parametrize(
    ("given", "missing"),
    [
        ({"current_weight_version": 5}, "max_weight_lag"),
        ({"max_weight_lag": 2}, "current_weight_version"),
    ],
)
def test_one_staleness_parameter_alone_is_refused_by_name(tmp_path, given, missing) -> None:
    with pytest.raises(InvalidInputError, match=f"without {missing}"):
        RowConsumer(str(tmp_path), "run", "trainer", **given)


@pytest.mark.parametrize(("current", "lag"), [(-1, 2), (5, -1), (True, 1), (5, 1.5), ("5", 1)])
def test_a_staleness_parameter_that_is_not_a_count_is_refused(tmp_path, current, lag) -> None:
    table = trainer_rows.rows_table([])
    with pytest.raises(InvalidInputError, match="integer 0 or more"):
        staleness_mask(table, current, lag)
    with pytest.raises(InvalidInputError, match="integer 0 or more"):
        RowConsumer(
            str(tmp_path), "run", "trainer", current_weight_version=current, max_weight_lag=lag
        )


def test_rows_without_weight_versions_are_refused_by_name() -> None:
    old = trainer_rows.rows_table([]).drop_columns(VERSION_COLUMNS)
    with pytest.raises(InvalidInputError, match="no weight_version column"):
        staleness_mask(old, 5, 1)


def test_an_edited_key_that_does_not_describe_the_tokens_writes_no_row(tmp_path) -> None:
    store = TokenCaptureStore(str(tmp_path))
    for entry in versioned_rollout("7-0", base=5, shape=RolloutShape(turns=3)):
        store.put_now(entry)
    record, _ = finalized(rollout_record(7, 0), store, "main_chain")
    record["token_provenance"]["chain"].pop()
    with pytest.raises(InvalidRecordError, match="names 2 calls for 3 token-bearing items"):
        trainer_rows.record_rows(record, 1, projected=True)
    traced, _ = finalized(rollout_record(7, 0), store, "all_traces")
    (trace,) = traced["token_provenance"]["traces"].values()
    trace["spans"][0] = [[5, random.Random(0).randrange(1000, 2000)]]
    with pytest.raises(InvalidRecordError, match="does not describe the delivered tokens"):
        trainer_rows.record_rows(traced, 1)
    for edited in ([["5", 3]], [[-1, 3]], [[5]], [[2**31, 1]], "5"):
        trace["spans"][0] = edited
        with pytest.raises(InvalidRecordError, match="the record was edited after finalize"):
            trainer_rows.record_rows(traced, 1)


def test_staleness_mask_is_vectorized_over_a_large_part() -> None:
    """Two million positions of random masks and versions (-1 included): the flattened
    mask equals the rule computed over the whole arrays at once."""
    lengths = np.full(1000, 2000)
    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
    rng = np.random.default_rng(0)
    loss = rng.integers(0, 2, lengths.sum()).astype(np.int8)
    versions = rng.integers(-1, 30, lengths.sum()).astype(np.int32)
    table = pa.table(
        {
            "loss_mask": pa.ListArray.from_arrays(offsets, pa.array(loss)),
            "weight_version": pa.ListArray.from_arrays(offsets, pa.array(versions)),
        }
    )
    masked = staleness_mask(table, 25, 4, unknown_version="mask")
    flat = masked.column("trainable_mask").combine_chunks().flatten().to_numpy()
    assert np.array_equal(flat, ((loss != 0) & (versions >= 21)).astype(np.int8))
    kept = staleness_mask(table, 25, 4, unknown_version="keep").column("trainable_mask")
    flat = kept.combine_chunks().flatten().to_numpy()
    assert np.array_equal(flat, ((loss != 0) & ((versions >= 21) | (versions < 0))).astype(np.int8))
    reaching_back = staleness_mask(table, 3, 10, unknown_version="mask").column("trainable_mask")
    flat = reaching_back.combine_chunks().flatten().to_numpy()
    assert np.array_equal(flat, ((loss != 0) & (versions >= 0)).astype(np.int8))
