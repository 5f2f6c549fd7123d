"""Handoff receipts: their Prefect result storage under `<dest>/<run_id>/receipts`, and the
tasks that prepare that storage and find the receipts persisted there.

The upload and retire tasks persist their results through `ReceiptStorage`, a block that
writes through the destination's byte store: create-only and durable (temporary file, fsync,
exclusive publish, folder fsync on a local disk; one conditional PUT on S3), so a result
object is whole or absent, never empty or torn. The block holds only the destination and its
public settings (credentials stay in the environment); one block serves every run there, so
a run reads it from the API and writes it only when it is missing or was edited.
Result paths are `<run_id>/receipts/<name>` (`result_path`), the object's key in the destination.
A bare name is Prefect's own key (a failed task's exception) or an older run's receipt: it
resolves under the run the block was bound to (`for_run`, or the run id an older run's block
document holds). A failed task's exception that the destination cannot take (an outage) is
noted and dropped: it certifies nothing.
A receipt exists exactly when the upload task's persisted result exists.
Receipts are read through the destination's byte store, never `ResultStore.exists`, which
reads every failure, transient or not, as "absent".
An object there that is not a readable receipt is an error naming it, never "no receipt".
One that is provably empty or unparseable (an older, non-atomic writer left it) records no
handoff: `find_receipts` may leave its batch to be handed off again, and the upload task does
so only when nothing of the batch was retired, setting the old part aside as evidence.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from typing import Any

import orjson
from prefect.filesystems import WritableFileSystem
from prefect.results import ResultRecord
from pydantic import Field, PrivateAttr, ValidationError

from capture_core.config import public_storage_options
from capture_core.errors import InvalidInputError, TransientStoreError, UnreadableReceiptError
from capture_core.run.batch_finalize import FinalizedBatch
from capture_core.run.receipt import RECEIPT_KEY, HandoffReceipt, retirement_key
from capture_core.run.run_layout import (
    RECEIPTS,
    RunLayout,
    is_rows_key,
    part_key,
    run_location,
    validate_run_id,
)
from capture_core.storage import open_byte_store
from tokcap.tasks.common import tokcap_task

logger = logging.getLogger(__name__)


class UnrecordedReceiptError(UnreadableReceiptError):
    """A receipt object is empty or unparseable: it records no handoff, but it is evidence."""


def receipts_location(dest: str, run_id: str) -> str:
    return run_location(dest, run_id, RECEIPTS)


def result_path(run_id: str, name: str) -> str:
    """The result storage path of run `run_id`'s receipt (or retirement) `name`."""
    return f"{run_id}/{RECEIPTS}/{name}"


def _split_result_path(path: str, run_id: str | None) -> tuple[str, str]:
    """The run id and the name of a result path `<run_id>/receipts/<name>`, or of a bare
    name under `run_id`."""
    parts = path.split("/")
    if len(parts) == 1 and run_id is not None:
        parts = [run_id, RECEIPTS, path]
    if len(parts) != 3 or parts[1] != RECEIPTS or not parts[2] or parts[2] in (".", ".."):
        raise InvalidInputError(
            f"result path {path!r} is not <run_id>/{RECEIPTS}/<name>; tokcap's upload and "
            "retire tasks name their results that way (tasks/receipts.py: result_path)"
        )
    return validate_run_id(parts[0]), parts[2]


class ReceiptStorage(WritableFileSystem):
    """Prefect result storage for the receipts of every run at one destination, written
    through the destination's byte store (paths `<run_id>/receipts/<name>`).

    Writes are create-only: an object already at the key is kept (the first result is the
    record; a concurrent pass certified the same part). An existing object Prefect cannot
    read was left by an older writer: it is set aside as evidence before the new one is
    written (the upload task has already refused to go on if its batch retired anything).
    """

    _block_type_name = "tokcap receipt storage"
    _block_type_slug = "tokcap-receipt-storage"

    dest: str = Field(description="The destination location of the runs.")
    settings: dict[str, Any] = Field(default_factory=dict, description="Public storage options.")
    _run_id: str | None = PrivateAttr(None)

    def for_run(self, run_id: str) -> ReceiptStorage:
        """This saved block, resolving bare result names under run `run_id`'s receipts."""
        bound = self.model_copy()
        bound._run_id = validate_run_id(run_id)
        return bound

    def _split(self, path: str) -> tuple[str, str]:
        older_run = (self.model_extra or {}).get("run_id")  # a block saved for one run
        return _split_result_path(path, self._run_id or older_run)

    def _layout(self, run_id: str) -> RunLayout:
        return RunLayout(open_byte_store(self.dest, self.settings or None), run_id)

    def read_path(self, path: str, _sync: bool | None = None) -> bytes:
        run_id, name = self._split(path)
        layout = self._layout(run_id)
        data = layout.dest.get(layout.receipt_key(name))
        if data is None:
            raise FileNotFoundError(f"no result {receipts_location(self.dest, run_id)}/{name}")
        return data

    async def aread_path(self, path: str) -> bytes:
        return self.read_path(path)

    def write_path(self, path: str, content: bytes, _sync: bool | None = None) -> str:
        run_id, name = self._split(path)
        if not RECEIPT_KEY.match(name):
            return self._write_error_record(run_id, name, content)
        return self._write(run_id, name, content)

    def _write_error_record(self, run_id: str, name: str, content: bytes) -> str:
        """Prefect's record of a failed upload or retire task's error: stored when the
        destination takes it, else only noted. It certifies nothing, and Prefect's warning
        that a result was not written would read as a lost receipt (in an outage, while the
        run itself names each failed batch)."""
        try:
            return self._write(run_id, name, content)
        except Exception as exc:
            logger.info(
                "the error record %s of a failed task could not be stored (%s); no receipt "
                "is affected and the error is in the flow-run logs",
                name,
                " ".join(str(exc).split()),
            )
            return self._layout(run_id).receipt_key(name)

    def _write(self, run_id: str, name: str, content: bytes) -> str:
        layout = self._layout(run_id)
        key = layout.receipt_key(name)
        if layout.dest.create(key, content):
            return key
        existing = layout.dest.get(key)
        if existing is not None and not _is_result_record(existing):
            reason = "Prefect could not read this result object; a new one was written"
            layout.set_aside(name, existing, None, reason)
            if layout.dest.create(key, content):
                return key
            existing = layout.dest.get(key)
        if existing is None:
            raise TransientStoreError(
                f"result {receipts_location(self.dest, run_id)}/{name} was removed while "
                "it was being persisted; the write is safe to retry"
            )
        if existing != content:
            logger.info("result %s was already persisted; the first one is kept", key)
        return key

    async def awrite_path(self, path: str, content: bytes) -> str:
        return self.write_path(path, content)


def _is_result_record(data: bytes) -> bool:
    try:
        ResultRecord.deserialize(data)
    except Exception:
        return False
    return True


@tokcap_task("prepare-receipt-storage", "prepare receipt storage at {dest}")
def receipt_storage(dest: str, storage_options: Mapping[str, Any] | None = None) -> ReceiptStorage:
    """Result storage for the upload and retire tasks: the destination's saved block.

    The block is named by the digest of the destination and its public settings. It is
    read from the API, and saved only when it is missing or no longer holds exactly these:
    a write at every run's start is what a busy server answers 503 (docs/pipeline.md).
    """
    settings = public_storage_options(storage_options)
    digest = hashlib.sha256(orjson.dumps([dest, settings], option=orjson.OPT_SORT_KEYS))
    name = f"tokcap-receipts-{digest.hexdigest()[:20]}"
    try:
        found = ReceiptStorage.load(name)
    except ValueError:  # no block of that name
        found = None
    except RuntimeError as exc:  # Prefect's words for a block that no longer validates
        if not isinstance(exc.__cause__, ValidationError):
            raise
        found = None
    if found is not None and found.dest == dest and found.settings == settings:
        return found
    block = ReceiptStorage(dest=dest, settings=settings)
    block.save(name, overwrite=True)
    return block


def read_receipt(
    dest: str, run_id: str, key: str, storage_options: Mapping[str, Any] | None
) -> HandoffReceipt | None:
    """The persisted receipt under `key`, or `None` only when no object exists there.

    The object is read once through the destination's byte store, so a storage failure
    propagates (the calling task retries a transient one) and never reads as "absent".
    An empty or unparseable object raises `UnrecordedReceiptError`; one that parses but is
    not this batch's receipt raises `UnreadableReceiptError`.
    """
    layout = RunLayout(open_byte_store(dest, storage_options), run_id)
    data = layout.dest.get(layout.receipt_key(key))
    if data is None:
        return None
    return parse_receipt(receipts_location(dest, run_id), key, data, run_id)


def parse_receipt(location: str, key: str, data: bytes, run_id: str) -> HandoffReceipt:
    """Run `run_id`'s receipt `key` from its stored bytes; raises naming `location/key` when
    it is not (a receipt of another batch, or of another run: copied, it certifies nothing
    here, and its part is not among this run's records)."""
    where = f"{location}/{key}"
    if not data or not _parses(data):
        detail = "it is empty" if not data else "it is not whole JSON (torn or garbage)"
        raise UnrecordedReceiptError(_unrecorded(where, detail))
    try:
        receipt = ResultRecord.deserialize(data).result
    except Exception as exc:
        first_line = str(exc).partition("\n")[0][:160]
        detail = f"{type(exc).__name__}: {first_line}"
        raise UnreadableReceiptError(_unreadable(where, detail)) from exc
    if not isinstance(receipt, HandoffReceipt):
        raise UnreadableReceiptError(_unreadable(where, f"it holds {type(receipt).__name__}"))
    if receipt.receipt_key != key:
        detail = f"it holds the receipt of {receipt.receipt_key}"
        raise UnreadableReceiptError(_unreadable(where, detail))
    digest = key.rsplit("-", 1)[-1]
    own_part = part_key(run_id, receipt.batch, digest)
    own_rows = receipt.rows is None or is_rows_key(receipt.rows.key, run_id, receipt.batch, digest)
    if receipt.run_id != run_id or receipt.part_key != own_part or not own_rows:
        raise UnreadableReceiptError(_foreign(where, run_id, receipt))
    return receipt


def _parses(data: bytes) -> bool:
    try:
        orjson.loads(data)
    except orjson.JSONDecodeError:
        return False
    return True


def _unreadable(location: str, detail: str) -> str:
    return (
        f"receipt {location} exists but cannot be read ({detail}). It certifies a batch's "
        "handoff, and that batch's captures may already be retired: do not delete it. Restore "
        "it (from a backup or an earlier object version), then run again; until then nothing "
        "of this run is finalized again or retired"
    )


def _foreign(location: str, run_id: str, receipt: HandoffReceipt) -> str:
    return (
        f"receipt {location} holds the receipt of run {receipt.run_id} (part "
        f"{receipt.part_key}), not of run {run_id}: copied from another run, it certifies "
        f"nothing here, and run {run_id}'s records hold no part of that batch. Remove the "
        f"copied receipts from run {run_id} (run {receipt.run_id} keeps its own), or use run id "
        f"{receipt.run_id}; until then nothing of this run is finalized again or retired"
    )


def _unrecorded(location: str, detail: str) -> str:
    return (
        f"receipt {location} exists but cannot be read ({detail}): it records no handoff. "
        "If nothing of its batch was retired, `tokcap retrigger` hands the batch off again and "
        "keeps the old part aside as evidence; if its batch's captures were retired, do not "
        "delete it: restore it (from a backup or an earlier object version), then run again. "
        "Until then nothing of this batch is retired"
    )


def list_receipt_keys(
    dest: str, run_id: str, storage_options: Mapping[str, Any] | None
) -> list[str]:
    """Keys of every batch receipt persisted for a run."""
    layout = RunLayout(open_byte_store(dest, storage_options), run_id)
    names = [key.rsplit("/", 1)[-1] for key in layout.dest.list_prefix(layout.receipts_prefix)]
    return sorted(name for name in names if RECEIPT_KEY.fullmatch(name))


@tokcap_task("find-receipts", "find receipts of run {run_id}")
def find_receipts(
    dest: str,
    run_id: str,
    keys: list[str] | None,
    storage_options: Mapping[str, Any] | None = None,
    hand_off_unrecorded: bool = False,
) -> dict[str, HandoffReceipt]:
    """Receipts of these batches (every receipt persisted for the run when `keys` is None).

    `hand_off_unrecorded`: leave out a receipt that records no handoff (empty or
    unparseable), so its batch is handed off again; otherwise it raises.
    """
    found = {}
    for key in list_receipt_keys(dest, run_id, storage_options) if keys is None else keys:
        try:
            receipt = read_receipt(dest, run_id, key, storage_options)
        except UnrecordedReceiptError:
            if not hand_off_unrecorded:
                raise
            logger.warning("receipt %s records no handoff; its batch is handed off again", key)
            continue
        if receipt is not None:
            found[key] = receipt
    return found


def set_aside_unrecorded(
    dest: str, run_id: str, finalized: FinalizedBatch, storage_options: Mapping[str, Any] | None
) -> str | None:
    """Before a batch is handed off again, set aside a receipt of it that records no handoff.

    Its bytes and a copy of the batch's old part go under `set-aside/` as evidence and the
    receipt is removed; the old part stays, because it holds exactly the bytes finalized
    now, and the handoff verifies it again. Refused (the receipt error is raised) when
    anything shows the batch may have been retired (`_retirement_seen`). Returns the
    evidence folder, or `None` when there was no such receipt.
    """
    layout = RunLayout(open_byte_store(dest, storage_options), run_id)
    name = finalized.receipt_key
    data = layout.dest.get(layout.receipt_key(name))
    if data is None:
        return None
    try:
        parse_receipt(receipts_location(dest, run_id), name, data, run_id)
    except UnrecordedReceiptError as exc:
        retired = _retirement_seen(layout, finalized)
        if retired:
            raise UnrecordedReceiptError(
                f"{exc} (its batch may have been retired: {retired})"
            ) from None
        return layout.set_aside(name, data, finalized.part_key, str(exc))
    return None


def _retirement_seen(layout: RunLayout, finalized: FinalizedBatch) -> str | None:
    """What shows that the batch may have been retired, in words, or `None`.

    A recorded retirement, a capture the new finalize found retired, or an old part whose
    bytes differ from the batch finalized now (a retired capture no longer rebuilds the same).
    """
    prefix = retirement_key(finalized.receipt_key, "")
    recorded = [k for k in layout.dest.list_prefix(layout.receipts_prefix) if prefix in k]
    if recorded:
        return f"retirement recorded in {recorded[0]}"
    gone = [
        o.rollout_id or f"line {o.line}"
        for o in finalized.outcomes
        if "CaptureRetiredError" in f"{o.mask_reason} {o.error}"
    ]
    if gone:
        return f"captures of {', '.join(gone[:5])} are retired"
    old_part = layout.dest.get(finalized.part_key)
    if old_part is not None and old_part != finalized.part:
        return f"part {finalized.part_key} differs from the batch finalized now"
    return None
