"""`tokcap serve`: serve the deployments with their schedules from this process.

For one machine without a work pool: the scheduled inbox deployment plus on-demand ones.
Stop it with Ctrl-C; flow runs appear in the Prefect UI like any other.
"""

from __future__ import annotations

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
