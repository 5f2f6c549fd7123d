"""Where handoff receipts live: Prefect result storage under `<dest>/<run_id>/receipts`.

A local destination uses a path; any other URL uses a saved `RemoteFileSystem` block that
holds only the location and public settings (credentials stay in the environment).
A receipt exists exactly when the upload task's persisted result exists.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson
from prefect.filesystems import LocalFileSystem, RemoteFileSystem
from prefect.results import ResultStore
from prefect.serializers import JSONSerializer

from capture_core._fsspec import s3_options
from capture_core.config import public_storage_options
from capture_core.handoff import HandoffReceipt
from capture_core.store import local_path, open_byte_store

RECEIPTS = "receipts"


def _local_root(dest: str) -> str | None:
    return local_path(dest)


def receipts_location(dest: str, run_id: str) -> str:
    return f"{dest.rstrip('/')}/{run_id}/{RECEIPTS}"


def _remote_settings(dest: str, storage_options: Mapping[str, Any] | None) -> dict[str, Any]:
    settings = public_storage_options(storage_options)
    return s3_options(settings) if dest.startswith(("s3://", "s3a://")) else settings


def receipt_storage(dest: str, run_id: str, storage_options: Mapping[str, Any] | None) -> Any:
    """Result storage for the upload task: a path, or a saved block for other filesystems."""
    local = _local_root(dest)
    if local is not None:
        return Path(local, run_id, RECEIPTS)
    basepath = receipts_location(dest, run_id)
    settings = _remote_settings(dest, storage_options)
    digest = hashlib.sha256(orjson.dumps([basepath, settings], option=orjson.OPT_SORT_KEYS))
    block = RemoteFileSystem(basepath=basepath, settings=settings)
    name = f"tokcap-receipts-{digest.hexdigest()[:20]}"
    block.save(name, overwrite=True)
    return block


def _reader(dest: str, run_id: str, storage_options: Mapping[str, Any] | None) -> ResultStore:
    local = _local_root(dest)
    if local is not None:
        block: Any = LocalFileSystem(basepath=os.path.join(local, run_id, RECEIPTS))
    else:
        block = RemoteFileSystem(
            basepath=receipts_location(dest, run_id),
            settings=_remote_settings(dest, storage_options),
        )
    return ResultStore(result_storage=block, serializer=JSONSerializer())


def read_receipt(
    dest: str, run_id: str, key: str, storage_options: Mapping[str, Any] | None
) -> HandoffReceipt | None:
    """The persisted receipt under `key`, or `None` when that batch was not handed off."""
    store = _reader(dest, run_id, storage_options)
    if not store.exists(key):
        return None
    receipt = store.read(key).result
    if not isinstance(receipt, HandoffReceipt):
        raise ValueError(
            f"result {key} under {receipts_location(dest, run_id)} is not a receipt; "
            "something else wrote into the receipts folder, move it away"
        )
    return receipt


def list_receipt_keys(
    dest: str, run_id: str, storage_options: Mapping[str, Any] | None
) -> list[str]:
    """Keys of every batch receipt persisted for a run."""
    byte_store = open_byte_store(dest, storage_options)
    prefix = f"{run_id}/{RECEIPTS}"
    names = [key.rsplit("/", 1)[-1] for key in byte_store.list_prefix(prefix)]
    return sorted(n for n in names if n.startswith("batch-") and not n.endswith("-retired"))
