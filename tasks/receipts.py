"""Handoff receipts: their Prefect result storage under `<dest>/<run_id>/receipts`, and the
tasks that prepare that storage and find the receipts persisted there.

A local destination uses a path; any other URL uses a saved `RemoteFileSystem` block that
holds only the location and public settings (credentials stay in the environment).
A receipt exists exactly when the upload task's persisted result exists.
Receipts are read through the destination's byte store, never `ResultStore.exists`, which
reads every failure, transient or not, as "absent".
An object there that is not a readable receipt is an error naming it, never "no receipt".
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson
from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.filesystems import RemoteFileSystem
from prefect.results import ResultRecord

from capture_core.config import public_storage_options
from capture_core.handoff import RECEIPT_KEY, HandoffReceipt, UnreadableReceiptError
from capture_core.run_layout import RECEIPTS, RunLayout, run_location
from capture_core.storage import is_s3, local_path, open_byte_store, s3_options
from tasks.common import TRANSIENT_RETRIES


def receipts_location(dest: str, run_id: str) -> str:
    return run_location(dest, run_id, RECEIPTS)


def _remote_settings(dest: str, storage_options: Mapping[str, Any] | None) -> dict[str, Any]:
    settings = public_storage_options(storage_options)
    return s3_options(settings) if is_s3(dest) else settings


@task(name="prepare-receipt-storage", cache_policy=NO_CACHE, **TRANSIENT_RETRIES)
def receipt_storage(
    dest: str, run_id: str, storage_options: Mapping[str, Any] | None = None
) -> Any:
    """Result storage for the upload task: a path, or a saved block for other filesystems."""
    local = local_path(dest)
    if local is not None:
        return Path(local, run_id, RECEIPTS)
    basepath = receipts_location(dest, run_id)
    settings = _remote_settings(dest, storage_options)
    digest = hashlib.sha256(orjson.dumps([basepath, settings], option=orjson.OPT_SORT_KEYS))
    block = RemoteFileSystem(basepath=basepath, settings=settings)
    name = f"tokcap-receipts-{digest.hexdigest()[:20]}"
    block.save(name, overwrite=True)
    return block


def read_receipt(
    dest: str, run_id: str, key: str, storage_options: Mapping[str, Any] | None
) -> HandoffReceipt | None:
    """The persisted receipt under `key`, or `None` only when no object exists there.

    The object is read once through the destination's byte store, so a storage failure
    propagates (the calling task retries a transient one) and never reads as "absent".
    An object that exists but is not this batch's receipt raises `UnreadableReceiptError`.
    """
    layout = RunLayout(open_byte_store(dest, storage_options), run_id)
    data = layout.dest.get(layout.receipt_key(key))
    if data is None:
        return None
    location = f"{receipts_location(dest, run_id)}/{key}"
    try:
        receipt = ResultRecord.deserialize(data).result
    except Exception as exc:
        first_line = str(exc).partition("\n")[0][:160]
        detail = f"{type(exc).__name__}: {first_line}"
        raise UnreadableReceiptError(_unreadable(location, detail)) from exc
    if not isinstance(receipt, HandoffReceipt):
        raise UnreadableReceiptError(_unreadable(location, f"it holds {type(receipt).__name__}"))
    if receipt.receipt_key != key:
        detail = f"it holds the receipt of {receipt.receipt_key}"
        raise UnreadableReceiptError(_unreadable(location, detail))
    return receipt


def _unreadable(location: str, detail: str) -> str:
    return (
        f"receipt {location} exists but cannot be read ({detail}). It certifies a batch's "
        "handoff, and that batch's captures may already be retired: do not delete it. Restore "
        "it (from a backup or an earlier object version), then run again; until then nothing "
        "of this run is finalized again or retired"
    )


def list_receipt_keys(
    dest: str, run_id: str, storage_options: Mapping[str, Any] | None
) -> list[str]:
    """Keys of every batch receipt persisted for a run."""
    layout = RunLayout(open_byte_store(dest, storage_options), run_id)
    names = [key.rsplit("/", 1)[-1] for key in layout.dest.list_prefix(layout.receipts_prefix)]
    return sorted(name for name in names if RECEIPT_KEY.fullmatch(name))


@task(name="find-receipts", cache_policy=NO_CACHE, **TRANSIENT_RETRIES)
def find_receipts(
    dest: str,
    run_id: str,
    keys: list[str] | None,
    storage_options: Mapping[str, Any] | None = None,
) -> dict[str, HandoffReceipt]:
    """Receipts of these batches (every receipt persisted for the run when `keys` is None)."""
    found = {}
    for key in list_receipt_keys(dest, run_id, storage_options) if keys is None else keys:
        receipt = read_receipt(dest, run_id, key, storage_options)
        if receipt is not None:
            found[key] = receipt
    return found
