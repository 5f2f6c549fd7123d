"""Trainer rows: a batch's delivered records as one Parquet part, beside its JSONL part.

One row per delivered trace when a record carries `training_traces` (multi-trace delivery),
else one row per delivered main chain: the chain's final cumulative tokens, with the loss
mask over its generated spans and their sampling-time log probs (0 elsewhere). A record's
token-bearing items that do not extend one another (a record that arrived with its own
token ids, not prefix-contiguous) give one row per contiguous run, never a join invented
across a rewritten history. Masked rollouts, records without a rollout id and records
without token ids have no rows: rows are derived from what was delivered, nothing else.

The part is zstd-compressed Parquet in row groups of at most `ROW_GROUP_TOKENS` tokens,
so a reader streams it a group at a time. Token ids are int32 unless an id of the part
needs int64. Encoding is deterministic for a pyarrow version: a re-run of a batch writes
the same bytes, so its create-only upload is accepted. This is the only module that
writes or reads rows; it imports pyarrow, so import it only where rows are made or read.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from capture_core.build_result import MASK_SAMPLE_KEY
from capture_core.ids import maybe_rollout_id_from_run_body
from capture_core.records import response_items
from capture_core.run_layout import ROW_FORMATS

MAIN_CHAIN = "main_chain"
ALL_TRACES = "all_traces"
TRACES_KEY = "training_traces"
ROW_GROUP_TOKENS = 1 << 20
"""Tokens per row group at most (a group of one longer row is that row): about 9 MB of
token ids, log probs and mask in memory per group while streaming."""
INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class TrainerRow:
    """One physical training row: exact tokens, behaviour log probs, and the loss mask."""

    rollout_id: str
    trace_id: str
    token_ids: list[int]
    generation_logprobs: list[float]
    loss_mask: list[int]
    reward: float | None
    task_index: int | None
    rollout_index: int | None
    attempt_index: int | None
    line: int
    delivery: str


def check_row_format(rows: str) -> str:
    """Refuse an unknown row format, naming the ones there are."""
    if rows not in ROW_FORMATS:
        raise ValueError(f"unknown rows format {rows!r}; use one of {', '.join(ROW_FORMATS)}")
    return rows


def record_rows(record: Mapping[str, Any], line: int) -> list[TrainerRow]:
    """The rows of one delivered record (none when it is masked or carries no tokens)."""
    if record.get(MASK_SAMPLE_KEY):
        return []
    try:
        rollout_id = maybe_rollout_id_from_run_body(dict(record))
    except ValueError:
        return []
    if rollout_id is None:
        return []
    envelope = record.get(TRACES_KEY)
    if isinstance(envelope, Mapping):
        shaped = _trace_rows(rollout_id, envelope)
        delivery = ALL_TRACES
    else:
        shaped = _chain_rows(rollout_id, record.get("response"))
        delivery = MAIN_CHAIN
    reward = record.get("reward")
    return [
        TrainerRow(
            rollout_id=rollout_id,
            trace_id=trace_id,
            token_ids=tokens,
            generation_logprobs=logprobs,
            loss_mask=mask,
            reward=float(reward) if isinstance(reward, int | float) else None,
            task_index=_index(record.get("_ng_task_index")),
            rollout_index=_index(record.get("_ng_rollout_index")),
            attempt_index=_index(record.get("_ng_attempt_index")),
            line=line,
            delivery=delivery,
        )
        for trace_id, tokens, logprobs, mask in shaped
    ]


Shaped = tuple[str, list[int], list[float], list[int]]


def _trace_rows(rollout_id: str, envelope: Mapping[str, Any]) -> list[Shaped]:
    """The envelope's traces as rows, unchanged (it was validated before it was handed off)."""
    rows = []
    for trace in envelope.get("traces") or []:
        tokens = list(trace["token_ids"])
        logprobs = list(trace["generation_logprobs"])
        mask = [int(bool(m)) for m in trace["loss_mask"]]
        if not len(tokens) == len(logprobs) == len(mask):
            raise ValueError(
                f"rollout {rollout_id}: trace {trace.get('trace_id')} has {len(tokens)} token "
                f"ids, {len(logprobs)} log probs and {len(mask)} mask positions; a trace's "
                "arrays must be equally long, so it is not written as a row"
            )
        rows.append((str(trace["trace_id"]), tokens, logprobs, mask))
    return rows


def _chain_rows(rollout_id: str, response: Any) -> list[Shaped]:
    """The record's token-bearing items as cumulative rows: each item whose prompt extends
    the row so far adds its new prompt tokens (mask 0) and its generation (mask 1)."""
    if not isinstance(response, Mapping):
        return []
    rows: list[Shaped] = []
    tokens: list[int] = []
    logprobs: list[float] = []
    mask: list[int] = []
    for item in response_items(response):
        generated = item.get("generation_token_ids") if isinstance(item, Mapping) else None
        if not generated:
            continue
        prompt = list(item.get("prompt_token_ids") or [])
        if tokens and prompt[: len(tokens)] != tokens:
            rows.append(("", tokens, logprobs, mask))
            tokens, logprobs, mask = [], [], []
        new = prompt[len(tokens) :]
        tokens += new + list(generated)
        logprobs += [0.0] * len(new) + [float(x) for x in item.get("generation_log_probs") or []]
        mask += [0] * len(new) + [1] * len(generated)
    if tokens:
        rows.append(("", tokens, logprobs, mask))
    return [
        (f"{rollout_id}:main" if n == 0 else f"{rollout_id}:main-{n}", *row[1:])
        for n, row in enumerate(rows)
    ]


def _index(value: Any) -> int | None:
    """A task, rollout or attempt index as an integer (integer-valued strings too), or None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


def row_schema(token_type: pa.DataType) -> pa.Schema:
    """The columns of a rows part, in order."""
    return pa.schema(
        [
            ("rollout_id", pa.string()),
            ("trace_id", pa.string()),
            ("token_ids", pa.list_(token_type)),
            ("generation_logprobs", pa.list_(pa.float32())),
            ("loss_mask", pa.list_(pa.int8())),
            ("reward", pa.float64()),
            ("task_index", pa.int64()),
            ("rollout_index", pa.int64()),
            ("attempt_index", pa.int64()),
            ("line", pa.int64()),
            ("delivery", pa.string()),
        ]
    )


def rows_table(rows: Sequence[TrainerRow]) -> pa.Table:
    """The rows as one table; token ids int64 only when an id of these rows needs it."""
    ids = pa.array([t for row in rows for t in row.token_ids], pa.int64())
    low, high = pc.min_max(ids).values()
    narrow = len(ids) == 0 or (low.as_py() >= -INT32_MAX - 1 and high.as_py() <= INT32_MAX)
    token_type = pa.int32() if narrow else pa.int64()
    offsets = [0]
    for row in rows:
        offsets.append(offsets[-1] + len(row.token_ids))
    offsets_array = pa.array(offsets, pa.int32())

    def listed(values: list[Any] | pa.Array, value_type: pa.DataType) -> pa.Array:
        array = values if isinstance(values, pa.Array) else pa.array(values, value_type)
        return pa.ListArray.from_arrays(offsets_array, array.cast(value_type))

    columns = {
        "rollout_id": pa.array([r.rollout_id for r in rows], pa.string()),
        "trace_id": pa.array([r.trace_id for r in rows], pa.string()),
        "token_ids": listed(ids, token_type),
        "generation_logprobs": listed(
            [x for r in rows for x in r.generation_logprobs], pa.float32()
        ),
        "loss_mask": listed([m for r in rows for m in r.loss_mask], pa.int8()),
        "reward": pa.array([r.reward for r in rows], pa.float64()),
        "task_index": pa.array([r.task_index for r in rows], pa.int64()),
        "rollout_index": pa.array([r.rollout_index for r in rows], pa.int64()),
        "attempt_index": pa.array([r.attempt_index for r in rows], pa.int64()),
        "line": pa.array([r.line for r in rows], pa.int64()),
        "delivery": pa.array([r.delivery for r in rows], pa.string()),
    }
    return pa.table(columns, schema=row_schema(token_type))


def encode_rows(rows: Sequence[TrainerRow]) -> bytes:
    """The Parquet bytes of a rows part: zstd, row groups of at most `ROW_GROUP_TOKENS`."""
    table = rows_table(rows)
    sink = pa.BufferOutputStream()
    with pq.ParquetWriter(sink, table.schema, compression="zstd") as writer:
        for start, stop in _row_groups(rows):
            writer.write_table(table.slice(start, stop - start), row_group_size=stop - start)
        if not rows:
            writer.write_table(table)
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


def batch_rows(records: Iterable[tuple[int, Mapping[str, Any]]]) -> bytes:
    """The rows part of a batch's emitted records, given as `(input line, record)`."""
    return encode_rows([row for line, record in records for row in record_rows(record, line)])


def read_rows(data: bytes) -> pa.Table:
    """A rows part's bytes as a table (the caller has verified them)."""
    return pq.read_table(pa.BufferReader(data))
