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
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

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


async def map_blocking(
    fn: Callable[[T], Any], items: Sequence[T], concurrency: int
) -> list[Any | Exception]:
    """`fn` over `items` on the shared pool, at most `concurrency` at once; per item, in
    order, what it returned or the exception it raised.

    Each of the `concurrency` lanes is one hand-off to the pool that takes the next item as
    it finishes one, so a batch of small blocking steps pays the event loop's round trip per
    lane, not per item, and a slow item never holds up the items behind it.
    """
    results: list[Any | Exception] = [None] * len(items)
    pending = deque(enumerate(items))

    def lane() -> None:
        while True:
            try:
                index, item = pending.popleft()
            except IndexError:
                return
            try:
                results[index] = fn(item)
            except Exception as exc:
                results[index] = exc

    await asyncio.gather(*(run_blocking(lane) for _ in range(min(concurrency, len(items)))))
    return results


def _forget_after_fork() -> None:
    global _lock, _pool
    _lock, _pool = threading.Lock(), None


os.register_at_fork(after_in_child=_forget_after_fork)
