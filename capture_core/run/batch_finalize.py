"""Finalizing one batch of rollouts into its part file and outcomes, ready for upload.

A batch is finalized through `finalize.finalize_record`, the one finalize path (without
its per-rollout warning: a run reports each masked rollout with its input line), several
rollouts at once (`concurrency.finalize_concurrency`). Lines refused as input (unparsable,
or a rollout id repeated in the file) are never finalized. A storage failure while freezing
fails the batch (retry it); it never becomes a masked record. The part holds one line per
emitted record in input order; with trainer rows, their part is encoded beside it.
Nothing here writes to the destination. This module does not import Prefect.
"""

from __future__ import annotations

import asyncio
from concurrent import futures

import orjson
from pydantic import BaseModel, Field

from capture_core.builder.build_result import MASK_SAMPLE_KEY, BuildResult
from capture_core.builder.terminal import UNATTRIBUTED
from capture_core.builder.trace_envelope import MAIN_CHAIN
from capture_core.errors import TransientStoreError, is_transient
from capture_core.protocols import TokenCaptureSnapshot, TokenSource
from capture_core.run import run_layout
from capture_core.run.concurrency import finalize_concurrency
from capture_core.run.finalize import BuildOptions, finalize_record, plain_rollout_id
from capture_core.run.ledger_versions import version_figures
from capture_core.run.receipt import RolloutOutcome, receipt_key
from capture_core.run.rollout_io import BatchPlan, ParsedLine
from capture_core.storage.io_pool import io_pool


class FinalizedBatch(BaseModel):
    """A finalized batch ready for upload: its part bytes, its trainer rows' part bytes (when
    the run writes rows) and per-rollout outcomes.

    Its repr leaves the bytes out: a part is tens of megabytes, and Python 3.11's
    `asyncio.run` formats the repr of the main task's result twice when it restores the
    SIGINT handler (0.4 s each for a 100-rollout part).
    """

    index: int
    receipt_key: str
    part_key: str
    part: bytes = Field(repr=False)
    outcomes: list[RolloutOutcome]
    rows_key: str | None = None
    rows: bytes | None = Field(default=None, repr=False)


def part_key(run_id: str, batch: BatchPlan) -> str:
    return run_layout.part_key(run_id, batch.index, batch.sha256)


class _TransientGuard:
    """A source wrapper that remembers storage failures the finalizer would turn into masks."""

    def __init__(self, source: TokenSource) -> None:
        self.source = source
        self.failure: BaseException | None = None

    async def freeze(self, rollout_id: str) -> TokenCaptureSnapshot:
        try:
            return await self.source.freeze(rollout_id)
        except Exception as exc:
            if is_transient(exc):
                self.failure = exc
            raise

    async def drop(self, rollout_id: str, *, snapshot_id: str, version: int) -> bool:
        return await self.source.drop(rollout_id, snapshot_id=snapshot_id, version=version)

    async def close(self) -> None:
        return None


def _outcome(line: int, result: dict, built: BuildResult | None) -> RolloutOutcome:
    """What finalizing one line did, read from its typed build (`result` is the record)."""
    snapshot = built.snapshot if built else None
    masked = (built is not None and built.mask_sample) or bool(result.get(MASK_SAMPLE_KEY))
    metrics = built.metrics if built else None
    counts = metrics.counts if metrics else None
    terminal = metrics.terminal if metrics else None
    return RolloutOutcome(
        line=line,
        rollout_id=(built.rollout_id if built else None) or plain_rollout_id(result),
        masked=masked,
        mask_reason=((built.mask_reason() if built else None) or "masked") if masked else None,
        can_retire=built is not None and built.can_retire and not masked,
        snapshot_id=snapshot.snapshot_id if snapshot else None,
        version=snapshot.version if snapshot else None,
        delivered_fraction=counts.delivered_fraction if counts else None,
        terminal_method=(terminal.method or UNATTRIBUTED) if terminal else None,
        terminal_abstentions=terminal.abstentions if terminal else [],
        **_trace_counts(built),
        **version_figures(result, masked),
    )


def _trace_counts(built: BuildResult | None) -> dict[str, int]:
    """The ledger's trace counts of an `all_traces` build (none for other builds)."""
    counts = built.metrics.traces if built is not None and built.metrics is not None else None
    if counts is None:
        return {}
    trained = built is not None and built.training_traces is not None
    return {
        "traces": counts.traces if trained else 0,
        "owned_calls": counts.owned_calls if trained else 0,
        "tokens_trained": counts.tokens_trained if trained else 0,
    }


def input_error(batch: BatchPlan, parsed: ParsedLine) -> RolloutOutcome | None:
    """The outcome of a line refused as input (unparsable, or a repeated rollout id), if it is."""
    error = parsed.error or batch.refused.get(parsed.line)
    if error is None:
        return None
    rollout_id = None if parsed.record is None else plain_rollout_id(parsed.record)
    return RolloutOutcome(line=parsed.line, rollout_id=rollout_id, masked=True, error=error)


async def finalize_batch(
    run_id: str,
    batch: BatchPlan,
    lines: list[ParsedLine],
    source: TokenSource,
    builder: str = "prefix_merging",
    concurrency: int | None = None,
    rows: str = "none",
    delivery: str = MAIN_CHAIN,
) -> FinalizedBatch:
    """Finalize every record of a batch and encode the part file in input order.

    With `rows="parquet"` or `rows="arrow"` the batch's trainer rows are encoded too
    (`trainer_rows`).

    Up to `concurrency` rollouts (default: `finalize_concurrency(source)`) are finalized at
    once, so a store's round trips overlap. Raises `TransientStoreError` if the source failed
    in a way a retry may fix.
    """
    guards = [_TransientGuard(source) for _ in lines]
    options = BuildOptions(builder, delivery)
    limit = asyncio.Semaphore(concurrency or finalize_concurrency(source))

    async def finalize_one(parsed: ParsedLine, guard: _TransientGuard) -> BuildResult | None:
        if parsed.record is None or input_error(batch, parsed) is not None:
            return None
        async with limit:
            return await finalize_record(parsed.record, guard, options)

    built_all = await asyncio.gather(*(map(finalize_one, lines, guards)))
    outcomes: list[RolloutOutcome] = []
    emitted: list[tuple[int, dict, bool]] = []
    for parsed, guard, built in zip(lines, guards, built_all, strict=True):
        if guard.failure is not None:
            raise TransientStoreError(
                f"batch {batch.index}: capture store failed at line {parsed.line}: "
                f"{guard.failure}; nothing of this batch was handed off, retry it"
            ) from guard.failure
        refused = input_error(batch, parsed)
        if refused is not None:
            outcomes.append(refused)
            continue
        record = parsed.record or {}
        outcomes.append(_outcome(parsed.line, record, built))
        emitted.append((parsed.line, record, _projected(built)))
    rows_key, encoding = _rows_part(run_id, batch, rows, emitted)
    part = b"".join([orjson.dumps(record) + b"\n" for _, record, _ in emitted])
    return FinalizedBatch(
        index=batch.index,
        receipt_key=receipt_key(batch),
        part_key=part_key(run_id, batch),
        part=part,
        outcomes=outcomes,
        rows_key=rows_key,
        rows=None if encoding is None else await asyncio.wrap_future(encoding),
    )


def _projected(built: BuildResult | None) -> bool:
    """Whether the record's output is the builder's projection of one chain (contiguity
    asserted), not token ids the record arrived with."""
    return built is not None and built.rebuilt_response is not None and not built.redundant_capture


def _rows_part(
    run_id: str, batch: BatchPlan, rows: str, emitted: list[tuple[int, dict, bool]]
) -> tuple[str | None, futures.Future[bytes] | None]:
    """The batch's rows part key and its bytes to come, or nothing when the run writes no rows.

    The rows are derived here and encoded on the I/O pool (pyarrow encodes without the GIL),
    while the caller encodes the records part. So `finalize_batch` waits for the pool and,
    like `storage.io_pool.run_blocking`, must not run on one of its threads.
    """
    if rows == "none":
        return None, None
    from capture_core.rows.trainer_rows import check_row_format, emitted_rows, encode_rows

    check_row_format(rows)
    key = run_layout.rows_key(run_id, batch.index, batch.sha256, rows)
    sizes = batch.group_sizes or None  # planned with group_by="task"
    return key, io_pool().submit(encode_rows, emitted_rows(emitted, sizes), rows)
