"""Inbox bookkeeping: which rollout files are finalized, judged from the destination alone.

A file's run id is derived from its name and full URL, so each file maps to one run.
A run is complete when its ledger shows every rollout handed off and no unreadable line.
Each attempt leaves a create-only marker, so a file that keeps failing is given up on.
This module does not import Prefect.
"""

from __future__ import annotations

import hashlib
import re
import uuid

from capture_core._bytestore import ByteStore
from capture_core.run_manifest import read_ledger
from capture_core.run_report import summarize


def run_id_for_file(url: str) -> str:
    """A valid, stable run id: the file's stem plus a digest of its full URL."""
    stem = url.rstrip("/").rsplit("/", 1)[-1].rsplit(".", 1)[0]
    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", stem).strip("-._")[:80] or "rollouts"
    return f"{safe}-{hashlib.sha256(url.encode()).hexdigest()[:10]}"


def run_completed(dest: ByteStore, run_id: str) -> bool:
    ledger = read_ledger(dest, run_id)
    return ledger is not None and summarize(run_id, ledger).ok and dest.exists(f"{run_id}/run.json")


def attempts(dest: ByteStore, run_id: str) -> int:
    return len(dest.list_prefix(f"{run_id}/attempts"))


def record_attempt(dest: ByteStore, run_id: str) -> None:
    dest.create(f"{run_id}/attempts/{uuid.uuid4().hex}", b'{"attempt": true}')
