"""The shipped `prefect.yaml`'s deployments and the parameters their triggers pass.

`triggered_parameters` renders a deployment trigger's `parameters` against a flow run with
Prefect's own templating (single-expression templates keep their type, as on the server),
over the deployment's parameters with its `{{ $TOKCAP_* }}` placeholders filled, as
`prefect deploy` does from the environment. So a test can start the run an automation would
start, without a worker.
"""

from __future__ import annotations

import copy
from contextlib import suppress
from pathlib import Path
from typing import Any

import yaml
from prefect.exceptions import ObjectNotFound
from prefect.server.events.actions import RunDeployment
from prefect.utilities.schema_tools.hydration import HydrationContext, hydrate

from tests.support.pipeline_helpers import REPO
from tokcap.flows.serve import fill

SHIPPED = Path(REPO, "deployments", "prefect.yaml")


def shipped_deployment(name: str) -> dict[str, Any]:
    """One deployment of the shipped file, anchors merged."""
    spec = yaml.safe_load(SHIPPED.read_text(encoding="utf-8"))
    (deployment,) = [d for d in spec["deployments"] if d["name"] == name]
    return deployment


def triggered_parameters(
    deployment: str, flow_run: Any, env: dict[str, str], trigger: int = 0
) -> dict[str, Any]:
    """The parameters of the run that the deployment's `trigger` starts for `flow_run`:
    the deployment's own (placeholders filled from `env`), then the trigger's, rendered."""
    spec = shipped_deployment(deployment)
    rendered = copy.deepcopy(spec["triggers"][trigger]["parameters"])
    RunDeployment._upgrade_v1_templates(rendered)  # as the server does to plain templates
    context = HydrationContext(
        raise_on_error=True, render_jinja=True, jinja_context={"flow_run": flow_run}
    )
    return {**fill(spec.get("parameters") or {}, env), **hydrate(rendered, context)}


def shipped_automation_names() -> list[str]:
    """Every automation the shipped files create: deployment triggers, then automations.yaml."""
    spec = yaml.safe_load(SHIPPED.read_text(encoding="utf-8"))
    triggers = [t["name"] for d in spec["deployments"] for t in d.get("triggers") or []]
    applied = yaml.safe_load(SHIPPED.with_name("automations.yaml").read_text(encoding="utf-8"))
    return triggers + [a["name"] for a in applied["automations"]]


def remove_deployed(pool: str) -> None:
    """Delete the deployments on `pool`, the shipped automations and the store-request limit,
    so later tests of the session see none of them."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        for deployment in client.read_deployments():
            if deployment.work_pool_name == pool:
                client.delete_deployment(deployment.id)
    remove_applied()


def remove_applied() -> None:
    """Delete the shipped automations and the store-request limit `tokcap automations apply`
    creates: left on the session's server, the limit makes every later run wait for the slots
    a killed process held, and the automations retrigger other tests' failed runs."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        for name in shipped_automation_names():
            for automation in client.read_automations_by_name(name):
                client.delete_automation(automation.id)
        with suppress(ObjectNotFound):
            client.delete_global_concurrency_limit_by_name("tokcap-store-requests")
