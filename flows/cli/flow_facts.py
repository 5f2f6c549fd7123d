"""The Prefect API's view of tokcap runs, for `tokcap status` and `tokcap runs`.

A tokcap run's flow runs carry its run id in their `run_id` parameter and, once started, in
their name (`finalize ID from ...`, `inbox file ID`, `retrigger ID`): started ones are found
by their flow and that name (exact, or its `finalize ID from ` prefix), newest start first;
those not started yet among the Scheduled and Pending runs of tokcap's run flows, soonest
due first; all are kept by their `run_id` parameter (Prefect filters no parameter).
A running one's last sign of life is its last heartbeat event, else its start.
A submitted file's event (`tokcap.inbox.file.submitted`, resource `tokcap.inbox-file.ID`)
tells that it was announced before any flow run exists. The API is asked only when
`PREFECT_API_URL` is set, and its health is probed first, so a server that is down costs
seconds, not Prefect's minutes of retries. The decision itself is
`capture_core.operator.run_verdict`'s.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from capture_core.operator.run_verdict import FlowFacts, FlowRunFact

logger = logging.getLogger(__name__)

HEARTBEAT = "prefect.flow-run.heartbeat"
RUNS_READ = 50  # flow runs read per tokcap run and name: its attempts and retriggers
WAITING_READ = 200  # flow runs not started yet, per flow, read once per command
RUN_FLOWS = ("finalize-inbox-file", "finalize-run", "retrigger-failed")
"""The flows whose runs carry a tokcap run (and that the shipped automations act on)."""
AUTOMATED_TAG = "tokcap"
"""The tag of the shipped deployments: the automations act only on their runs."""


def api_url() -> str | None:
    """The configured `PREFECT_API_URL`, or `None`."""
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value() or None


def flow_facts(run_ids: list[str]) -> dict[str, FlowFacts] | None:
    """Each run's flow facts; `None` when no `PREFECT_API_URL` is set. A server that cannot
    be reached (or that fails a read) gives every run `reachable=False` and the reason."""
    url = api_url()
    if url is None:
        return None
    why = _unreachable(url)
    if why is None:
        try:
            return _read_all(run_ids)
        except Exception as exc:  # a read refused or cut: told, not raised
            why = f"reading flow runs from {url} failed: {type(exc).__name__}: {exc}"
    return {run_id: FlowFacts(reachable=False, why_not=why) for run_id in run_ids}


def _unreachable(url: str) -> str | None:
    """Why the API at `url` cannot be asked now, or `None` when its health answered."""
    import httpx

    from tokcap.flows.api_watch import PROBE_TIMEOUT_SECONDS

    try:
        with httpx.Client(timeout=PROBE_TIMEOUT_SECONDS) as client:
            client.get(f"{url.rstrip('/')}/health").raise_for_status()
    except httpx.HTTPError as exc:
        return f"the Prefect API at {url} did not answer ({' '.join(str(exc).split())})"
    return None


def _read_all(run_ids: list[str]) -> dict[str, FlowFacts]:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        waiting = _waiting_runs(client)
        return {run_id: _read_one(client, run_id, waiting) for run_id in run_ids}


def _of_flow(name: str) -> Any:
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName

    return FlowFilter(name=FlowFilterName(any_=[name]))


def _waiting_runs(client: Any) -> list[Any]:
    """Flow runs of tokcap's run flows not started yet (Scheduled, Pending), soonest due
    first, per flow (a backlog of one flow cuts no retrigger off). A deployment's run is
    named by its flow's `flow_run_name` only when it starts, so these are kept by
    parameter, not name."""
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.client.schemas.sorting import FlowRunSort

    waiting = FlowRunFilterStateType(any_=[StateType.SCHEDULED, StateType.PENDING])
    where = FlowRunFilter(state=FlowRunFilterState(type=waiting))
    found: list[Any] = []
    for flow in RUN_FLOWS:
        found += client.read_flow_runs(
            flow_filter=_of_flow(flow),
            flow_run_filter=where,
            sort=FlowRunSort.EXPECTED_START_TIME_ASC,
            limit=WAITING_READ,
        )
    return found


def _started_runs(client: Any, run_id: str) -> list[Any]:
    """The run's flow runs that started, by flow and name, newest start first."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName
    from prefect.client.schemas.sorting import FlowRunSort

    names = {
        "finalize-inbox-file": FlowRunFilterName(any_=[f"inbox file {run_id}"]),
        "retrigger-failed": FlowRunFilterName(any_=[f"retrigger {run_id}"]),
        "finalize-run": FlowRunFilterName(like_=f"finalize {run_id} from "),
    }
    found: list[Any] = []
    for flow, name in names.items():
        found += client.read_flow_runs(
            flow_filter=_of_flow(flow),
            flow_run_filter=FlowRunFilter(name=name),
            sort=FlowRunSort.START_TIME_DESC,
            limit=RUNS_READ,
        )
    return found


def _read_one(client: Any, run_id: str, waiting: list[Any]) -> FlowFacts:
    found = _started_runs(client, run_id)
    named = {run.id for run in found}
    found = [*found, *(run for run in waiting if run.id not in named)]
    mine = [run for run in found if str(run.parameters.get("run_id")) == run_id]
    flows = {run.flow_id: client.read_flow(run.flow_id).name for run in mine}
    facts = [_fact(client, run, flows[run.flow_id]) for run in mine]
    announced = not facts and _announced(client, run_id)
    return FlowFacts(reachable=True, runs=facts, announced=announced)


def _fact(client: Any, run: Any, flow: str) -> FlowRunFact:
    state = run.state
    state_type = state.type.value if state is not None else "PENDING"
    last = _seconds(run.start_time)
    if state_type in ("RUNNING", "CANCELLING"):
        last = max(filter(None, [last, _last_heartbeat(client, str(run.id))]), default=None)
    return FlowRunFact(
        id=str(run.id),
        name=run.name,
        flow=flow,
        state_type=state_type,
        state_name=state.name if state is not None else "Pending",
        message=(state.message or "") if state is not None else "",
        expected_start=_seconds(run.next_scheduled_start_time or run.expected_start_time),
        last_sign=last,
        updated=_seconds(state.timestamp if state is not None else run.created) or 0.0,
        automated=run.deployment_id is not None and AUTOMATED_TAG in (run.tags or []),
        pool=run.work_pool_name or "",
    )


def _events(client: Any, name: str, resource: str) -> list[Any]:
    from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter

    where = EventFilter(
        event=EventNameFilter(name=[name]), resource=EventResourceFilter(id=[resource])
    )
    return list(client.read_events(filter=where, limit=1).events)


def _last_heartbeat(client: Any, flow_run_id: str) -> float | None:
    beats = _events(client, HEARTBEAT, f"prefect.flow-run.{flow_run_id}")
    return _seconds(beats[0].occurred) if beats else None


def _announced(client: Any, run_id: str) -> bool:
    """Whether a submit event announced this run's file (no flow run exists yet)."""
    from tokcap.flows.submit import RESOURCE_PREFIX, SUBMITTED

    return bool(_events(client, SUBMITTED, RESOURCE_PREFIX + run_id))


def _seconds(at: datetime | None) -> float | None:
    return None if at is None else at.timestamp()
