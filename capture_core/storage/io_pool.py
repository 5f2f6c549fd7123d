"""The process's one thread pool for blocking store I/O awaited from async code.

Stores are opened per task and per batch, so a pool per store would start its threads again
for every batch. This one starts each thread once per process and keeps it; a forked child
starts its own, because its copy of the parent's pool has no threads.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, TypeVar

from capture_core.errors import InvalidInputError

T = TypeVar("T")

# Enough for a few batches in flight at the default store concurrency of 16. Threads start
# on demand (when no idle one is free, or one is just about to become idle), so a larger
# bound costs nothing until concurrent calls use it.
IO_THREADS = 64

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None


def io_pool() -> ThreadPoolExecutor:
    """The shared pool, created on first use."""
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(IO_THREADS, thread_name_prefix="tokcap-io")
        return _pool


async def run_blocking(fn: Callable[..., T], *args: Any) -> T:
    """Run `fn(*args)` on the shared pool and await its result.

    `fn` must not itself wait for other work on this pool: with every thread waiting, none
    would be left to do it.
    """
    return await asyncio.get_running_loop().run_in_executor(io_pool(), fn, *args)


LANE_ITEMS = 8  # items a lane runs per hand-off to the pool, before it lets others in


async def map_blocking(
    fn: Callable[[T], Any],
    items: Sequence[T],
    concurrency: int,
    after: Callable[[Any], None] | None = None,
) -> list[Any]:
    """`fn` over `items` on the shared pool, at most `concurrency` at once; per item, in
    order, what it returned or the `Exception` it raised.

    Each lane hands `LANE_ITEMS` items at a time to the pool, taking the next item as it
    finishes one: a batch of small blocking steps pays the event loop's round trip per few
    items, not per item, other work on the pool interleaves, and a slow item never holds
    up the items behind it. `after(result)` runs in the item's thread once it is done; an
    error there, a `BaseException` from `fn`, or the caller's cancellation stops every lane
    before its next item, waits for the items in flight, and is raised.
    """
    if concurrency < 1:
        raise InvalidInputError(f"concurrency must be at least 1, not {concurrency}")
    results: list[Any] = [None] * len(items)
    pending = deque(enumerate(items))
    stop = threading.Event()
    in_flight: set[Future[None]] = set()

    def run_some() -> None:
        for _ in range(LANE_ITEMS):
            if stop.is_set() or not pending:
                return
            try:
                index, item = pending.popleft()
            except IndexError:
                return
            try:
                results[index] = fn(item)
            except Exception as exc:
                results[index] = exc
            if after is not None:
                after(results[index])

    async def lane() -> None:
        while pending and not stop.is_set():
            future = io_pool().submit(run_some)
            in_flight.add(future)
            await asyncio.wrap_future(future)
            in_flight.discard(future)

    try:
        await asyncio.gather(*(lane() for _ in range(min(concurrency, len(items)))))
    except BaseException:
        stop.set()
        wait(list(in_flight))  # at most one item each: no lane outlives this call
        raise
    return results


def _forget_after_fork() -> None:
    global _lock, _pool
    _lock, _pool = threading.Lock(), None


os.register_at_fork(after_in_child=_forget_after_fork)
