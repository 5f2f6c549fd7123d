"""Batches of rollouts: finalize, durable handoff to a destination, and retirement by receipt.

A batch is finalized through `finalize.finalize_record`, the one finalize path (without
its per-rollout warning: a run reports each masked rollout with its input line).
Lines refused as input (unparsable, or a rollout id repeated in the file) are never finalized.
A storage failure while freezing fails the batch (retry it); it never becomes a masked record.
The part file is written create-only, durably, and verified by reading it back.
A receipt names the part, its digest and each rollout's snapshot; retirement needs it, and
what it retires is decided from the part's verified records, never from the receipt alone.
Masked and failed rollouts are never retired. This module does not import Prefect.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import os
import re
from collections.abc import Callable
from concurrent import futures
from typing import TypeVar

import orjson
from pydantic import BaseModel, Field

from capture_core.builder.build_result import MASK_SAMPLE_KEY, BuildResult
from capture_core.builder.terminal import UNATTRIBUTED
from capture_core.builder.trace_envelope import (
    ENVELOPE_KEY,
    MAIN_CHAIN,
    TraceEnvelopeError,
    check_envelope,
)
from capture_core.errors import (
    HandoffConflictError,
    InvalidInputError,
    PartMismatchError,
    TransientStoreError,
    is_transient,
)
from capture_core.protocols import (
    DECIDED,
    DELETED,
    BatchTokenSource,
    DropRequest,
    TokenCaptureSnapshot,
    TokenSource,
)
from capture_core.run import run_layout
from capture_core.run.crash_points import crash_point
from capture_core.run.finalize import (
    BuildOptions,
    finalize_record,
    plain_rollout_id,
    rollout_carries_token_ids,
)
from capture_core.run.rollout_io import BatchPlan, ParsedLine
from capture_core.run.run_layout import RolloutFigures
from capture_core.storage import ByteStore
from capture_core.storage.io_pool import io_pool
from capture_core.storage.local import LocalStore
from capture_core.store.base import drop_each

logger = logging.getLogger(__name__)
T = TypeVar("T")


class RolloutOutcome(RolloutFigures):
    """What finalization did with one input line: its figures, whether its capture may be
    retired and at which snapshot, and why the line was refused as input (`error`)."""

    can_retire: bool = False
    snapshot_id: str | None = None
    version: int | None = None
    error: str | None = None

    @property
    def emitted(self) -> bool:
        """Whether a finalized record was produced (malformed input lines produce none)."""
        return self.error is None


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


class RowsPart(BaseModel):
    """The trainer-rows part a receipt pins beside the records part: key, size, sha256, rows."""

    key: str
    sha256: str
    bytes: int
    rows: int


class HandoffReceipt(BaseModel):
    """Proof that a batch's records are durably stored at the destination."""

    run_id: str
    batch: int
    receipt_key: str
    part_key: str
    sha256: str
    bytes: int
    records: int
    rollouts: list[RolloutOutcome]
    rows: RowsPart | None = None


class RetireOutcome(BaseModel):
    """Which rollouts of a receipt were retired, kept (capture changed), or failed (errors).

    Only an outcome without failures is final; `transient` says whether a retry may fix them.
    `earlier` marks an outcome recorded by an earlier run and reused, not work done now.
    `disagreed` holds rollouts the receipt marks retirable and its verified part does not
    (masked, missing, without tokens): their captures are kept, and the run reports them.
    `waiting_for` names the row consumer whose acknowledgement the batch waits for: nothing
    was retired, and a later run retires it once acknowledged.
    """

    receipt_key: str
    retired: list[str] = Field(default_factory=list)
    kept: dict[str, str] = Field(default_factory=dict)
    failed: dict[str, str] = Field(default_factory=dict)
    disagreed: dict[str, str] = Field(default_factory=dict)
    transient: bool = True
    earlier: bool = False
    waiting_for: str | None = None


RECEIPT_KEY = re.compile(r"batch-[0-9]{5,}-[0-9a-f]{16}")
RETIRED_INFIX = "-retired-"
RETIREMENT_KEY = re.compile(rf"({RECEIPT_KEY.pattern}){RETIRED_INFIX}[0-9a-f]+")
"""A batch's persisted retirement beside its receipt; group 1 is the receipt's key."""


def retirement_key(receipt: str, store_identity: str) -> str:
    """The name the retirement of receipt `receipt` against one store is persisted under."""
    return f"{receipt}{RETIRED_INFIX}{store_identity}"


def receipt_key(batch: BatchPlan) -> str:
    """A key that says what the receipt certifies: this batch index of this exact input."""
    return f"batch-{batch.index:05d}-{batch.sha256[:16]}"


def part_key(run_id: str, batch: BatchPlan) -> str:
    return run_layout.part_key(run_id, batch.index, batch.sha256)


STORE_CONCURRENCY_ENV = "TOKCAP_STORE_CONCURRENCY"
DEFAULT_STORE_CONCURRENCY = 16
LOCAL_FINALIZE_CONCURRENCY = 4
"""Rollouts a batch finalizes at once from a tokcap store on local disk, unless told."""


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

    With `rows="parquet"` the batch's trainer rows are encoded too (`trainer_rows`).

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
    from capture_core.run.trainer_rows import check_row_format, emitted_rows, encode_rows

    check_row_format(rows)
    key = run_layout.rows_key(run_id, batch.index, batch.sha256)
    return key, io_pool().submit(encode_rows, emitted_rows(emitted))


def upload_part(dest: ByteStore, key: str, data: bytes) -> tuple[str, int]:
    """Write a part create-only and verify it; return its sha256 and size.

    An identical existing part (a re-run, or a write whose reply was lost) is accepted.
    A different one raises `HandoffConflictError` and is left untouched.
    """
    digest = hashlib.sha256(data).hexdigest()
    if not data:
        return digest, 0
    crash_point("mid-upload")
    dest.create(key, data)
    stored = dest.get(key)
    if stored is None:
        raise TransientStoreError(f"part {dest.url}/{key} is not readable right after writing it")
    if len(stored) != len(data) or hashlib.sha256(stored).hexdigest() != digest:
        raise HandoffConflictError(
            f"destination part {dest.url}/{key} already exists with other content "
            f"({len(stored)} bytes, not {len(data)}); it is never overwritten. Keep it: it may "
            "hold records already handed off whose captures are retired, and this run would "
            "deliver them masked. Check that the run's receipts are intact; to finalize this "
            "input afresh, use a new run id"
        )
    return digest, len(data)


def handoff_batch(run_id: str, finalized: FinalizedBatch, dest: ByteStore) -> HandoffReceipt:
    """Durably hand a finalized batch off (records part and rows part) and return its receipt.

    The rows part is uploaded on the I/O pool while the records part is uploaded here; both
    are waited for, and either one's error raised, before anything is returned.
    """
    key, data = finalized.rows_key, finalized.rows
    rows_upload = (
        None if key is None or data is None else io_pool().submit(upload_part, dest, key, data)
    )
    try:
        digest, size = upload_part(dest, finalized.part_key, finalized.part)
    finally:
        if rows_upload is not None:
            futures.wait([rows_upload])
    rows = None
    if rows_upload is not None and key is not None and data is not None:
        from capture_core.run.trainer_rows import count_rows

        rows_digest, rows_size = rows_upload.result()
        rows = RowsPart(key=key, sha256=rows_digest, bytes=rows_size, rows=count_rows(data))
    return HandoffReceipt(
        run_id=run_id,
        batch=finalized.index,
        receipt_key=finalized.receipt_key,
        part_key=finalized.part_key,
        sha256=digest,
        bytes=size,
        records=sum(1 for o in finalized.outcomes if o.emitted),
        rollouts=finalized.outcomes,
        rows=rows,
    )


def verify_part(dest: ByteStore, receipt: HandoffReceipt) -> bytes:
    """Re-read the receipt's part, check its size and sha256 against the receipt, return it.

    A receipt that pins a rows part has it verified the same way first: retirement waits
    for both parts. A transient read failure propagates (retry it); a missing or different
    part raises `PartMismatchError` naming it, because it is not what the receipt certifies.
    """
    if receipt.rows is not None:
        verified_bytes(dest, receipt, receipt.rows.key, receipt.rows.bytes, receipt.rows.sha256)
    return verified_bytes(dest, receipt, receipt.part_key, receipt.bytes, receipt.sha256)


RETIRED_NOTHING = (
    "nothing of this batch was retired now, its captures are kept. Restore the part from a "
    "copy with that digest, then retire again"
)


def verified_bytes(
    dest: ByteStore,
    receipt: HandoffReceipt,
    key: str,
    size: int,
    sha256: str,
    consequence: str = RETIRED_NOTHING,
) -> bytes:
    """The bytes of part `key` when they are the `size` and `sha256` its receipt certifies;
    else `PartMismatchError` naming the part, the run and `consequence`."""
    stored = dest.get(key)
    digest = None if stored is None else hashlib.sha256(stored).hexdigest()
    if stored is not None and len(stored) == size and digest == sha256:
        return stored
    raise _part_mismatch(dest, receipt, key, stored, digest, size, sha256, consequence)


def verified_decode(
    dest: ByteStore,
    receipt: HandoffReceipt,
    key: str,
    size: int,
    sha256: str,
    decode: Callable[[bytes], T],
    consequence: str = RETIRED_NOTHING,
) -> T:
    """`decode` of part `key`'s bytes when they are the `size` and `sha256` its receipt
    certifies; else `PartMismatchError` as `verified_bytes` raises it.

    The digest is computed on a thread of its own while `decode` runs (hashlib releases the
    GIL), so a reader with a free core waits for the longer of the two, not their sum. What
    `decode` returns, or the `Exception` it raises, counts only once the digest agrees: bytes
    other than the certified ones are never returned, and their decode error is never the
    one reported. An interrupt (`KeyboardInterrupt`, `SystemExit`) is raised as it is. A
    part of the wrong size is refused before anything decodes it.
    """
    stored = dest.get(key)
    if stored is None or len(stored) != size:
        digest = None if stored is None else hashlib.sha256(stored).hexdigest()
        raise _part_mismatch(dest, receipt, key, stored, digest, size, sha256, consequence)

    def mismatch(digest: str) -> PartMismatchError:
        return _part_mismatch(dest, receipt, key, stored, digest, size, sha256, consequence)

    with futures.ThreadPoolExecutor(1, thread_name_prefix="tokcap-digest") as digesting:
        hashing = digesting.submit(lambda: hashlib.sha256(stored).hexdigest())
        try:
            decoded = decode(stored)
        except Exception:
            if (digest := hashing.result()) != sha256:
                raise mismatch(digest) from None
            raise
        if (digest := hashing.result()) != sha256:
            raise mismatch(digest)
    return decoded


def _part_mismatch(
    dest: ByteStore,
    receipt: HandoffReceipt,
    key: str,
    stored: bytes | None,
    digest: str | None,
    size: int,
    sha256: str,
    consequence: str,
) -> PartMismatchError:
    found = "is missing" if stored is None else f"has {len(stored)} bytes, sha256 {digest}"
    return PartMismatchError(
        f"batch {receipt.batch} of run {receipt.run_id}: part {dest.url}/{key} {found}, but "
        f"its receipt certifies {size} bytes, sha256 {sha256}; {consequence}"
    )


def claimed_retirable(receipt: HandoffReceipt) -> list[RolloutOutcome]:
    """The rollouts a receipt marks retirable: rebuilt or redundant, at a known snapshot."""
    return [
        r
        for r in receipt.rollouts
        if r.rollout_id and r.can_retire and r.snapshot_id is not None and r.version is not None
    ]


def retirable(receipt: HandoffReceipt, part: bytes) -> tuple[list[RolloutOutcome], dict[str, str]]:
    """The rollouts the verified `part` permits retiring, and why it refutes the others.

    The receipt's verdict is a claim; the part's records decide. A rollout the receipt marks
    retirable is retired only when its record is in the part at its place (the part holds
    one line per emitted rollout, in receipt order), names the same rollout, is not masked
    and carries token ids. The drop still names the receipt's snapshot, and the store
    drops only a capture at exactly that freeze.
    """
    claimed = {id(r) for r in claimed_retirable(receipt)}
    emitted = [r for r in receipt.rollouts if r.emitted]
    lines = _line_spans(part)
    refuted = {
        r.rollout_id or "": f"has no record of line {r.line} (refused as input: {r.error})"
        for r in receipt.rollouts
        if id(r) in claimed and not r.emitted
    }
    if len(lines) != len(emitted):
        why = f"holds {len(lines)} records where the receipt lists {len(emitted)}"
        return [], {**refuted, **{r.rollout_id or "": why for r in emitted if id(r) in claimed}}
    allowed: list[RolloutOutcome] = []
    for rollout, (start, end) in zip(emitted, lines, strict=True):
        if id(rollout) not in claimed:
            continue
        why = _part_refutes(rollout, skimmed_record(part, start, end))
        if why is None:
            allowed.append(rollout)
        else:
            refuted[rollout.rollout_id or ""] = why
    return allowed, refuted


def _line_spans(part: bytes) -> list[tuple[int, int]]:
    """Where each line of a part starts and ends (a last line without `\\n` counts): the
    lines are read in place, so a part of long rollouts is not copied line by line."""
    spans, start = [], 0
    while (end := part.find(b"\n", start)) >= 0:
        spans.append((start, end))
        start = end + 1
    if start < len(part):
        spans.append((start, len(part)))
    return spans


def _part_refutes(rollout: RolloutOutcome, record: object) -> str | None:
    """Why the part's (skimmed) record at a rollout's place does not permit retiring it, or
    `None`."""
    if not isinstance(record, dict):
        return f"line {rollout.line} is not a JSON record"
    found = plain_rollout_id(record)
    if found != rollout.rollout_id:
        return f"holds rollout {found!r} at line {rollout.line}"
    if record.get(MASK_SAMPLE_KEY):
        return "records it masked (mask_sample: true)"
    if rollout.traces is not None:  # an all_traces build: its envelope must check
        try:
            check_envelope(record.get(ENVELOPE_KEY), rollout.rollout_id)
        except TraceEnvelopeError as exc:
            return f"records no envelope that passes its checks ({exc})"
        return None
    if not rollout_carries_token_ids(record):
        return "records it without token ids"
    return None


# A flat token array's opening, as orjson writes it; such an array ends at the next `]`.
# The key's closing quote cannot occur unescaped inside a JSON string, so every match is a key.
_TOKEN_ARRAY = re.compile(rb'"(?:prompt_token_ids|generation_token_ids|generation_log_probs)":\[')
_NOT_BLANK = re.compile(rb"[^ \t\n\r\x0b\x0c]")  # what `bytes.strip` keeps


def skimmed_record(part: bytes, start: int = 0, end: int | None = None) -> object:
    """The part line at `part[start:end]` (the whole of `part` by default) parsed with each
    non-empty flat token array cut to `[0]`, or `None`.

    What decides retirement (ids, `mask_sample`, whether ids are carried) survives the cut,
    and parsing skips the arrays at memchr speed instead of building every id: a part of
    long rollouts holds each call's cumulative prompt. A line the cut leaves unparsable is
    parsed whole; `None` when that fails too.
    """
    end = len(part) if end is None else end
    pieces, position = [], start
    while (found := _TOKEN_ARRAY.search(part, position, end)) is not None:
        opened = found.end()
        closed = part.find(b"]", opened, end)
        if closed < 0:
            break
        carried = _NOT_BLANK.search(part, opened, closed) is not None
        pieces += [part[position:opened], b"0" if carried else b""]
        position = closed
    whole = memoryview(part)[start:end]
    for candidate in (b"".join([*pieces, part[position:end]]), whole):
        try:
            return orjson.loads(candidate)
        except orjson.JSONDecodeError:
            continue
    return None


DISAGREED = (
    "not retired: the receipt marks it retirable, but its verified part {why}; the capture is kept"
)


def kept_as_evidence(receipt: HandoffReceipt) -> int:
    """Captures a receipt never retires: those of masked or unfinished rollouts."""
    return sum(1 for r in receipt.rollouts if r.rollout_id and not r.can_retire)


def marked_retirable(receipt: HandoffReceipt) -> int:
    """Captures a receipt marks retirable: those of rebuilt or redundant rollouts."""
    return sum(1 for r in receipt.rollouts if r.rollout_id and r.can_retire)


KEPT_CHANGED = (
    "not retired: this store holds no capture at its frozen snapshot (it changed "
    "since it was frozen, or this is another store); anything there is kept"
)


async def retire_receipt(
    receipt: HandoffReceipt,
    source: TokenSource,
    dest: ByteStore,
    concurrency: int | None = None,
) -> RetireOutcome:
    """Retire the rollouts a receipt marks retirable and its part permits, each by its snapshot.

    The part is re-verified against the receipt first (`verify_part`); nothing is dropped
    unless it still holds exactly the certified records, and then only what those records
    permit (`retirable`); a rollout they refute is kept and reported in `disagreed`. The
    permitted rollouts are retired together: by the source's `drop_many` when it is a
    `BatchTokenSource` (tokcap's store: every tombstone durable first, then the deletions),
    else one `drop` per rollout; up to `concurrency` (default: `store_concurrency()`) at
    once. Drop failures are collected, not raised, so one bad rollout does not stop the others.
    """
    outcome = RetireOutcome(receipt_key=receipt.receipt_key)
    if not claimed_retirable(receipt):
        return outcome
    rollouts, refuted = retirable(receipt, verify_part(dest, receipt))
    for rollout_id, why in refuted.items():
        outcome.disagreed[rollout_id] = DISAGREED.format(why=why)
        logger.warning("receipt %s, rollout %s: %s", receipt.receipt_key, rollout_id, why)
    drops = [
        DropRequest(r.rollout_id or "", snapshot_id=r.snapshot_id or "", version=r.version or 0)
        for r in rollouts
    ]
    drop_batch = (
        source.drop_many
        if isinstance(source, BatchTokenSource)
        else functools.partial(drop_each, source)
    )
    results = await drop_batch(
        drops, concurrency=concurrency or store_concurrency(), checkpoint=_retire_crash_point
    )
    for rollout, retired in zip(rollouts, results, strict=True):
        _record_drop(outcome, rollout.rollout_id or "", retired)
    return outcome


RETIRE_CRASH_POINTS = {DECIDED: "after-retire-decisions", DELETED: "mid-retire"}


def _retire_crash_point(moment: str) -> None:
    """The crash points of a retirement: every decision durable, then each rollout deleted."""
    crash_point(RETIRE_CRASH_POINTS[moment])


def _record_drop(outcome: RetireOutcome, rollout_id: str, retired: bool | Exception) -> None:
    if isinstance(retired, Exception):
        outcome.failed[rollout_id] = f"{type(retired).__name__}: {retired}"
        outcome.transient = outcome.transient and is_transient(retired)
    elif retired:
        outcome.retired.append(rollout_id)
    else:
        outcome.kept[rollout_id] = KEPT_CHANGED


def finalize_concurrency(source: object) -> int:
    """Rollouts a batch finalizes at once from `source`: `TOKCAP_STORE_CONCURRENCY` when it
    is set; else 4 from a tokcap store on local disk, 16 from any other source.

    On local disk a finalize is interpreter work plus a few milliseconds of fsync for its
    freeze claim: four in flight overlap those, and more only add thread switches and
    garbage-collector work (a batch took about 1.4 times as long at 16: docs/perf.md). A
    remote store's round trips need the 16; so may a local path on a network filesystem,
    where each fsync is a round trip: set the variable there. Retirement keeps
    `store_concurrency()`: its unlinks and deletes gain from more at once.
    """
    byte_store = getattr(source, "byte_store", None)
    if isinstance(byte_store, LocalStore) and not os.environ.get(STORE_CONCURRENCY_ENV):
        return LOCAL_FINALIZE_CONCURRENCY
    return store_concurrency()


def store_concurrency() -> int:
    """Rollouts finalized or retired at once per batch: `TOKCAP_STORE_CONCURRENCY`, else 16."""
    value = os.environ.get(STORE_CONCURRENCY_ENV, "")
    try:
        number = int(value) if value else DEFAULT_STORE_CONCURRENCY
    except ValueError:
        number = 0
    if number < 1:
        raise InvalidInputError(
            f"{STORE_CONCURRENCY_ENV}={value!r} is not a positive integer; set it to the "
            "number of rollouts to finalize or retire at once (for example 16)"
        )
    return number
