"""Retry policy and helpers shared by the tasks."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Coroutine, Mapping
from typing import Any, TypeVar

from capture_core.errors import is_transient
from capture_core.run.inbox import Claim, check_claim
from capture_core.storage import open_byte_store

T = TypeVar("T")


def retry_transient(task: Any, task_run: Any, state: Any) -> bool:
    """Retry only what a retry can fix: unreachable storage and I/O hiccups, not bad input."""
    try:
        state.result()
    except Exception as exc:
        return is_transient(exc)
    return False


TRANSIENT_RETRIES: dict[str, Any] = {
    "retries": 3,
    "retry_delay_seconds": [1, 4, 10],
    "retry_condition_fn": retry_transient,
}


def run_async(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine from a sync task, also when the calling thread already runs a loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


def ensure_claim(
    dest: str, claim: Claim | None, storage_options: Mapping[str, Any] | None = None
) -> None:
    """Before a write that decides the run's state: fail unless the pass still holds `claim`.

    `None` means the run is not an inbox pass (a CLI or deployment run) and holds no claim.
    """
    if claim is not None:
        check_claim(open_byte_store(dest, storage_options), claim)
