"""A retrigger that finds its file still claimed by a dead run is scheduled for the claim's lapse.

A run killed while it held an inbox file's claim renews it no more, but the claim stays live
until its lease runs out (`claim_lease_seconds`, 300 s as shipped). Waiting that out inside a
flow run would hold a worker slot the whole time: with one worker, every file submitted
meanwhile would wait too. So a retrigger started from its deployment that finds the claim
live schedules a new run of the same deployment, with its own parameters, at the lapse, and
ends at once. That scheduled run is a Scheduled flow run of `retrigger-failed` whose
parameters still name the run (`run_id`, `rollouts`, `failed_run`), so `tokcap status` and
the UI can tell an operator when it will start. It carries `waited_on`, the claim as it was
last renewed, so it defers no further: a claim renewed or replaced since belongs to a live
pass (the file is left to it), and one merely not lapsed yet (clock skew) is waited out in
the run, for the few seconds left.
"""

from __future__ import annotations

import datetime
from typing import Any

from prefect import State, get_run_logger, runtime
from prefect.deployments import run_deployment
from prefect.states import Completed, Failed

from capture_core.operator.run_verdict import NEEDS_ATTENTION
from capture_core.run.inbox import HeldClaim, held_claim
from capture_core.storage import open_byte_store
from tokcap.tasks.common import tokcap_task

SKEW_SECONDS = 2.0  # start this long after the lapse, for clocks a little apart


@tokcap_task("find-claim", "find who holds the claim on run {run_id}")
def find_held_claim(
    dest: str, run_id: str, storage_options: dict[str, Any] | None = None
) -> HeldClaim | None:
    """The live claim on the run's file, or `None` when nothing holds it."""
    store = open_byte_store(dest, storage_options)
    try:
        return held_claim(store, run_id)
    finally:
        store.close()


def claim_plan(held: HeldClaim | None, waited_on: str | None) -> str:
    """What a retrigger does about the file's claim: `run` (nothing holds it, or a live pass
    renewed it since `waited_on`: the claim decides), `outwait` (the claim seen then has not
    lapsed yet: wait the rest in the run) or `defer` (schedule the retrigger at its lapse)."""
    if held is None:
        return "run"
    if waited_on is None:
        return "defer"
    return "outwait" if waited_on == held.key else "run"


def lapse_time(held: HeldClaim) -> datetime.datetime | None:
    """When the retrigger may take the file: the claim's lapse plus the skew allowance, or
    `None` for a claim that never lapses (an infinite or NaN lease, or one past any date a
    clock can name), which no waiting can outlast."""
    try:
        return datetime.datetime.fromtimestamp(held.lapses_at + SKEW_SECONDS, datetime.UTC)
    except (OverflowError, ValueError, OSError):
        return None


def never_lapses(run_id: str, held: HeldClaim) -> State:
    """The retrigger ends `NeedsAttention` at once, its state naming the claim and what to
    do: waiting for this claim would never end."""
    message = (
        f"run {run_id}: its file is still claimed by {held.owner} (attempt {held.number + 1}) "
        f"with a claim that never lapses (it lapses at {held.lapses_at!r} s), so no "
        "retrigger can take the file over. It was made with a claim_lease_seconds tokcap no "
        "longer accepts: deploy the inbox again with a finite TOKCAP_CLAIM_LEASE_SECONDS, "
        f"make sure its pass is dead, end the claim by creating {held.end_key or 'its end marker'} "
        "under the run's destination (what a pass writes when it releases its claim), then "
        "run tokcap retrigger"
    )
    return Failed(name=NEEDS_ATTENTION, message=message)


def defer_retrigger(run_id: str, held: HeldClaim) -> State | None:
    """Schedule this retrigger again at the claim's lapse and end it, or `None` when it was
    not started from a deployment (a person's own process may wait: it holds no worker) or
    the server refused the scheduled run (the caller then waits, as before).

    Retriggers of one run that saw the same claim share one scheduled run (the idempotency
    key), so they never race. The scheduled run keeps this run's `retrigger` count: it is
    the same retrigger, later, and `max_retriggers` still bounds the chain.
    """
    at = lapse_time(held)
    if at is None:
        return never_lapses(run_id, held)
    deployment = runtime.deployment.id
    if not deployment:
        return None
    parameters = {**runtime.flow_run.parameters, "waited_on": held.key}
    try:
        scheduled = run_deployment(
            deployment,
            parameters=parameters,
            scheduled_time=at,
            timeout=0,
            as_subflow=False,
            idempotency_key=f"retrigger-{run_id}-{held.key}",
        )
    except Exception as exc:  # e.g. a deployment made before `waited_on` existed
        get_run_logger().warning(
            "run %s: could not schedule the retrigger at the claim's lapse (%s); waiting for "
            "it here instead. Deploy retrigger-failed again to free the worker",
            run_id,
            exc,
        )
        return None
    message = (
        f"run {run_id}: its file is still claimed by {held.owner} (attempt {held.number + 1}), "
        f"which renews it no more; the claim lapses at {at:%H:%M:%S} UTC. The retrigger is "
        f"scheduled then (flow run {scheduled.id}) and holds no worker until it starts"
    )
    get_run_logger().info("%s", message)
    return Completed(message=message)
