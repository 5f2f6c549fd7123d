"""Trainer rows: a batch's delivered records as one rows part, beside its JSONL part.

One row per delivered trace when a record carries `training_traces` (multi-trace delivery),
else one row per delivered main chain: the chain's final cumulative tokens, with the loss
mask over its generated spans and their sampling-time log probs (0 elsewhere). A record's
token-bearing items that do not extend one another (a record that arrived with its own
token ids, not prefix-contiguous) give one row per contiguous run, never a join invented
across a rewritten history. Masked rollouts, records without a rollout id and records
without token ids have no rows: rows are derived from what was delivered, nothing else.
Each row carries the weight version of every position (`row_provenance`: -1 at prompts and
where unknown), its version bounds and replicas, and, when the batch was planned grouped by
task, its task's `group_size` and `group_delivered` (the task's rollouts that have rows in
the part: fewer than `group_size` means the group lost a member).

The part is zstd-compressed Parquet (`parquet`, what every table tool reads, the smallest)
or an Arrow IPC file with LZ4-compressed buffers (`arrow`, what a trainer reads fastest: its
buffers are the arrays, no page decoding), in row groups (record batches) of at most
`ROW_GROUP_TOKENS` tokens, so a reader streams it a group at a time. Both hold the same
schema and values; the part's key names its format, and bytes of the other format are
refused before any decoder sees them. Token ids are int32
unless an id of the part needs int64. Encoding is deterministic for a pyarrow version: a
re-run of a batch writes the same bytes, so its create-only upload is accepted. This is the
only module that writes or reads rows; it imports pyarrow, so the handoff imports it only
where rows are made, and nothing `import capture_core` loads imports it.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from capture_core.builder.build_result import MASK_SAMPLE_KEY
from capture_core.errors import InvalidInputError, InvalidRecordError
from capture_core.ids import index_value, maybe_rollout_id_from_run_body
from capture_core.records.served import token_carriers
from capture_core.rows.row_provenance import (
    RowVersions,
    chain_calls,
    chain_spans,
    provenance_key,
    row_versions,
    trace_spans,
    version_columns,
)
from capture_core.run.run_layout import ROW_FORMATS

MAIN_CHAIN = "main_chain"
ALL_TRACES = "all_traces"
TRACES_KEY = "training_traces"
ROW_GROUP_TOKENS = 1 << 20
"""Tokens per row group at most (a group of one longer row is that row): about 9 MB of
token ids, log probs and mask in memory per group while streaming."""
INT32_MAX = 2**31 - 1
SMALL_PART_BYTES = 1 << 20
ARROW_MAGIC = b"ARROW1"
ARROW_WRITE_OPTIONS = ipc.IpcWriteOptions(compression="lz4")
"""LZ4, not zstd: zstd's set-up per buffer (two or three per column) costs a small part more
than its decompression, about 1 ms of a 39k-token part's read against 0.2 ms."""
WRITE_OPTIONS: dict[str, Any] = {
    "compression": "zstd",
    # Token ids and log probs are near-random numbers: dictionaries do not pay, while split
    # byte streams let zstd squeeze their high bytes. Strings repeat, so they keep one.
    # Weight versions are a few values in long runs: dictionary indices are run-length
    # encoded, so a version per call costs a few bytes per row.
    "use_dictionary": ["rollout_id", "trace_id", "delivery", "weight_version.list.element"],
    "use_byte_stream_split": ["token_ids.list.element", "generation_logprobs.list.element"],
    "write_statistics": ["rollout_id", "task_index", "rollout_index", "line"],
    "data_page_version": "2.0",
}


@dataclass(frozen=True)
class TrainerRow:
    """One physical training row: exact tokens, behaviour log probs, and the loss mask."""

    rollout_id: str
    trace_id: str
    token_ids: np.ndarray
    generation_logprobs: np.ndarray
    loss_mask: np.ndarray
    reward: float | None
    task_index: int | None
    rollout_index: int | None
    attempt_index: int | None
    line: int
    delivery: str
    versions: RowVersions | None = None
    """Per-position weight versions and replicas; `None`: unknown everywhere."""
    group_size: int | None = None
    """The task's rollouts in the run, when the run knows it (grouped finalize)."""
    group_delivered: int | None = None
    """The task's distinct rollouts with rows in the part, when `group_size` is known."""


def check_row_format(rows: str) -> str:
    """Refuse an unknown row format, naming the ones there are."""
    if rows not in ROW_FORMATS:
        raise InvalidInputError(
            f"unknown rows format {rows!r}; use one of {', '.join(ROW_FORMATS)}"
        )
    return rows


def record_rows(
    record: Mapping[str, Any], line: int, projected: bool = False, group_size: int | None = None
) -> list[TrainerRow]:
    """The rows of one delivered record (none when it is masked or carries no tokens).

    `projected`: the record's output is the builder's projection of one chain, whose prefix
    contiguity the projection already asserted, so it is one row without comparing prompts
    again. Any other record's items are compared (a new row where one does not extend).
    """
    if record.get(MASK_SAMPLE_KEY):
        return []
    try:
        rollout_id = maybe_rollout_id_from_run_body(dict(record))
    except ValueError:
        return []
    if rollout_id is None:
        return []
    envelope, key = record.get(TRACES_KEY), provenance_key(record)
    with np.errstate(over="ignore"):  # a value float32 cannot hold is refused below
        if isinstance(envelope, Mapping):
            shaped = _trace_rows(rollout_id, envelope, key)
            delivery = ALL_TRACES
        else:
            shaped = _chain_rows(rollout_id, record.get("response"), projected, key)
            delivery = MAIN_CHAIN
    for trace_id, _, logprobs, mask, _ in shaped:
        _refuse_non_finite(rollout_id, trace_id, logprobs, mask)
    reward = record.get("reward")
    return [
        TrainerRow(
            rollout_id=rollout_id,
            trace_id=trace_id,
            token_ids=tokens,
            generation_logprobs=logprobs,
            loss_mask=mask,
            reward=float(reward) if isinstance(reward, int | float) else None,
            task_index=index_value(record.get("_ng_task_index")),
            rollout_index=index_value(record.get("_ng_rollout_index")),
            attempt_index=index_value(record.get("_ng_attempt_index")),
            line=line,
            delivery=delivery,
            versions=versions,
            group_size=group_size,
        )
        for trace_id, tokens, logprobs, mask, versions in shaped
    ]


Shaped = tuple[str, np.ndarray, np.ndarray, np.ndarray, RowVersions]


def _trace_rows(
    rollout_id: str, envelope: Mapping[str, Any], key: Mapping[str, Any] | None
) -> list[Shaped]:
    """The envelope's traces as rows, unchanged (it was validated before it was handed off)."""
    rows = []
    for trace in envelope.get("traces") or []:
        tokens = _int64(trace["token_ids"])
        logprobs = np.asarray(trace["generation_logprobs"], dtype=np.float32)
        mask = (np.asarray(trace["loss_mask"]) != 0).astype(np.int8)
        if not len(tokens) == len(logprobs) == len(mask):
            raise InvalidRecordError(
                f"rollout {rollout_id}: trace {trace.get('trace_id')} has {len(tokens)} token "
                f"ids, {len(logprobs)} log probs and {len(mask)} mask positions; a trace's "
                "arrays must be equally long, so it is not written as a row"
            )
        trace_id = str(trace["trace_id"])
        spans = trace_spans(rollout_id, key, trace)
        versions = row_versions(rollout_id, trace_id, len(tokens), spans)
        rows.append((trace_id, tokens, logprobs, mask, versions))
    return rows


def _chain_rows(
    rollout_id: str, response: Any, projected: bool, key: Mapping[str, Any] | None
) -> list[Shaped]:
    """The record's token-bearing items as cumulative rows: a row's tokens are its last
    item's prompt and generation, each item's generation is a masked span at its place.
    The items are the carriers finalize reads (`token_carriers`); a delivered record holds
    generated ids on one kind of carrier only (`finalize.malformed_token_arrays`)."""
    if not isinstance(response, Mapping):
        return []
    items = [
        item
        for _, item in token_carriers(response)
        if isinstance(item, Mapping) and item.get("generation_token_ids")
    ]
    calls = dict(zip(map(id, items), chain_calls(rollout_id, key, items), strict=True))
    groups = [items] if projected else _extending_runs(items)
    rows = []
    for n, group in enumerate(g for g in groups if g):
        last = group[-1]
        tokens = _int64(last.get("prompt_token_ids") or [], last["generation_token_ids"])
        logprobs = np.zeros(len(tokens), dtype=np.float32)
        mask = np.zeros(len(tokens), dtype=np.int8)
        for item in group:
            start = len(item.get("prompt_token_ids") or [])
            end = start + len(item["generation_token_ids"])
            mask[start:end] = 1
            logprobs[start:end] = item.get("generation_log_probs") or []
        trace_id = f"{rollout_id}:main" if n == 0 else f"{rollout_id}:main-{n}"
        spans = chain_spans(group, [calls[id(item)] for item in group])
        versions = row_versions(rollout_id, trace_id, len(tokens), spans)
        rows.append((trace_id, tokens, logprobs, mask, versions))
    return rows


def _refuse_non_finite(
    rollout_id: str, trace_id: str, logprobs: np.ndarray, mask: np.ndarray
) -> None:
    """Refuse a row holding a log prob that is not finite as float32: at a trained position
    it would poison the loss (a value beyond float32's range became an infinity), and
    elsewhere a row holds 0. Captures refuse such values (`token_values.all_finite`), so this
    guards what reached the rows some other way: the row is never written."""
    finite = np.isfinite(logprobs)
    if finite.all():
        return
    position = int(np.argmin(finite))
    raise InvalidRecordError(
        f"rollout {rollout_id}: row {trace_id} would hold the log prob {logprobs[position]} "
        f"at position {position} (loss mask {int(mask[position])}): the delivered log prob "
        "is not a finite number float32 holds, so the batch's rows are not written. Log "
        "probs must be finite and within float32's range; check how this record got it"
    )


def _int64(*parts: Any) -> np.ndarray:
    """The parts' integers, concatenated, as int64: from lists in one C pass each, about
    half the time `np.asarray` takes; anything else exactly as `np.asarray` reads the one
    part, or the concatenated lists of several."""
    ids = array("q")
    try:
        for part in parts:
            ids.fromlist(part)
    except TypeError:
        whole = parts[0] if len(parts) == 1 else [value for part in parts for value in part]
        return np.asarray(whole, dtype=np.int64)
    return np.frombuffer(ids, dtype=np.int64)


def _extending_runs(items: list[Mapping[str, Any]]) -> list[list[Mapping[str, Any]]]:
    """Split items into runs where each item's prompt extends the previous prompt and
    generation exactly."""
    runs: list[list[Mapping[str, Any]]] = [[]]
    seen: list[int] = []
    for item in items:
        prompt = list(item.get("prompt_token_ids") or [])
        if seen and prompt[: len(seen)] != seen:
            runs.append([])
        runs[-1].append(item)
        seen = prompt + list(item["generation_token_ids"])
    return runs


def row_schema(token_type: pa.DataType) -> pa.Schema:
    """The columns of a rows part, in order."""
    return pa.schema(
        [
            ("rollout_id", pa.string()),
            ("trace_id", pa.string()),
            _required_list("token_ids", token_type),
            _required_list("generation_logprobs", pa.float32()),
            _required_list("loss_mask", pa.int8()),
            ("reward", pa.float64()),
            ("task_index", pa.int64()),
            ("rollout_index", pa.int64()),
            ("attempt_index", pa.int64()),
            ("line", pa.int64()),
            ("delivery", pa.string()),
            _required_list("weight_version", pa.int32()),
            ("min_weight_version", pa.int32()),
            ("max_weight_version", pa.int32()),
            _required_list("replicas", pa.string()),
            ("group_size", pa.int32()),
            ("group_delivered", pa.int32()),
        ]
    )


def _required_list(name: str, value_type: pa.DataType) -> pa.Field:
    """A list column whose lists and elements are never null: readers skip null levels."""
    element = pa.field("element", value_type, nullable=False)
    return pa.field(name, pa.list_(element), nullable=False)


ROW_COLUMNS = tuple(row_schema(pa.int32()).names)
"""The columns of a rows part tokcap writes today, in order (older parts hold fewer)."""
_ROW_PLACES = {name: index for index, name in enumerate(ROW_COLUMNS)}


def rows_table(rows: Sequence[TrainerRow]) -> pa.Table:
    """The rows as one table; token ids int64 only when an id of these rows needs it."""
    lengths = np.fromiter((len(r.token_ids) for r in rows), dtype=np.int64, count=len(rows))
    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))

    def listed(name: str, dtype: type, value_type: pa.DataType) -> pa.Array:
        parts = [getattr(r, name) for r in rows]
        values = np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype)
        element = pa.field("element", value_type, nullable=False)
        return pa.ListArray.from_arrays(offsets, pa.array(values, value_type), pa.list_(element))

    ids = np.concatenate([r.token_ids for r in rows]) if rows else np.zeros(0, np.int64)
    narrow = len(ids) == 0 or (ids.min() >= -INT32_MAX - 1 and ids.max() <= INT32_MAX)
    token_type = pa.int32() if narrow else pa.int64()
    columns = {
        "rollout_id": pa.array([r.rollout_id for r in rows], pa.string()),
        "trace_id": pa.array([r.trace_id for r in rows], pa.string()),
        "token_ids": listed("token_ids", np.int32 if narrow else np.int64, token_type),
        "generation_logprobs": listed("generation_logprobs", np.float32, pa.float32()),
        "loss_mask": listed("loss_mask", np.int8, pa.int8()),
        "reward": pa.array([r.reward for r in rows], pa.float64()),
        "task_index": pa.array([r.task_index for r in rows], pa.int64()),
        "rollout_index": pa.array([r.rollout_index for r in rows], pa.int64()),
        "attempt_index": pa.array([r.attempt_index for r in rows], pa.int64()),
        "line": pa.array([r.line for r in rows], pa.int64()),
        "delivery": pa.array([r.delivery for r in rows], pa.string()),
        **version_columns(
            [r.versions or RowVersions.unknown(len(r.token_ids)) for r in rows], offsets
        ),
        "group_size": pa.array([r.group_size for r in rows], pa.int32()),
        "group_delivered": pa.array([r.group_delivered for r in rows], pa.int32()),
    }
    return pa.table(columns, schema=row_schema(token_type))


def encode_rows(rows: Sequence[TrainerRow], fmt: str = "parquet") -> bytes:
    """The bytes of a rows part in format `fmt` (`parquet`: zstd; `arrow`: LZ4), in row
    groups of at most `ROW_GROUP_TOKENS` tokens."""
    table = rows_table(rows)
    groups = [table.slice(start, stop - start) for start, stop in _row_groups(rows)] or [table]
    sink = pa.BufferOutputStream()
    if fmt == "arrow":
        with ipc.new_file(sink, table.schema, options=ARROW_WRITE_OPTIONS) as writer:
            for group in groups:
                writer.write_table(group, max_chunksize=max(group.num_rows, 1))
        return sink.getvalue().to_pybytes()
    with pq.ParquetWriter(sink, table.schema, **WRITE_OPTIONS) as writer:
        for group in groups:
            writer.write_table(group, row_group_size=max(group.num_rows, 1))
    return sink.getvalue().to_pybytes()


def _row_groups(rows: Sequence[TrainerRow]) -> Iterable[tuple[int, int]]:
    start, tokens = 0, 0
    for i, row in enumerate(rows):
        if i > start and tokens + len(row.token_ids) > ROW_GROUP_TOKENS:
            yield start, i
            start, tokens = i, 0
        tokens += len(row.token_ids)
    if start < len(rows):
        yield start, len(rows)


def emitted_rows(
    records: Iterable[tuple[int, Mapping[str, Any], bool]],
    group_sizes: Mapping[int, int] | None = None,
) -> list[TrainerRow]:
    """The rows of a batch's emitted records, as `(input line, record, projected)`;
    `group_sizes` maps a task index to its rollouts in the run (absent: `group_size` and
    `group_delivered` null)."""
    sizes = group_sizes or {}
    rows = [
        row
        for line, rec, projected in records
        for row in record_rows(
            rec, line, projected, sizes.get(index_value(rec.get("_ng_task_index")))
        )
    ]
    return with_group_delivered(rows) if sizes else rows


def with_group_delivered(rows: Sequence[TrainerRow]) -> list[TrainerRow]:
    """The rows, each of a known group carrying its task's distinct rollouts among `rows`.

    A grouped batch holds every rollout of its tasks, so this counts the group's rollouts
    that were delivered with rows: a masked rollout has none, while a delivered one may
    have several (one per trace), so rows are never counted, rollout ids are.
    """
    members: dict[int | None, set[str]] = {}
    for row in rows:
        members.setdefault(row.task_index, set()).add(row.rollout_id)
    return [
        row
        if row.group_size is None
        else replace(row, group_delivered=len(members[row.task_index]))
        for row in rows
    ]


def batch_rows(
    records: Iterable[tuple[int, Mapping[str, Any], bool]],
    group_sizes: Mapping[int, int] | None = None,
    fmt: str = "parquet",
) -> bytes:
    """The rows part (format `fmt`) of a batch's emitted records, as `(input line, record,
    projected)`."""
    return encode_rows(emitted_rows(records, group_sizes), fmt)


def is_arrow_part(data: bytes) -> bool:
    """Whether a rows part is an Arrow IPC file (else Parquet), by its magic bytes."""
    return data[:6] == ARROW_MAGIC


def count_rows(data: bytes) -> int:
    """The number of rows of a rows part, from its footer (an Arrow part's batch headers)."""
    if is_arrow_part(data):
        return ipc.open_file(pa.BufferReader(data)).count_rows()
    return pq.read_metadata(pa.BufferReader(data)).num_rows


def read_rows(
    data: bytes,
    use_threads: bool = True,
    columns: Sequence[str] | None = None,
    skip: Sequence[str] = (),
    fmt: str | None = None,
) -> pa.Table:
    """A rows part's bytes as a table (the caller has verified them).

    `fmt` is the format the part's key names: bytes of the other format raise
    `InvalidInputError` before any decoder sees them, so bytes that only claim to be an
    Arrow file never reach the Arrow reader from a Parquet key. Without it the magic decides.

    By default decoded as `pyarrow.parquet.read_table` decodes: row groups and columns in
    parallel on pyarrow's thread pools (`pyarrow.set_cpu_count` sizes the CPU pool), at
    least one chunk per row group, about a sixth less time and CPU than the file reader's
    single chunk per column. `use_threads=False` decodes on the calling thread through the file
    reader, since the scanner under `read_table` uses pyarrow's threads even then.
    A part smaller than `SMALL_PART_BYTES` is read by the file reader alone (with threads
    when asked): the scanner's set-up costs such a part more than it saves. `columns`
    decodes only those, each once (a projection: the others are never decompressed; a column
    the part lacks raises `InvalidInputError`); `skip` leaves those out of every column the
    part has. The file reader parses the footer once for both.
    An Arrow part is read by pyarrow's IPC file reader, which decompresses only the columns
    asked for, with threads when asked and the part is not small (as Parquet's scanner).
    """
    arrow = is_arrow_part(data)
    if fmt is not None and arrow != (fmt == "arrow"):
        raise InvalidInputError(f"the rows part is not a {fmt} file, as its name says")
    if arrow:
        return _read_arrow(data, use_threads, columns, skip)
    scanned = use_threads and len(data) >= SMALL_PART_BYTES
    if scanned:
        return _scan_parquet(data, columns, skip)
    reader = pq.ParquetFile(pa.BufferReader(data))  # the footer, parsed once
    names = _projection(reader.schema_arrow.names, columns, skip)
    return reader.read(columns=names, use_threads=use_threads)


def _scan_parquet(data: bytes, columns: Sequence[str] | None, skip: Sequence[str]) -> pa.Table:
    """A large Parquet part through pyarrow's scanner. Its schema is read first only for a
    skip: the scanner refuses a projected column the part lacks, and only then is the
    schema read, to name it."""
    if columns is None:
        names = (
            _projection(pq.read_schema(pa.BufferReader(data)).names, None, skip) if skip else None
        )
        return pq.read_table(pa.BufferReader(data), columns=names)
    try:
        return pq.read_table(pa.BufferReader(data), columns=list(dict.fromkeys(columns)))
    except pa.ArrowInvalid:
        _projection(pq.read_schema(pa.BufferReader(data)).names, columns, skip)  # names it
        raise


def _read_arrow(
    data: bytes, use_threads: bool, columns: Sequence[str] | None, skip: Sequence[str]
) -> pa.Table:
    """An Arrow rows part as a table: one chunk per record batch, only the columns asked for.

    The file is opened once when it can be: every column, or a projection of columns a
    tokcap part holds at their usual places (`ROW_COLUMNS`), then selected by the names
    the part gives the columns read. Otherwise (a part of another layout, a column it
    lacks, a skip) its schema is read first and the projection named from it, as a
    Parquet part's is."""
    threads = use_threads and len(data) >= SMALL_PART_BYTES
    if columns is None and not skip:
        options = ipc.IpcReadOptions(use_threads=threads)
        return ipc.open_file(pa.BufferReader(data), options=options).read_all()
    if columns is not None:
        table = _read_arrow_in_place(data, threads, columns)
        if table is not None:
            return table
    schema = ipc.open_file(pa.BufferReader(data)).schema
    names = _projection(schema.names, columns, skip)
    if names is None:
        names = list(schema.names)
    return _read_arrow_fields(data, threads, [schema.get_field_index(n) for n in names], names)


def _read_arrow_in_place(data: bytes, threads: bool, columns: Sequence[str]) -> pa.Table | None:
    """The part's `columns` read from the places `ROW_COLUMNS` gives them, in one open;
    `None` when one is not a row column or the part holds another column there."""
    names = list(dict.fromkeys(columns))
    if not set(names) <= _ROW_PLACES.keys():
        return None
    try:
        return _read_arrow_fields(data, threads, [_ROW_PLACES[n] for n in names], names)
    except (pa.ArrowInvalid, KeyError):  # fewer columns than that, or others in their places
        return None


def _read_arrow_fields(
    data: bytes, threads: bool, indices: Sequence[int], names: list[str]
) -> pa.Table:
    """The part's fields at `indices` as the columns `names`, in that order, selected by
    the names the part gives them (`KeyError` when one is not among the fields read). No
    index at all reads every field, then keeps none."""
    options = ipc.IpcReadOptions(use_threads=threads, included_fields=sorted(indices))
    table = ipc.open_file(pa.BufferReader(data), options=options).read_all()
    return table if table.column_names == names else table.select(names)


def _projection(
    have: Sequence[str], columns: Sequence[str] | None, skip: Sequence[str]
) -> list[str] | None:
    """The columns to read of a part holding `have` (`None`: all): `columns` each once, in
    the order first named, or every column but `skip`. One rule for both formats, every
    size and mode; a column the part lacks is refused by name, never dropped silently."""
    if columns is None:
        return [n for n in have if n not in skip] if skip else None
    missing = [n for n in columns if n not in have]
    if missing:
        raise InvalidInputError(
            f"the rows part has no column {missing[0]!r}; its columns are "
            f"{', '.join(have)}. Name only those in `columns`"
        )
    return list(dict.fromkeys(columns))
