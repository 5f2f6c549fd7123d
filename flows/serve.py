"""`tokcap serve` and `tokcap deployments`: run the deployments here, or locate their file.

`serve` is for one machine without a work pool: the scheduled inbox deployment plus
on-demand ones. Stop it with Ctrl-C; flow runs appear in the Prefect UI like any other.
The `prefect.yaml` that work pools deploy ships inside the package as `flows.deployments`.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from prefect import serve

from flows.clear import dispatch_clear
from flows.finalize import finalize_run, retire_uploaded, retrigger_failed
from flows.inbox import finalize_inbox

DEFAULT_CRON = "*/10 * * * *"


def serve_deployments(inbox: str, store: str, dest: str, cron: str = DEFAULT_CRON) -> None:
    """Serve `finalize_inbox` on `cron`, and the other flows for triggered runs."""
    serve(
        finalize_inbox.to_deployment(
            name="inbox",
            cron=cron,
            parameters={"inbox": inbox, "store": store, "dest": dest},
            tags=["tokcap"],
        ),
        finalize_run.to_deployment(name="on-demand", tags=["tokcap"]),
        dispatch_clear.to_deployment(name="on-demand", tags=["tokcap"]),
        retire_uploaded.to_deployment(name="on-demand", tags=["tokcap"]),
        retrigger_failed.to_deployment(name="on-demand", tags=["tokcap"]),
    )


def prefect_file() -> Path:
    """The installed `prefect.yaml`; pass it to `prefect deploy --prefect-file`."""
    path = Path(str(files("flows.deployments") / "prefect.yaml"))
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing: this tokcap installation is incomplete; reinstall tokcap"
        )
    return path
