"""Events a run emits for people to see: the masked fraction crossing its alert threshold.

The shipped automation `tokcap-mask-fraction-alert` (deployments/automations.yaml) fires
on the event, so such a run shows up under Automations and in the event feed. Whether the
alert is due is decided with the report (`capture_core.operator.run_outcome`), so the report says
whether it fired.
"""

from __future__ import annotations

from prefect import get_run_logger
from prefect.events import emit_event

from capture_core.operator.run_outcome import (
    MASK_ALERT_AUTOMATION,
    MASK_ALERT_EVENT,
    mask_alert_due,
    mask_rate,
    mask_rate_line,
)
from capture_core.operator.run_report import RunSummary

MASK_ALERT = MASK_ALERT_EVENT


def alert_on_masks(summary: RunSummary) -> bool:
    """Emit `MASK_ALERT` when more than the summary's alert threshold of the run was masked;
    whether it did.

    Within a flow run the event is related to that run, so the alert links to it.
    """
    if not mask_alert_due(summary):
        return False
    emit_event(
        event=MASK_ALERT,
        resource={
            "prefect.resource.id": f"tokcap.run.{summary.run_id}",
            "prefect.resource.name": summary.run_id,
        },
        payload={
            "run_id": summary.run_id,
            "masked": summary.masked,
            "rollouts": summary.rollouts,
            "masked_fraction": round(mask_rate(summary), 4),
            "threshold": summary.mask_alert_threshold,
            "mask_reasons": summary.mask_reasons,
        },
    )
    get_run_logger().info("run %s: %s", summary.run_id, mask_rate_line(summary))
    return True


def alert_automation() -> str | None:
    """The shipped mask alert automation's name when the Prefect API has it enabled, else
    `None` (a temporary server has no automations; an API that cannot say counts as none)."""
    from prefect.client.orchestration import get_client

    try:
        with get_client(sync_client=True) as client:
            found = client.read_automations_by_name(MASK_ALERT_AUTOMATION)
    except Exception as exc:  # a line of the report must not fail the run
        get_run_logger().warning("could not read the automations: %s", exc)
        return None
    return MASK_ALERT_AUTOMATION if any(a.enabled for a in found) else None
