"""`tokcap serve` and `tokcap deployments`: run the deployments here, or locate their file.

`serve` is for one machine without a work pool. It serves the deployments `prefect.yaml`
defines (the one definition of their names, parameters and schedules), with the inbox,
store and destination given on the command line in place of the file's `{{ $TOKCAP_* }}`
placeholders, triggers included; the inbox settings come from their `TOKCAP_*` variables
as for `prefect deploy` (`tokcap.flows.deploy_settings`). Stop it with Ctrl-C; flow runs
appear in the Prefect UI. It polls for runs every `WORKER_QUERY_SECONDS`, as shipped workers do.
It needs a server that runs schedules: Prefect's temporary server runs none, so without
`PREFECT_API_URL` (or with a server whose scheduler is off) it refuses, saying what to start.
The `prefect.yaml` that work pools deploy ships inside the package as `tokcap.deployments`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from importlib.resources import files
from pathlib import Path
from typing import Any

import yaml
from prefect import serve
from prefect.utilities.importtools import import_object

from tokcap.flows.deploy_settings import placeholder_values

INBOX = "inbox"  # the deployment `tokcap serve --cron` reschedules
# How often a worker (and `tokcap serve`) asks the server for runs to start, in seconds. A
# submitted file's run waits on average half of it for a free worker: Prefect's default of 10
# made that 5 s of a submit's latency. The shipped worker command and deployments/Dockerfile
# set PREFECT_WORKER_QUERY_SECONDS to it; each poll is one request to the server.
WORKER_QUERY_SECONDS = 2
PLACEHOLDER = re.compile(r"\{\{\s*\$([A-Z_]+)\s*\}\}")


def prefect_file() -> Path:
    """The installed `prefect.yaml`; pass it to `prefect deploy --prefect-file`."""
    path = Path(str(files("tokcap.deployments") / "prefect.yaml"))
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing: this tokcap installation is incomplete; reinstall tokcap"
        )
    return path


def deployment_specs() -> list[dict[str, Any]]:
    """The deployments of the shipped `prefect.yaml`, with its anchors merged."""
    return yaml.safe_load(prefect_file().read_text(encoding="utf-8"))["deployments"]


def fill(value: Any, env: Mapping[str, str]) -> Any:
    """A value with each `{{ $NAME }}` placeholder replaced from `env`, in nested mappings
    and lists too; an inbox setting's variable gives its checked value, typed, or the
    shipped default where unset (`deploy_settings`). Other templates
    (`{{ event.payload.x }}`) are left for the server."""
    return _filled(value, {**env, **placeholder_values(env)})


def _filled(value: Any, values: Mapping[str, Any]) -> Any:
    if isinstance(value, dict):
        return {key: _filled(item, values) for key, item in value.items()}
    if isinstance(value, list):
        return [_filled(item, values) for item in value]
    if not isinstance(value, str):
        return value
    whole = PLACEHOLDER.fullmatch(value)
    if whole:
        return values[whole.group(1)]
    return PLACEHOLDER.sub(lambda match: str(values[match.group(1)]), value)


def served_triggers(spec: dict[str, Any], env: dict[str, str]) -> list[Any]:
    """The deployment's `triggers:` of the file, as Prefect deployment triggers."""
    from prefect.events import DeploymentTriggerTypes
    from pydantic import TypeAdapter

    adapter: TypeAdapter[Any] = TypeAdapter(DeploymentTriggerTypes)
    return [adapter.validate_python(fill(t, env)) for t in spec.get("triggers") or []]


def served_deployment(spec: dict[str, Any], env: dict[str, str], cron: str | None) -> Any:
    """One deployment of the file as a served deployment; `cron` replaces its schedule."""
    flow = import_object(spec["entrypoint"])
    parameters = {name: fill(value, env) for name, value in spec.get("parameters", {}).items()}
    schedules = spec.get("schedules") or []
    return flow.to_deployment(
        name=spec["name"],
        description=spec.get("description"),
        parameters=parameters,
        tags=spec.get("tags") or [],
        cron=(cron or schedules[0]["cron"]) if schedules else None,
        triggers=served_triggers(spec, env),
    )


def served_deployments(inbox: str, store: str, dest: str, cron: str | None = None) -> list[Any]:
    """Every deployment of `prefect.yaml`, served; `cron` replaces the inbox one's schedule
    only (the others, such as the daily sweep, keep the file's). The inbox settings come
    from their `TOKCAP_*` variables, as `prefect deploy` takes them."""
    env = {**os.environ, "TOKCAP_INBOX": inbox, "TOKCAP_STORE": store, "TOKCAP_DEST": dest}
    specs = deployment_specs()
    return [served_deployment(s, env, cron if s["name"] == INBOX else None) for s in specs]


class NoSchedulerError(RuntimeError):
    """No server that runs schedules is configured; the message says what to start."""


START_ONE = (
    "start one with `prefect server start` and set PREFECT_API_URL=http://127.0.0.1:4200/api "
    "(Prefect's temporary server runs no schedules)"
)


def check_scheduling_server() -> None:
    """Raise `NoSchedulerError` unless `PREFECT_API_URL` names a server whose scheduler runs.

    The server's own settings say whether its scheduler service is enabled. A temporary
    server of another process cannot be told apart from a full one this way.
    """
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL

    api_url = PREFECT_API_URL.value()
    if not api_url:
        raise NoSchedulerError(f"no Prefect server that runs schedules is configured: {START_ONE}")
    with get_client(sync_client=True) as client:
        settings = client.request("GET", "/admin/settings").json()
    scheduler = settings.get("server", {}).get("services", {}).get("scheduler", {})
    if not scheduler.get("enabled", True):
        raise NoSchedulerError(
            f"the Prefect server at {api_url} runs no scheduler "
            "(PREFECT_SERVER_SERVICES_SCHEDULER_ENABLED is false there): enable it, or " + START_ONE
        )


OLD_ENTRYPOINT = ("flows.", "tasks.")
REDEPLOY = (
    "redeploy: TOKCAP_INBOX=... TOKCAP_STORE=... TOKCAP_DEST=... prefect --no-prompt deploy --all "
    '--prefect-file "$(tokcap deployments)"'
)


def outdated_deployments() -> list[str]:
    """One line per deployment on the `PREFECT_API_URL` server whose entrypoint names the
    top-level `flows` package of releases before `tokcap.flows` (its runs cannot import it)."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        flows = {f.id: f.name for f in client.read_flows()}
        found = client.read_deployments()
    return [
        f"deployment {flows.get(d.flow_id, '?')}/{d.name} runs the old entrypoint "
        f"{d.entrypoint}, which this tokcap no longer has; {REDEPLOY}"
        for d in found
        if (d.entrypoint or "").startswith(OLD_ENTRYPOINT)
    ]


def serve_deployments(inbox: str, store: str, dest: str, cron: str | None = None) -> None:
    """Serve every deployment of `prefect.yaml`, triggers included, on a server that runs
    schedules; the scheduled inbox one runs on `cron`."""
    check_scheduling_server()
    serve(*served_deployments(inbox, store, dest, cron), query_seconds=runner_query_seconds())


def runner_query_seconds() -> float | None:
    """`WORKER_QUERY_SECONDS` for the served runner, unless `PREFECT_RUNNER_POLL_FREQUENCY`
    is set (`None`: Prefect reads that setting)."""
    return None if os.environ.get("PREFECT_RUNNER_POLL_FREQUENCY") else WORKER_QUERY_SECONDS
