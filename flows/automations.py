"""`tokcap automations apply`: create the shipped automations and global concurrency limits.

The definitions live in `automations.yaml` next to the shipped `prefect.yaml`. Applying is
idempotent: an automation of the same name is replaced, a limit of the same name is set to
the file's value. The file's `tokcap-crash-silent-runs` marks a run whose heartbeats stopped
Crashed. The retrigger of failed and crashed runs is not here: it is a deployment trigger in
`prefect.yaml`, created by `prefect deploy` (or `tokcap serve`) with the deployment it runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from tokcap.flows.serve import prefect_file

STORE_REQUESTS = "tokcap-store-requests"


class Applied(BaseModel):
    """What `apply_automations` created: automation names and each limit with its value."""

    automations: list[str]
    limits: dict[str, int]


def automations_file() -> Path:
    """The shipped `automations.yaml`."""
    return prefect_file().with_name("automations.yaml")


def load_definitions(path: Path | None = None) -> dict[str, Any]:
    return yaml.safe_load((path or automations_file()).read_text(encoding="utf-8"))


def apply_automations(path: Path | None = None, store_request_limit: int | None = None) -> Applied:
    """Create or replace every automation of the file and set its concurrency limits.

    `store_request_limit` replaces the file's limit on concurrent store requests.
    """
    from prefect.client.orchestration import get_client
    from prefect.events.schemas.automations import AutomationCore

    spec = load_definitions(path)
    limits = {item["name"]: int(item["limit"]) for item in spec.get("concurrency_limits", [])}
    if store_request_limit is not None:
        limits[STORE_REQUESTS] = store_request_limit
    automations = [AutomationCore.model_validate(a) for a in spec.get("automations", [])]
    with get_client(sync_client=True) as client:
        for name, limit in limits.items():
            set_limit(client, name, limit)
        for automation in automations:
            for old in client.read_automations_by_name(automation.name):
                client.delete_automation(old.id)
            client.create_automation(automation)
    return Applied(automations=[a.name for a in automations], limits=limits)


def set_limit(client: Any, name: str, limit: int) -> None:
    """Create the global concurrency limit, or set an existing one to `limit`."""
    from prefect.client.schemas.actions import (
        GlobalConcurrencyLimitCreate,
        GlobalConcurrencyLimitUpdate,
    )
    from prefect.exceptions import ObjectNotFound

    try:
        client.read_global_concurrency_limit_by_name(name)
    except ObjectNotFound:
        client.create_global_concurrency_limit(
            GlobalConcurrencyLimitCreate(name=name, limit=limit, active=True)
        )
        return
    client.update_global_concurrency_limit(
        name, GlobalConcurrencyLimitUpdate(limit=limit, active=True)
    )
