"""Trainer rows as an Arrow IPC part (`rows="arrow"`): the same rows as the Parquet part.

The Arrow part is the format a trainer reads fastest; these tests pin that it holds exactly
what the Parquet part of the same batch holds, reads the same way through `read_rows`
(threads or not, projections, skips), stays deterministic, and is a plain Arrow IPC file
with LZ4 buffers that any Arrow reader opens.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.ipc as ipc
import pytest

from capture_core.errors import InvalidInputError
from capture_core.rows import trainer_rows
from capture_core.rows.trainer_rows import batch_rows, count_rows, is_arrow_part, read_rows
from capture_core.run.run_layout import ack_key, is_rows_key, rows_key
from tests.run.test_trainer_rows import item, record


def emitted(n: int = 5) -> list[tuple[int, dict, bool]]:
    chains = [[item([i, i + 1, i + 2], [7, 8, i], [-0.5, -0.25, -0.125])] for i in range(n)]
    return [(i, record(c, _ng_rollout_index=i), False) for i, c in enumerate(chains)]


def test_an_arrow_part_holds_the_parquet_parts_rows(monkeypatch) -> None:
    monkeypatch.setattr(trainer_rows, "ROW_GROUP_TOKENS", 10)
    records = emitted()
    arrow, parquet = batch_rows(records, fmt="arrow"), batch_rows(records)
    assert is_arrow_part(arrow) and not is_arrow_part(parquet)
    assert count_rows(arrow) == count_rows(parquet) == 5
    for use_threads in (True, False):
        got, want = read_rows(arrow, use_threads), read_rows(parquet, use_threads=False)
        assert got.schema.equals(want.schema)
        assert got.to_pylist() == want.to_pylist()
        assert got.column("token_ids").num_chunks == 5  # a record batch per row group
    columns = ["loss_mask", "token_ids"]
    projected = read_rows(arrow, columns=columns)
    assert projected.column_names == columns
    assert projected.to_pylist() == read_rows(parquet, columns=columns).to_pylist()
    skipped = read_rows(arrow, skip=("weight_version",))
    assert "weight_version" not in skipped.column_names
    assert skipped.num_columns == read_rows(parquet).num_columns - 1
    with pytest.raises(InvalidInputError, match="no_such_column"):
        read_rows(arrow, columns=["no_such_column"])


def test_an_arrow_part_is_a_plain_lz4_arrow_file_any_reader_opens(tmp_path) -> None:
    data = batch_rows([(1, record([item([1, 2], [2**31], [-0.5])]), False)], fmt="arrow")
    path = tmp_path / "part-00000-0000000000000000.arrow"
    path.write_bytes(data)
    table = pads.dataset(str(path), format="arrow").to_table()
    assert table.column("token_ids").to_pylist() == [[1, 2, 2**31]]
    assert table.schema.field("token_ids").type.value_type == pa.int64()
    assert table.schema.field("generation_logprobs").type.value_type == pa.float32()
    reader = ipc.open_file(pa.BufferReader(data))
    assert reader.num_record_batches == 1
    long = batch_rows(
        [(1, record([item([7] * 4000, [8] * 4000, [-0.5] * 4000)]), False)], fmt="arrow"
    )
    table = read_rows(long)
    plain = pa.BufferOutputStream()
    with ipc.new_file(plain, table.schema) as writer:
        writer.write_table(table)
    assert len(long) < len(plain.getvalue()) / 4, "the buffers are compressed (LZ4)"
    assert read_rows(long).equals(table)


def test_arrow_encoding_is_deterministic_and_an_empty_batch_is_a_readable_part() -> None:
    records = emitted(3)
    assert batch_rows(records, fmt="arrow") == batch_rows(records, fmt="arrow")
    empty = batch_rows([], fmt="arrow")
    assert read_rows(empty).num_rows == count_rows(empty) == 0
    assert "token_ids" in read_rows(empty).schema.names


def test_rows_keys_name_their_format_and_share_one_acknowledgement() -> None:
    arrow, parquet = rows_key("r", 3, "ab" * 32, "arrow"), rows_key("r", 3, "ab" * 32)
    assert arrow == "r/rows/part-00003-abababababababab.arrow"
    assert parquet.endswith(".parquet")
    assert is_rows_key(arrow, "r", 3, "ab" * 32) and is_rows_key(parquet, "r", 3, "ab" * 32)
    assert not is_rows_key(arrow, "r", 4, "ab" * 32)
    assert not is_rows_key(arrow.replace(".arrow", ".feather"), "r", 3, "ab" * 32)
    assert (
        ack_key("r", "t", arrow)
        == ack_key("r", "t", parquet)
        == ("r/consumers/t/part-00003-abababababababab.ack")
    )


@pytest.mark.integrity
@pytest.mark.parametrize("fmt", ["parquet", "arrow"])
@pytest.mark.parametrize("big", [False, True], ids=["small", "large"])
def test_a_projection_reads_alike_in_every_format_size_and_mode(monkeypatch, fmt, big) -> None:
    """A projection gives the same table whatever the part's format, size or threads: a
    column named twice is read once, and a column the part lacks is refused by name (never
    dropped silently, so a trainer's misspelt column cannot pass unseen)."""
    monkeypatch.setattr(trainer_rows, "SMALL_PART_BYTES", 0 if big else 1 << 40)
    data = batch_rows(emitted(), fmt=fmt)
    for use_threads in (True, False):
        twice = read_rows(data, use_threads, columns=["reward", "line", "reward"])
        assert twice.column_names == ["reward", "line"], (fmt, use_threads)
        with pytest.raises(InvalidInputError, match="'loss_masks'.*columns are"):
            read_rows(data, use_threads, columns=["loss_masks", "line"])


@pytest.mark.parametrize("big", [False, True], ids=["small", "large"])
def test_a_projection_of_an_arrow_part_of_another_layout_reads_its_columns_by_name(
    monkeypatch, big
) -> None:
    """An Arrow part is opened once for a projection, at the places today's parts hold the
    columns; a part holding its columns elsewhere (reordered, or an older part with fewer)
    still gives each named column, never the one at the usual place, and one it lacks is
    refused by name."""
    monkeypatch.setattr(trainer_rows, "SMALL_PART_BYTES", 0 if big else 1 << 40)
    table = read_rows(batch_rows(emitted(), fmt="arrow"))
    assert list(table.column_names) == list(trainer_rows.ROW_COLUMNS)
    for layout in (table.column_names[::-1], ["line", "token_ids", "reward", "loss_mask"]):
        other = table.select(layout)
        sink = pa.BufferOutputStream()
        with ipc.new_file(sink, other.schema, options=trainer_rows.ARROW_WRITE_OPTIONS) as w:
            w.write_table(other)
        data = sink.getvalue().to_pybytes()
        for use_threads in (True, False):
            for columns in (["token_ids", "loss_mask"], ["loss_mask", "line", "token_ids"]):
                got = read_rows(data, use_threads, columns=columns)
                assert got.column_names == columns, (layout, columns)
                assert got.to_pylist() == table.select(columns).to_pylist(), (layout, columns)
        if "weight_version" not in layout:
            with pytest.raises(InvalidInputError, match="no column 'weight_version'"):
                read_rows(data, columns=["token_ids", "weight_version"])
