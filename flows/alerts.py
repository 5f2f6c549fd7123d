"""Events a run emits for people to see: the masked fraction crossing its alert threshold.

The shipped automation `tokcap-mask-fraction-alert` (deployments/automations.yaml) fires
on the event, so such a run shows up under Automations and in the event feed.
"""

from __future__ import annotations

from prefect import get_run_logger
from prefect.events import emit_event

from capture_core.run.run_report import RunSummary

MASK_ALERT = "tokcap.run.mask-fraction.exceeded"


def masked_fraction(summary: RunSummary) -> float:
    """The fraction of the run's rollouts that were masked (0 for an empty run)."""
    return summary.masked / summary.rollouts if summary.rollouts else 0.0


def alert_on_masks(summary: RunSummary, threshold: float | None) -> bool:
    """Emit `MASK_ALERT` when more than `threshold` of the run was masked; whether it did.

    Within a flow run the event is related to that run, so the alert links to it.
    """
    fraction = masked_fraction(summary)
    if threshold is None or fraction <= threshold:
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
            "masked_fraction": round(fraction, 4),
            "threshold": threshold,
            "mask_reasons": summary.mask_reasons,
        },
    )
    get_run_logger().info(
        "run %s masked %d of %d rollouts (%.1f%%), above the alert threshold of %.1f%%",
        summary.run_id,
        summary.masked,
        summary.rollouts,
        100 * fraction,
        100 * threshold,
    )
    return True
