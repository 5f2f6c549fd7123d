"""Prefect's own record of a flow run: the run a retrigger retries and its parameters.

A flow run's parameters are what it was started with, recorded by the server before the run
began, so a retrigger that reads them finalizes with exactly the first attempt's settings.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from prefect.client.orchestration import get_client
from prefect.exceptions import ObjectNotFound
from pydantic import BaseModel

from tokcap.tasks.common import tokcap_task

RETRIGGER_FLOW = "retrigger-failed"
FAILED_RUN = "failed_run"  # the retrigger's parameter naming the flow run it retries


class RetriedRun(BaseModel):
    """A flow run a retrigger retries: its id, its flow's name, the parameters it ran with."""

    flow_run_id: str
    flow: str
    parameters: dict[str, Any]


@tokcap_task("read-retried-run", "read flow run {flow_run_id}")
def read_retried_run(flow_run_id: str) -> RetriedRun:
    """The run whose failure `flow_run_id` stands for: that run, or, for a retrigger that
    failed, the run it retried in turn, back to the first run of the chain.

    Raises `LookupError` naming the flow run when the server has no such run (deleted, or
    not a flow run id) or the chain loops.
    """
    seen: list[str] = []
    with get_client(sync_client=True) as client:
        while True:
            try:
                run = client.read_flow_run(UUID(flow_run_id))
            except (ObjectNotFound, ValueError):
                raise LookupError(f"flow run {flow_run_id!r} is not known to the server") from None
            name = client.read_flow(run.flow_id).name
            earlier = run.parameters.get(FAILED_RUN) if name == RETRIGGER_FLOW else None
            if not earlier:
                return RetriedRun(flow_run_id=flow_run_id, flow=name, parameters=run.parameters)
            seen.append(flow_run_id)
            if str(earlier) in seen:
                raise LookupError(f"flow runs {', '.join(seen)} retrigger each other")
            flow_run_id = str(earlier)
