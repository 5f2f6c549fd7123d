"""A capture source that stalls mid-run, so tests can hold or kill a run at a known point.

`StallingStore` is a `TokenCaptureStore` whose freeze of one rollout stalls its first caller,
across processes: the first caller creates `flag` (naming its pid and `TOKCAP_TEST_WORKER`),
then waits until `flag + ".release"` exists. Every later caller passes straight through.
Deployments name it as a `module.path:ClassName` store with `source_kwargs`.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import orjson

from capture_core.protocols import TokenCaptureSnapshot
from capture_core.store import TokenCaptureStore
from tests.support.servers import wait_until

WORKER_ENV = "TOKCAP_TEST_WORKER"
T = TypeVar("T")


def read_flag(flag: str) -> dict | None:
    """The stalled caller's `{"pid", "worker"}`, or `None` before anyone stalled."""
    try:
        with open(flag, "rb") as f:
            return orjson.loads(f.read())
    except FileNotFoundError:
        return None


def release(flag: str) -> None:
    with open(flag + ".release", "wb"):
        pass


def run_while_stalled(run: Callable[[], T], flag: str, timeout: float = 300) -> tuple[T, T]:
    """Start `run` in a thread until it stalls on `flag`, call `run` again meanwhile, then
    release the first; returns (first result, second result)."""
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(run)
        wait_until(lambda: read_flag(flag) is not None or first.done(), 120, "pass 1 to stall")
        try:
            second = run()
        finally:
            release(flag)
        return first.result(timeout=timeout), second


def _claim_flag(flag: str) -> bool:
    """Create `flag` with our identity, atomically and only once across processes."""
    draft = f"{flag}.{os.getpid()}.draft"
    with open(draft, "wb") as f:
        f.write(orjson.dumps({"pid": os.getpid(), "worker": os.environ.get(WORKER_ENV)}))
    try:
        os.link(draft, flag)
        return True
    except FileExistsError:
        return False
    finally:
        os.unlink(draft)


class StallingStore:
    """Capture store at `root` (on S3 with `storage_options`); the first freeze of
    `stall_rollout` stalls (see module doc)."""

    def __init__(
        self,
        root: str,
        stall_rollout: str,
        flag: str,
        stall_seconds: float = 300,
        storage_options: dict | None = None,
    ):
        self.store = TokenCaptureStore(root, storage_options)
        self.stall_rollout, self.flag, self.stall_seconds = stall_rollout, flag, stall_seconds

    async def freeze(self, rollout_id: str) -> TokenCaptureSnapshot:
        if rollout_id == self.stall_rollout and _claim_flag(self.flag):
            deadline = time.monotonic() + self.stall_seconds
            while not os.path.exists(self.flag + ".release"):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"stalled freeze of {rollout_id} was never released")
                await asyncio.sleep(0.05)
        return await self.store.freeze(rollout_id)

    async def drop(self, rollout_id: str, *, snapshot_id: str, version: int) -> bool:
        return await self.store.drop(rollout_id, snapshot_id=snapshot_id, version=version)

    async def close(self) -> None:
        await self.store.close()
