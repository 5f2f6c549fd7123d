"""`tokcap serve` and `tokcap deployments`: run the deployments here, or locate their file.

`serve` is for one machine without a work pool. It serves the deployments `prefect.yaml`
defines (the one definition of their names, parameters and schedules), with the inbox,
store and destination given on the command line in place of the file's `{{ $TOKCAP_* }}`
placeholders. Stop it with Ctrl-C; flow runs appear in the Prefect UI like any other.
The `prefect.yaml` that work pools deploy ships inside the package as `flows.deployments`.
"""

from __future__ import annotations

import re
from importlib.resources import files
from pathlib import Path
from typing import Any

import yaml
from prefect import serve
from prefect.utilities.importtools import import_object

INBOX = "inbox"  # the deployment `tokcap serve --cron` reschedules
PLACEHOLDER = re.compile(r"\{\{\s*\$([A-Z_]+)\s*\}\}")


def prefect_file() -> Path:
    """The installed `prefect.yaml`; pass it to `prefect deploy --prefect-file`."""
    path = Path(str(files("flows.deployments") / "prefect.yaml"))
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing: this tokcap installation is incomplete; reinstall tokcap"
        )
    return path


def deployment_specs() -> list[dict[str, Any]]:
    """The deployments of the shipped `prefect.yaml`, with its anchors merged."""
    return yaml.safe_load(prefect_file().read_text(encoding="utf-8"))["deployments"]


def fill(value: Any, env: dict[str, str]) -> Any:
    """A parameter value with each `{{ $NAME }}` placeholder replaced from `env`."""
    if not isinstance(value, str):
        return value
    return PLACEHOLDER.sub(lambda match: env[match.group(1)], value)


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
    )


def served_deployments(inbox: str, store: str, dest: str, cron: str | None = None) -> list[Any]:
    """Every deployment of `prefect.yaml`, served; `cron` replaces the inbox one's schedule
    only (the others, such as the daily sweep, keep the file's)."""
    env = {"TOKCAP_INBOX": inbox, "TOKCAP_STORE": store, "TOKCAP_DEST": dest}
    specs = deployment_specs()
    return [served_deployment(s, env, cron if s["name"] == INBOX else None) for s in specs]


def serve_deployments(inbox: str, store: str, dest: str, cron: str | None = None) -> None:
    """Serve every deployment of `prefect.yaml`; the scheduled inbox one runs on `cron`."""
    serve(*served_deployments(inbox, store, dest, cron))
