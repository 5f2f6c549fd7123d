"""Retry policy and helpers shared by the tasks, and the quiet task-run log of tokcap's flows."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, ParamSpec, TypeVar

from prefect import Task, task
from prefect.cache_policies import NO_CACHE

from capture_core.errors import is_transient
from capture_core.run.inbox import Claim, check_claim
from capture_core.run.retry_delays import transient_retry_delays
from capture_core.storage import open_byte_store

T = TypeVar("T")
P = ParamSpec("P")
TASK_RUN_LOGGER = "prefect.task_runs"


def in_tokcap_flow() -> bool:
    """Whether the calling code runs inside a flow run of one of tokcap's flows."""
    from prefect.context import FlowRunContext

    context = FlowRunContext.get()
    flow = getattr(context, "flow", None)
    return getattr(getattr(flow, "fn", None), "__module__", "").startswith("tokcap.flows.")


class QuietCompletions(logging.Filter):
    """Drops a task run's "Finished in state Completed()" (or Cached) line in tokcap's flows.

    A run of many batches would log one per task (half of its lines in the UI); the task's
    own lines say what it did, and a failed task's state is still logged. Other flows in
    the same process keep Prefect's lines.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        routine = record.levelno == logging.INFO and record.module == "task_engine"
        if not routine or not str(record.msg).startswith("Finished in state "):
            return True
        return not in_tokcap_flow()


def quiet_task_completions() -> None:
    """Install `QuietCompletions` on Prefect's task-run logger, once per process."""
    logger = logging.getLogger(TASK_RUN_LOGGER)
    if not any(isinstance(f, QuietCompletions) for f in logger.filters):
        logger.addFilter(QuietCompletions())


quiet_task_completions()


def retry_transient(task: Any, task_run: Any, state: Any) -> bool:
    """Retry only what a retry can fix: unreachable storage and I/O hiccups, not bad input."""
    try:
        state.result()
    except Exception as exc:
        return is_transient(exc)
    return False


_DELAYS = transient_retry_delays()  # read once, when the tasks are imported
TRANSIENT_RETRIES: dict[str, Any] = {
    "retries": len(_DELAYS),
    "retry_delay_seconds": _DELAYS,
    "retry_condition_fn": retry_transient,
}


def tokcap_task(
    name: str, run_name: str | Callable[..., str]
) -> Callable[[Callable[P, T]], Task[P, T]]:
    """The decorator of tokcap's uncached tasks: `name` in the task list, each run named by
    `run_name` (what it did to which batch, file or run), retried on transient errors only.
    Tasks whose results are persisted as records of a handoff declare their own policy."""
    return task(name=name, task_run_name=run_name, cache_policy=NO_CACHE, **TRANSIENT_RETRIES)


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
