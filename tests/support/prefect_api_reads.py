"""Reads from the session's Prefect API: flow runs, task runs, artifacts and logs.

Task runs and artifacts reach the API through events, so readers poll with a deadline.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from prefect import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterFlowRunId,
    ArtifactFilterTaskRunId,
    FlowRunFilter,
    FlowRunFilterId,
    FlowRunFilterName,
    LogFilter,
    LogFilterFlowRunId,
)

from tests.support.servers import wait_until


def flow_runs_named(name: str) -> list[Any]:
    with get_client(sync_client=True) as client:
        return client.read_flow_runs(
            flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[name]))
        )


def flow_run(flow_run_id: str | UUID) -> Any:
    with get_client(sync_client=True) as client:
        return client.read_flow_run(UUID(str(flow_run_id)))


def task_runs_of(flow_run_id: str | UUID) -> list[Any]:
    with get_client(sync_client=True) as client:
        return client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[UUID(str(flow_run_id))]))
        )


def artifacts_of(*, flow_run_id: Any = None, task_run_id: Any = None) -> list[Any]:
    if flow_run_id is not None:
        where = ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[UUID(str(flow_run_id))]))
    else:
        where = ArtifactFilter(task_run_id=ArtifactFilterTaskRunId(any_=[UUID(str(task_run_id))]))
    with get_client(sync_client=True) as client:
        return client.read_artifacts(artifact_filter=where)


def logs_of(flow_run_id: str | UUID) -> list[Any]:
    with get_client(sync_client=True) as client:
        return client.read_logs(
            log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[UUID(str(flow_run_id))]))
        )


def eventually(read: Any, ready: Any, what: str, timeout: float = 90) -> Any:
    """Poll `read()` until `ready(value)`; return the value."""
    box: list[Any] = []

    def check() -> bool:
        box[:] = [read()]
        return bool(ready(box[0]))

    wait_until(check, timeout, what, interval=0.5)
    return box[0]


def flow_runs_of_run(run_id: str) -> list[Any]:
    """The flow runs whose `run_id` parameter is this tokcap run's."""
    with get_client(sync_client=True) as client:
        found = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(name=FlowRunFilterName(like_=run_id))
        )
    return [run for run in found if run.parameters.get("run_id") == run_id]


def crash_running(run_id: str, api_url: str | None = None) -> list[str]:
    """Set the run's Running flow runs Crashed (on `api_url`, else the session's server), as
    the shipped silence automation does for a run whose process died; the ids it set."""
    from contextlib import nullcontext

    from prefect.settings import PREFECT_API_URL, temporary_settings
    from prefect.states import Crashed

    crashed = []
    where = temporary_settings({PREFECT_API_URL: api_url}) if api_url else nullcontext()
    with where, get_client(sync_client=True) as client:
        for run in flow_runs_of_run(run_id):
            if run.state is not None and run.state.is_running():
                state = Crashed(message="tokcap: no heartbeat for 90 s (set by a test)")
                client.set_flow_run_state(run.id, state, force=True)
                crashed.append(str(run.id))
    return crashed
