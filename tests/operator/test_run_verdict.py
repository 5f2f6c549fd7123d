"""The state word, exit code and call to act for every combination of a run's destination
and its flow runs (`capture_core.operator.run_verdict.decide`, no Prefect)."""

from __future__ import annotations

import pytest

from capture_core.operator.run_verdict import (
    EXIT_CODES,
    SILENCE_SECONDS,
    FlowFacts,
    FlowRunFact,
    decide,
)

NOW = 1_000_000.0
STATES = {
    "queued",
    "running",
    "retrigger-scheduled",
    "retriggering",
    "needs-attention",
    "interrupted",
    "failed",
    "complete",
}


def flow_run(
    kind: str, flow: str = "finalize-inbox-file", name: str = "", **more: object
) -> FlowRunFact:
    return FlowRunFact(
        id=f"id-{kind}-{flow}",
        name=name or f"{flow} run",
        flow=flow,
        state_type=kind,
        state_name=more.pop("state_name", kind.title()),  # type: ignore[arg-type]
        **more,  # type: ignore[arg-type]
    )


def api(*runs: FlowRunFact, announced: bool = False) -> FlowFacts:
    return FlowFacts(reachable=True, runs=list(runs), announced=announced)


DOWN = FlowFacts(reachable=False, why_not="the Prefect API at http://x/api did not answer")
LIVE = flow_run("RUNNING", last_sign=NOW - 5)
SILENT = flow_run("RUNNING", last_sign=NOW - SILENCE_SECONDS - 1)
RETRIGGER_WAITING = flow_run("SCHEDULED", "retrigger-failed", expected_start=NOW + 40)
RETRIGGER_LIVE = flow_run("RUNNING", "retrigger-failed", last_sign=NOW - 1)
CRASHED = flow_run("CRASHED", updated=NOW - 100)
ATTENTION = flow_run(
    "FAILED", "retrigger-failed", state_name="NeedsAttention", message="why", updated=NOW - 10
)
DEPLOYMENT_WAITING = flow_run("SCHEDULED", expected_start=NOW - 1)

CASES = [
    # destination, API facts, state, a person must act
    ("ok", None, "complete", False),
    ("ok", api(LIVE), "complete", False),
    ("ok", DOWN, "complete", False),
    ("failed", None, "failed", True),
    ("failed", api(CRASHED), "failed", True),
    ("failed", api(CRASHED, RETRIGGER_WAITING), "retrigger-scheduled", False),
    ("failed", api(CRASHED, RETRIGGER_LIVE), "retriggering", False),
    ("failed", api(CRASHED, ATTENTION), "needs-attention", True),
    ("started", api(LIVE), "running", False),
    ("started", api(SILENT), "interrupted", True),
    ("started", api(SILENT, RETRIGGER_WAITING), "retrigger-scheduled", False),
    ("started", api(CRASHED, RETRIGGER_WAITING), "retrigger-scheduled", False),
    ("started", api(CRASHED, RETRIGGER_LIVE), "retriggering", False),
    ("started", api(CRASHED, ATTENTION), "needs-attention", True),
    ("started", api(CRASHED), "interrupted", True),
    ("started", api(), "interrupted", True),
    ("started", None, "interrupted", True),
    ("started", DOWN, "interrupted", True),
    ("placed", None, "queued", False),
    ("placed", DOWN, "queued", False),
    ("placed", api(), "queued", False),
    ("absent", api(announced=True), "queued", False),
    ("absent", api(DEPLOYMENT_WAITING), "queued", False),
    ("absent", api(LIVE), "running", False),
    ("absent", api(CRASHED), "interrupted", True),
]


@pytest.mark.parametrize(("dest", "facts", "state", "act"), CASES)
def test_each_combination_has_one_state_and_exit_code(
    dest: str, facts: FlowFacts | None, state: str, act: bool
) -> None:
    verdict = decide(dest, facts, now=NOW)  # type: ignore[arg-type]
    assert verdict is not None
    assert (verdict.state, verdict.act) == (state, act), verdict.reason
    assert verdict.exit_code == {"complete": 0}.get(state, 1 if act else 3)


def test_every_state_is_reached_and_has_its_exit_code() -> None:
    reached = {state for _dest, _facts, state, _act in CASES}
    assert reached == STATES == set(EXIT_CODES)
    assert {s for s, code in EXIT_CODES.items() if code == 3} == {
        "queued",
        "running",
        "retrigger-scheduled",
        "retriggering",
    }


def test_a_run_nothing_knows_is_unknown() -> None:
    for facts in (None, DOWN, api()):
        assert decide("absent", facts, now=NOW) is None


def test_the_reasons_say_what_an_operator_needs() -> None:
    running = decide("started", api(LIVE), now=NOW)
    assert running is not None and "last heartbeat 5 s ago" in running.reason
    waiting = decide("started", api(CRASHED, RETRIGGER_WAITING), now=NOW)
    assert waiting is not None and "(in 40 s)" in waiting.reason
    blind = decide("started", DOWN, now=NOW)
    assert blind is not None and "could not tell whether it is live" in blind.reason
    assert "http://x/api" in blind.reason
    unset = decide("started", None, now=NOW)
    assert unset is not None and "no PREFECT_API_URL is set" in unset.reason
    silent = decide("started", api(SILENT), now=NOW)
    assert silent is not None and "sent no heartbeat" in silent.reason
    attention = decide("failed", api(CRASHED, ATTENTION), now=NOW)
    assert attention is not None and attention.reason.endswith("NeedsAttention: why")


def test_its_flow_names_are_tokcaps() -> None:
    from capture_core.operator import run_verdict
    from tokcap.flows.retrigger import NEEDS_ATTENTION
    from tokcap.tasks.flow_runs import RETRIGGER_FLOW

    assert (run_verdict.RETRIGGER_FLOW, run_verdict.NEEDS_ATTENTION) == (
        RETRIGGER_FLOW,
        NEEDS_ATTENTION,
    )
