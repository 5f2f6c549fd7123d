"""The shared I/O thread pool: stores opened per batch reuse its threads; a fork gets its own."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path

import pytest

from capture_core.storage.io_pool import io_pool, map_blocking
from capture_core.store import TokenCaptureStore
from capture_core.store.nemo_gym_store import NemoGymFileStore
from tests.support.token_calls import token_call


def io_threads() -> set[threading.Thread]:
    """The live I/O threads, as objects: a thread's ident can be reused by a later thread."""
    return {t for t in threading.enumerate() if t.name.startswith("tokcap-io")}


async def put_and_freeze(store: TokenCaptureStore | NemoGymFileStore, rollout_id: str) -> int:
    await store.put(token_call("c1", [1, 2], [3], rollout_id=rollout_id))
    return len((await store.freeze(rollout_id)).entries)


def test_stores_opened_one_after_another_run_io_on_the_one_shared_pool(tmp_path: Path) -> None:
    """A pool per store would start threads of its own for each of the 20 stores and end
    them when the store closes.

    How many threads the shared pool starts depends on timing (a call submitted just before
    the last one's worker marks itself idle starts another), so the test judges which pool
    ran the calls and whether its threads outlive the stores, never a count.
    """
    seen: set[threading.Thread] = set()
    for n in range(20):
        if n % 2:
            (tmp_path / f"gym{n}").mkdir()
            store: TokenCaptureStore | NemoGymFileStore = NemoGymFileStore(tmp_path / f"gym{n}")
        else:
            store = TokenCaptureStore(str(tmp_path / f"s{n}"))
        assert asyncio.run(put_and_freeze(store, "r1")) == 1
        seen |= io_threads()  # taken before close, while a private pool's threads would live
        store.close_now()
    assert seen, "the stores ran their I/O on threads"
    shared = set(io_pool()._threads)
    assert seen <= shared, f"{len(seen - shared)} I/O threads outside the shared pool"
    assert all(thread.is_alive() for thread in seen), "closing a store ended a pool thread"


def wait_for_child(pid: int, seconds: float) -> int | None:
    """The child's exit code, or `None` if it is still running at the deadline (then killed)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return None


def test_a_forked_child_runs_store_io_on_a_pool_of_its_own(tmp_path: Path) -> None:
    store = TokenCaptureStore(str(tmp_path / "store"))
    asyncio.run(put_and_freeze(store, "parent"))  # the parent's pool has idle threads now
    pid = os.fork()
    if pid == 0:  # the child: its copy of the parent's pool has no threads behind it
        code = 1
        try:
            code = 0 if asyncio.run(put_and_freeze(store, "child")) == 1 else 1
        finally:
            os._exit(code)
    assert wait_for_child(pid, 60.0) == 0, "the child's async put never ran"
    assert len(store.freeze_now("child").entries) == 1


def test_map_blocking_keeps_order_and_gives_each_item_its_own_error() -> None:
    def fn(i: int) -> int:
        if i % 5 == 0:
            raise ValueError(f"item {i}")
        return i * i

    results = asyncio.run(map_blocking(fn, list(range(40)), 3))
    for i, result in enumerate(results):
        if i % 5 == 0:
            assert isinstance(result, ValueError) and str(result) == f"item {i}"
        else:
            assert result == i * i


def test_map_blocking_refuses_no_concurrency() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        asyncio.run(map_blocking(lambda i: i, [1, 2], 0))


def test_map_blocking_stopped_by_its_caller_leaves_no_lane_running() -> None:
    """Cancelled (a timeout) or failed (`after` raising), no item starts after it returned."""
    started: list[int] = []
    gate = threading.Event()

    def slow(i: int) -> int:
        started.append(i)
        gate.wait(0.05)
        return i

    async def cancelled() -> None:
        await asyncio.wait_for(map_blocking(slow, list(range(200)), 4), 0.2)

    with pytest.raises(asyncio.TimeoutError):
        asyncio.run(cancelled())
    count = len(started)
    assert 0 < count < 200
    assert not gate.wait(0.3) and len(started) == count, "no lane went on after the caller"

    def refuse(result: int) -> None:
        if result == 7:
            raise RuntimeError("stop here")

    started.clear()
    with pytest.raises(RuntimeError, match="stop here"):
        asyncio.run(map_blocking(slow, list(range(200)), 4, after=refuse))
    count = len(started)
    assert count < 200 and not gate.wait(0.3) and len(started) == count
