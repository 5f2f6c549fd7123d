"""Row consumers' cursors: which rows parts of a run each named consumer acknowledged.

An acknowledgement is one object `<run>/consumers/<name>/part-NNNNN-<digest>.ack`, created
create-only and durably through the destination's byte store (temporary file, fsync,
exclusive link, folder fsync locally; one conditional PUT on S3): it is whole or absent,
and at most one exists per consumer and part, whoever races to write it. It names the part,
its receipt and the sha256 it was verified at, and the lifetime (`token`) that wrote it, so
an ack whose reply was lost is recognised as one's own and anyone else's is refused.

The cursor is the set of acknowledged parts, not a position: a batch handed off late (a
retried batch behind later ones) is still yielded, never skipped. Receipts are read here
without Prefect: the upload task's persisted result is Prefect's JSON result record of a
`HandoffReceipt`, and only that shape is accepted. This module does not import pyarrow.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import orjson
from pydantic import BaseModel, ValidationError

from capture_core.errors import (
    AlreadyAcknowledgedError,
    InvalidInputError,
    InvalidRecordError,
    RowsNotWrittenError,
    UnreadableAcknowledgementError,
    UnreadableReceiptError,
)
from capture_core.ids import validate_rollout_id
from capture_core.run.crash_points import crash_point
from capture_core.run.receipt import RECEIPT_KEY, HandoffReceipt, marked_retirable
from capture_core.run.run_layout import (
    ROW_SUFFIXES,
    RunLayout,
    ack_key,
    consumers_prefix,
    is_rows_key,
)
from capture_core.storage import ByteStore

ACK_CRASH_POINTS = ("before-ack", "after-ack")
_SUFFIXES = "|".join(re.escape(suffix) for suffix in ROW_SUFFIXES.values())
_ROWS_PART = re.compile(rf"part-([0-9]{{5,}})-([0-9a-f]{{16}})(?:{_SUFFIXES})")


class Acknowledgement(BaseModel):
    """What an ack object records: who consumed which part, verified at which digest."""

    consumer: str
    run_id: str
    part: str
    receipt_key: str
    sha256: str
    token: str


def validate_consumer_name(name: str) -> str:
    """Consumer names follow the rollout-id rules: they are path segments under the run."""
    try:
        return validate_rollout_id(name)
    except ValueError as exc:
        raise InvalidInputError(str(exc).replace("rollout id", "consumer name")) from exc


def receipt_keys(layout: RunLayout) -> list[str]:
    """The run's batch receipts, in batch order."""
    names = [k.rsplit("/", 1)[-1] for k in layout.dest.list_prefix(layout.receipts_prefix)]
    found = [name for name in names if RECEIPT_KEY.fullmatch(name)]
    return sorted(found, key=lambda name: int(name.split("-")[1]))


def read_stored_receipt(layout: RunLayout, key: str) -> HandoffReceipt:
    """Receipt `key` of the run, read without Prefect; raises naming it when it is not one.

    It must be a whole result record holding this batch's receipt of this run, whose
    parts are the run's own (a receipt copied from another run certifies nothing here).
    """
    where = f"{layout.dest.url}/{layout.receipt_key(key)}"
    data = layout.dest.get(layout.receipt_key(key))
    if data is None:
        raise UnreadableReceiptError(f"receipt {where} is missing")
    try:
        inner = orjson.loads(orjson.loads(data)["result"])
        if not str(inner["__class__"]).endswith(".HandoffReceipt"):
            raise InvalidRecordError(f"it holds {inner['__class__']}")
        receipt = HandoffReceipt.model_validate(inner["data"])
    except (ValueError, KeyError, TypeError, ValidationError) as exc:
        detail = f"{type(exc).__name__}: {str(exc).partition(chr(10))[0][:160]}"
        raise UnreadableReceiptError(
            f"receipt {where} cannot be read as a handoff receipt ({detail}); nothing of its "
            "batch is yielded. Restore it (from a backup or an earlier object version)"
        ) from exc
    digest = key.rsplit("-", 1)[-1]
    own_rows = receipt.rows is None or is_rows_key(
        receipt.rows.key, layout.run_id, receipt.batch, digest
    )
    if receipt.receipt_key != key or receipt.run_id != layout.run_id or not own_rows:
        raise UnreadableReceiptError(
            f"receipt {where} holds the receipt of {receipt.receipt_key} of run "
            f"{receipt.run_id}, not of batch {key} of run {layout.run_id}: copied, it "
            "certifies nothing here; nothing of its batch is yielded"
        )
    return receipt


def receipt_key_of_part(layout: RunLayout, part: str) -> str:
    """The receipt name of rows part `part` (a key the consumer yielded); raises if none."""
    name = part.rsplit("/", 1)[-1]
    found = _ROWS_PART.fullmatch(name)
    if found is None or part != layout.key("rows", name):
        raise InvalidInputError(
            f"{part!r} is not a rows part of run {layout.run_id}; acknowledge the `.key` of "
            "a part the consumer yielded"
        )
    return f"batch-{found.group(1)}-{found.group(2)}"


@dataclass
class Cursor:
    """Consumer `name`'s acknowledgements in one run; `token` identifies this lifetime."""

    layout: RunLayout
    name: str
    token: str

    def ack_key(self, part: str) -> str:
        return ack_key(self.layout.run_id, self.name, part)

    def acknowledged(self, receipt: HandoffReceipt) -> Acknowledgement | None:
        """The ack of the receipt's rows part, or `None`; raises when it names other bytes."""
        if receipt.rows is None:
            return None
        key = self.ack_key(receipt.rows.key)
        data = self.layout.dest.get(key)
        if data is None:
            return None
        ack = parse_ack(self.layout.dest, key, data)
        if ack.sha256 != receipt.rows.sha256 or ack.part != receipt.rows.key:
            raise UnreadableAcknowledgementError(
                f"acknowledgement {self.layout.dest.url}/{key} names part {ack.part} at sha256 "
                f"{ack.sha256}, but receipt {receipt.receipt_key} of run {receipt.run_id} "
                f"certifies {receipt.rows.key} at {receipt.rows.sha256}; it acknowledges "
                "other bytes, so it counts for nothing. Check both for edits"
            )
        return ack

    def ack(self, receipt: HandoffReceipt) -> Acknowledgement:
        """Record, create-only and durably, that this consumer consumed the receipt's rows.

        `AlreadyAcknowledgedError` when an ack of another lifetime exists: across crashes
        and racing processes, each part is acknowledged exactly once per consumer name.
        """
        if receipt.rows is None:
            raise RowsNotWrittenError(f"batch {receipt.batch} of run {receipt.run_id} has no rows")
        ack = Acknowledgement(
            consumer=self.name,
            run_id=receipt.run_id,
            part=receipt.rows.key,
            receipt_key=receipt.receipt_key,
            sha256=receipt.rows.sha256,
            token=self.token,
        )
        body = orjson.dumps(ack.model_dump(), option=orjson.OPT_SORT_KEYS)
        key = self.ack_key(receipt.rows.key)
        crash_point("before-ack")
        if not self.layout.dest.create(key, body) and self.layout.dest.get(key) != body:
            raise AlreadyAcknowledgedError(
                f"part {receipt.rows.key} of run {receipt.run_id} was already acknowledged "
                f"by consumer {self.name} ({self.layout.dest.url}/{key}), by another lifetime "
                "or process of it; it counts once. Do not count this consumption again"
            )
        crash_point("after-ack")
        return ack


def parse_ack(dest: ByteStore, key: str, data: bytes) -> Acknowledgement:
    """An ack object's content; raises naming it when it is not one."""
    try:
        return Acknowledgement.model_validate(orjson.loads(data))
    except (ValueError, ValidationError) as exc:
        raise UnreadableAcknowledgementError(
            f"acknowledgement {dest.url}/{key} cannot be read ({type(exc).__name__}); "
            "restore it: it records that its part was consumed"
        ) from exc


def consumer_names(layout: RunLayout) -> list[str]:
    """The names of every consumer that acknowledged a part of the run."""
    return layout.dest.list_children(consumers_prefix(layout.run_id))


class ConsumerProgress(BaseModel):
    """One consumer's progress through a run: parts acknowledged, captures still waiting."""

    name: str
    parts: int
    acknowledged: int
    captures_waiting: int


def acknowledged_receipts(
    layout: RunLayout, name: str, receipts: list[HandoffReceipt]
) -> list[HandoffReceipt]:
    """The receipts among `receipts` whose rows part consumer `name` acknowledged."""
    cursor = Cursor(layout, name, token="")
    return [r for r in receipts if r.rows is not None and cursor.acknowledged(r) is not None]


def consumer_progress(
    layout: RunLayout, names: list[str], receipts: list[HandoffReceipt] | None = None
) -> list[ConsumerProgress]:
    """Per consumer: rows parts acknowledged of the run's parts, and the retirable captures
    of the parts it has not acknowledged (what retirement after that consumer waits for).

    `receipts` are the run's receipts when the caller has read them already.
    """
    if receipts is None:
        receipts = [read_stored_receipt(layout, key) for key in receipt_keys(layout)]
    with_rows = [r for r in receipts if r.rows is not None]
    progress = []
    for name in names:
        acked = {r.receipt_key for r in acknowledged_receipts(layout, name, receipts)}
        waiting = sum(marked_retirable(r) for r in receipts if r.receipt_key not in acked)
        progress.append(
            ConsumerProgress(
                name=name, parts=len(with_rows), acknowledged=len(acked), captures_waiting=waiting
            )
        )
    return progress
