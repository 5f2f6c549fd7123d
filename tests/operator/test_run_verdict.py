"""The state word, exit code and call to act for every combination of a run's destination
and its flow runs (`capture_core.operator.run_verdict.decide`, no Prefect)."""

from __future__ import annotations

import pytest

from capture_core.operator.run_verdict import (
    EXIT_CODES,
    LATE_SECONDS,
    MARK_SECONDS,
    SILENCE_SECONDS,
    ClaimFacts,
    DestState,
    FlowFacts,
    FlowRunFact,
    decide,
    judge,
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


# A run of a tokcap-tagged deployment: the shipped automations act on it.
DYING = flow_run("RUNNING", last_sign=NOW - SILENCE_SECONDS - 1, automated=True)
DEAD_LONG = flow_run("RUNNING", last_sign=NOW - SILENCE_SECONDS - MARK_SECONDS - 1, automated=True)
JUST_CRASHED = flow_run("CRASHED", updated=NOW - 10, automated=True)
JUST_FAILED = flow_run("FAILED", "finalize-run", updated=NOW - 10, automated=True)
CLI_JUST_FAILED = flow_run("FAILED", "finalize-run", updated=NOW - 10)
CRASHED_LONG_AGO = flow_run("CRASHED", updated=NOW - MARK_SECONDS - 1, automated=True)
PAUSED = flow_run("PAUSED", state_name="Suspended")
RETRIGGER_DUE = flow_run("SCHEDULED", "retrigger-failed", expected_start=NOW - 30)
RETRIGGER_UNTAKEN = flow_run(
    "SCHEDULED",
    "retrigger-failed",
    state_name="Late",
    expected_start=NOW - LATE_SECONDS - 1,
    pool="tokcap-process",
)
GIVEN_UP = ClaimFacts(attempts=3)
STARTING = ClaimFacts(attempts=1, holder="attempt 1 (worker-a)", renewed_at=NOW - 2)
RENEWED_AFTER_CRASH = ClaimFacts(attempts=1, holder="attempt 1 (worker-a)", renewed_at=NOW - 5)
RENEWED_BEFORE_CRASH = ClaimFacts(attempts=1, holder="attempt 1 (worker-a)", renewed_at=NOW - 200)

FIXED_CASES = [
    # 2: a given-up inbox file (attempts, none live, no manifest) is no longer `queued`
    ("placed", api(), GIVEN_UP, "needs-attention"),
    ("placed", None, GIVEN_UP, "needs-attention"),
    ("placed", DOWN, GIVEN_UP, "needs-attention"),
    ("absent", api(), GIVEN_UP, "needs-attention"),
    ("placed", api(), STARTING, "queued"),
    ("placed", api(), ClaimFacts(), "queued"),
    # an ended attempt with attempts left: the inbox's next pass takes the file
    ("placed", api(), ClaimFacts(attempts=1, max_attempts=3), "queued"),
    ("placed", None, ClaimFacts(attempts=2, max_attempts=3), "queued"),
    ("absent", DOWN, ClaimFacts(attempts=1, max_attempts=3), "queued"),
    ("placed", api(), ClaimFacts(attempts=3, max_attempts=3), "needs-attention"),
    # 3: the shipped automations are about to act on a deployment's run
    ("started", api(DYING), None, "retrigger-scheduled"),
    ("started", api(DEAD_LONG), None, "interrupted"),
    ("started", api(SILENT), None, "interrupted"),
    ("started", api(JUST_CRASHED), None, "retrigger-scheduled"),
    ("failed", api(JUST_FAILED), None, "retrigger-scheduled"),
    ("failed", api(CLI_JUST_FAILED), None, "failed"),
    ("started", api(CRASHED_LONG_AGO), None, "interrupted"),
    # 5: a holder alive although Prefect marked its flow run Crashed
    ("started", api(CRASHED), RENEWED_AFTER_CRASH, "running"),
    ("started", api(CRASHED), RENEWED_BEFORE_CRASH, "interrupted"),
    # 6: nothing will act on a paused run or a retrigger no worker takes
    ("started", api(CRASHED, PAUSED), None, "needs-attention"),
    ("started", api(CRASHED, RETRIGGER_DUE), None, "retrigger-scheduled"),
    ("started", api(CRASHED, RETRIGGER_UNTAKEN), None, "needs-attention"),
]


@pytest.mark.integrity
@pytest.mark.parametrize(("dest", "facts", "claims", "state"), FIXED_CASES)
def test_the_state_matches_what_will_act(
    dest: DestState, facts: FlowFacts | None, claims: ClaimFacts | None, state: str
) -> None:
    verdict = decide(dest, facts, now=NOW, claims=claims)
    assert verdict is not None
    assert verdict.state == state, verdict.reason
    assert verdict.exit_code == EXIT_CODES[state]
    assert verdict.act == (EXIT_CODES[state] == 1)


@pytest.mark.integrity
def test_the_fixed_reasons_say_who_acts_and_what_to_do() -> None:
    given_up = decide("placed", api(), now=NOW, claims=GIVEN_UP)
    assert given_up is not None and "3 inbox attempt(s)" in given_up.reason
    assert "finalize the file as a new run" in given_up.reason
    automation = "the shipped automation retriggers it (expected within a minute)"
    for facts in (api(DYING), api(JUST_CRASHED)):
        soon = decide("started", facts, now=NOW)
        assert soon is not None and soon.reason.endswith(automation), soon
    holder = decide("started", api(CRASHED), now=NOW, claims=RENEWED_AFTER_CRASH)
    assert holder is not None and "attempt 1 (worker-a)" in holder.reason
    untaken = decide("started", api(CRASHED, RETRIGGER_UNTAKEN), now=NOW)
    assert untaken is not None and "prefect worker start --pool tokcap-process" in untaken.reason
    assert "no worker has taken it" in untaken.reason
    paused = decide("started", api(CRASHED, PAUSED), now=NOW)
    assert paused is not None and "resume it" in paused.reason


@pytest.mark.integrity
def test_a_run_that_completes_while_the_api_is_read_is_complete() -> None:
    """The destination is read before the flow runs; a run that wrote its ledger and ended
    in between shows no live flow run: it is complete, not interrupted."""
    reads: list[DestState] = ["started", "ok"]
    verdict = judge(lambda: reads.pop(0), lambda: api(flow_run("COMPLETED")), now=NOW)
    assert verdict is not None and (verdict.state, verdict.exit_code) == ("complete", 0)
    assert reads == []


def test_a_settled_verdict_is_not_read_again() -> None:
    reads: list[DestState] = ["started"]
    verdict = judge(lambda: reads.pop(0), lambda: api(LIVE), now=NOW)
    assert verdict is not None and verdict.state == "running" and reads == []
