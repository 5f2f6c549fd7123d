"""Trainer rows: what a delivered record becomes as Parquet rows, read back by pyarrow.

No Prefect here: rows are encoded from records and read as plain Parquet files.
"""

from __future__ import annotations

import asyncio

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

from bench.rows_bench import capture, json_rows
from capture_core.errors import InvalidRecordError
from capture_core.rows import trainer_rows
from capture_core.rows.trainer_rows import batch_rows, read_rows, record_rows
from capture_core.run.batch_finalize import finalize_batch
from capture_core.run.rollout_io import plan_rollout_file, read_batch
from capture_core.store import TokenCaptureStore, compact
from capture_core.store.capture_layout import call_key
from capture_core.store.stored_json import ENCODE_OPTIONS as SORTED
from capture_core.testing.synthetic import RolloutShape, rollout_record, synthetic_rollout
from tests.support.reliability_figures import record_case


def item(prompt: list[int], generated: list[int], logprobs: list[float]) -> dict:
    return {
        "type": "message",
        "prompt_token_ids": prompt,
        "generation_token_ids": generated,
        "generation_log_probs": logprobs,
    }


def record(output: list[dict], **fields: object) -> dict:
    base = {"_ng_task_index": 3, "_ng_rollout_index": 1, "reward": 0.5}
    return {**base, "response": {"output": output}, **fields}


def test_a_main_chain_is_one_row_of_its_final_cumulative_tokens() -> None:
    chain = [item([1, 2], [3, 4], [-0.5, -0.25]), item([1, 2, 3, 4, 5], [6], [-1.0])]
    for projected in (False, True):
        (row,) = record_rows(record(chain), line=7, projected=projected)
        assert row.token_ids.tolist() == [1, 2, 3, 4, 5, 6]
        assert row.loss_mask.tolist() == [0, 0, 1, 1, 0, 1]
        assert row.generation_logprobs.tolist() == [0.0, 0.0, -0.5, -0.25, 0.0, -1.0]
    assert (row.rollout_id, row.trace_id, row.delivery) == ("3-1", "3-1:main", "main_chain")
    assert (row.reward, row.task_index, row.rollout_index, row.line) == (0.5, 3, 1, 7)


def test_items_that_do_not_extend_the_row_start_a_new_row_never_a_join() -> None:
    rewritten = [item([1, 2], [3], [-0.5]), item([1, 9], [4], [-0.1])]
    rows = record_rows(record(rewritten), line=1)
    assert [r.token_ids.tolist() for r in rows] == [[1, 2, 3], [1, 9, 4]]
    assert [r.loss_mask.tolist() for r in rows] == [[0, 0, 1], [0, 0, 1]]
    assert [r.trace_id for r in rows] == ["3-1:main", "3-1:main-1"]


def test_masked_records_and_records_without_tokens_or_id_have_no_rows() -> None:
    chain = [item([1], [2], [-0.5])]
    assert record_rows(record(chain, mask_sample=True), line=1) == []
    assert record_rows(record([{"type": "message", "content": "hi"}]), line=1) == []
    assert record_rows({"response": {"output": chain}}, line=1) == []


def test_a_training_traces_envelope_gives_one_row_per_trace_unchanged() -> None:
    traces = [
        {
            "trace_id": "3-1:c1",
            "token_ids": [1, 2, 3],
            "generation_logprobs": [0.0, 0.0, -0.5],
            "loss_mask": [0, 0, 1],
        },
        {
            "trace_id": "3-1:c2",
            "token_ids": [1, 5, 6, 7],
            "generation_logprobs": [0.0, 0.0, -0.1, -0.2],
            "loss_mask": [0, 0, 1, 1],
        },
    ]
    envelope = {"schema_version": 1, "rollout_id": "3-1", "traces": traces}
    rows = record_rows(record([item([1], [2], [-1.0])], training_traces=envelope), line=2)
    assert [r.trace_id for r in rows] == ["3-1:c1", "3-1:c2"]
    assert [r.token_ids.tolist() for r in rows] == [[1, 2, 3], [1, 5, 6, 7]]
    assert [r.loss_mask.tolist() for r in rows] == [[0, 0, 1], [0, 0, 1, 1]]
    assert {r.delivery for r in rows} == {"all_traces"}
    broken = {**traces[0], "loss_mask": [0, 1]}
    with pytest.raises(ValueError, match="equally long"):
        record_rows(record([], training_traces={**envelope, "traces": [broken]}), line=2)


def test_pyarrow_reads_the_part_with_narrow_types_and_zstd(tmp_path) -> None:
    chain = [item([1, 2], [3, 4], [-0.5, -0.25])]
    data = batch_rows([(1, record(chain), True), (2, record(chain, mask_sample=True), True)])
    path = tmp_path / "part-00000-0000000000000000.parquet"
    path.write_bytes(data)
    table = pq.read_table(path)
    assert table.num_rows == 1
    assert table.schema.field("token_ids").type.value_type == pa.int32()
    assert table.schema.field("generation_logprobs").type.value_type == pa.float32()
    assert table.schema.field("loss_mask").type.value_type == pa.int8()
    assert table.column("token_ids").to_pylist() == [[1, 2, 3, 4]]
    metadata = pq.ParquetFile(path).metadata
    assert metadata.row_group(0).column(0).compression == "ZSTD"
    assert pads.dataset(str(tmp_path), format="parquet").to_table().num_rows == 1


def test_token_ids_widen_to_int64_only_when_an_id_needs_it() -> None:
    big = [item([1], [2**31], [-0.5])]
    table = read_rows(batch_rows([(1, record(big), False)]))
    assert table.schema.field("token_ids").type.value_type == pa.int64()
    assert table.column("token_ids").to_pylist() == [[1, 2**31]]


def test_token_ids_that_are_not_lists_give_the_same_row() -> None:
    """Token ids in a tuple (a record built in Python, not parsed from JSON) take the slower
    conversion and give the same row as a list."""
    as_lists = record_rows(record([item([1, 2], [3, 4], [-0.5, -0.25])]), 1)
    as_tuples = record_rows(record([item((1, 2), (3, 4), [-0.5, -0.25])]), 1)  # type: ignore[arg-type]
    assert as_tuples[0].token_ids.tolist() == as_lists[0].token_ids.tolist() == [1, 2, 3, 4]
    assert as_tuples[0].loss_mask.tolist() == as_lists[0].loss_mask.tolist() == [0, 0, 1, 1]


def test_row_groups_stay_within_the_token_budget(monkeypatch) -> None:
    monkeypatch.setattr(trainer_rows, "ROW_GROUP_TOKENS", 10)
    chain = [item([1, 2, 3], [4, 5, 6], [-0.5] * 3)]
    records = [(i, record(chain, _ng_rollout_index=i), False) for i in range(5)]
    parquet = pq.ParquetFile(pa.BufferReader(batch_rows(records)))
    assert [parquet.metadata.row_group(g).num_rows for g in range(parquet.num_row_groups)] == [
        1,
        1,
        1,
        1,
        1,
    ]
    monkeypatch.setattr(trainer_rows, "ROW_GROUP_TOKENS", 12)
    parquet = pq.ParquetFile(pa.BufferReader(batch_rows(records)))
    assert parquet.num_row_groups == 3


def test_both_decodings_of_a_part_give_the_same_table(monkeypatch) -> None:
    """Pyarrow's threads give a chunk per row group, the calling thread one per column:
    the same rows, values, types and order either way (a large part's scanner path; a small
    part is read by the file reader whatever the threads)."""
    monkeypatch.setattr(trainer_rows, "ROW_GROUP_TOKENS", 10)
    monkeypatch.setattr(trainer_rows, "SMALL_PART_BYTES", 0)
    chains = [[item([i, i + 1, i + 2], [7, 8, i], [-0.5, -0.25, -0.125])] for i in range(5)]
    data = batch_rows([(i, record(c, _ng_rollout_index=i), False) for i, c in enumerate(chains)])
    threaded, single = read_rows(data), read_rows(data, use_threads=False)
    assert threaded.column("token_ids").num_chunks > 1  # the row groups decoded apart
    assert single.column("token_ids").num_chunks == 1
    assert threaded.schema.equals(single.schema, check_metadata=True)
    assert threaded.equals(single)
    assert threaded.column("rollout_index").to_pylist() == [0, 1, 2, 3, 4]


def test_encoding_is_deterministic_and_an_empty_batch_is_a_readable_part() -> None:
    chain = [(1, record([item([1, 2], [3], [-0.5])]), False)]
    assert batch_rows(chain) == batch_rows(chain)
    empty = read_rows(batch_rows([]))
    assert empty.num_rows == 0 and "token_ids" in empty.schema.names


@pytest.mark.parametrize(("fmt", "bound"), [("parquet", 0.35), ("arrow", 0.37)])
def test_a_finalized_batch_stores_its_rows_in_at_most_035x_the_json_bytes(
    tmp_path, fmt, bound
) -> None:
    """The bench's bytes figure, pinned: it does not depend on the machine. The Arrow part
    trades bytes for its read (LZ4): 0.352x on the bench's batch, 0.366x on this one."""
    shape = RolloutShape(turns=8, prompt_tokens=256, generated_tokens=128, tool_tokens=64)
    records = capture(str(tmp_path / "store"), 6, shape)
    rollouts = tmp_path / "rollouts.jsonl"
    rollouts.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    (batch,) = plan_rollout_file(str(rollouts), 100).batches
    lines = read_batch(str(rollouts), batch)
    source = TokenCaptureStore(str(tmp_path / "store"))
    finalized = asyncio.run(finalize_batch("r", batch, lines, source, rows=fmt))
    part = finalized.rows or b""
    assert finalized.rows_key is not None and finalized.rows_key.endswith(f".{fmt}")
    assert read_rows(part).num_rows == 6
    assert len(part) <= bound * len(json_rows(finalized))


NOT_FLOAT32 = [-1e39, 1e39, -3.5e38, float("nan"), float("-inf")]


@pytest.mark.integrity
@pytest.mark.parametrize("bad", NOT_FLOAT32, ids=str)
def test_the_rows_encoder_refuses_a_log_prob_float32_cannot_hold_naming_the_rollout(
    bad: float,
) -> None:
    """Defence in depth: captures refuse such values, and so does the encoder itself."""
    chain = [item([1, 2], [3, 4], [-0.5, -0.25]), item([1, 2, 3, 4, 5], [6], [bad])]
    for projected in (False, True):
        with pytest.raises(InvalidRecordError, match=r"rollout 3-1: row 3-1:main .* position 5 "):
            record_rows(record(chain), line=1, projected=projected)
    with pytest.raises(InvalidRecordError, match="rollout 3-1"):
        batch_rows([(1, record([item([1], [2], [-0.5])]), True), (2, record(chain), True)])
    trace = {
        "trace_id": "3-1:c1",
        "token_ids": [1, 2, 3],
        "generation_logprobs": [0.0, 0.0, bad],
        "loss_mask": [0, 0, 1],
    }
    envelope = {"schema_version": 1, "rollout_id": "3-1", "traces": [trace]}
    with pytest.raises(InvalidRecordError, match=r"row 3-1:c1 .* \(loss mask 1\)"):
        record_rows(record([], training_traces=envelope), line=1)
    record_case(f"rows encoder given a log prob of {bad} at a trained position")


def reseal_log_prob(store: TokenCaptureStore, key: str, value: float) -> None:
    """Write a stored entry's first log prob as `value`, sealed: bytes no put stores."""
    stored = orjson.loads(store.byte_store.get(key) or b"{}")
    del stored["s"]
    stored["l"][0] = value
    store.byte_store.delete([key])
    assert store.byte_store.create(key, compact.seal(orjson.dumps(stored, option=SORTED)))


@pytest.mark.integrity
def test_rows_agree_with_the_records_and_a_capture_beyond_float32_masks(
    store_location, tmp_path
) -> None:
    """Every row is its record's tokens, and its log probs are the record's as float32 at
    exactly the trained positions; a rollout whose capture holds -1e39 has a masked record
    with the reason and no row."""
    url, options = store_location
    store = TokenCaptureStore(url, options)
    shape = RolloutShape(turns=3, prompt_tokens=16, generated_tokens=4, tool_tokens=2)
    for i in range(3):
        for entry in synthetic_rollout(f"{i}-0", shape, seed=i):
            store.put_now(entry)
    last = synthetic_rollout("1-0", shape, seed=1)[-1].model_call_id
    reseal_log_prob(store, f"1-0/e/{call_key(last)}", -1e39)
    rollouts = tmp_path / "rollouts.jsonl"
    rollouts.write_bytes(b"".join(orjson.dumps(rollout_record(i, 0)) + b"\n" for i in range(3)))
    (batch,) = plan_rollout_file(str(rollouts), 100).batches
    lines = read_batch(str(rollouts), batch)
    source = TokenCaptureStore(url, options)
    finalized = asyncio.run(finalize_batch("r", batch, lines, source, rows="parquet"))
    records = [orjson.loads(line) for line in finalized.part.splitlines()]
    masked = records[1]
    assert masked["mask_sample"] is True and "float32" in masked["_ng_token_capture"]["error"]
    rows = read_rows(finalized.rows or b"").to_pylist()
    assert [row["rollout_id"] for row in rows] == ["0-0", "2-0"]
    for row, delivered in zip(rows, (records[0], records[2]), strict=True):
        items = delivered["response"]["output"]
        tokens = items[-1]["prompt_token_ids"] + items[-1]["generation_token_ids"]
        expected = np.zeros(len(tokens), dtype=np.float32)
        for carrier in (i for i in items if i.get("generation_token_ids")):
            start = len(carrier["prompt_token_ids"])
            expected[start : start + len(carrier["generation_token_ids"])] = carrier[
                "generation_log_probs"
            ]
        assert row["token_ids"] == tokens
        assert row["generation_logprobs"] == expected.tolist()
        assert np.isfinite(row["generation_logprobs"]).all()
        assert [i for i, m in enumerate(row["loss_mask"]) if m] == [
            i for i, lp in enumerate(expected) if lp != 0.0
        ]
    record_case("trainer rows agree with records; a capture holding -1e39 masks, no row")
