"""The automation's retrigger chain ends: the `max_retriggers`-th retrigger that still fails
ends as `NeedsAttention` (a Failed state the automation does not expect), with its reason;
earlier ones fail as `Failed`, which the automation retriggers. A run whose settings cannot
be recovered is never retriggered with other ones: it ends `NeedsAttention` at once. The
automation itself, on a real server and workers, is tests/flows/test_events.py."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from tokcap.flows.finalize import finalize_run
from tokcap.flows.retrigger import NEEDS_ATTENTION, retrigger_failed

pytestmark = pytest.mark.usefixtures("prefect_api")


def locations(tmp_path: Path) -> tuple[str, str]:
    for folder in ("store", "dest"):
        (tmp_path / folder).mkdir(exist_ok=True)
    return str(tmp_path / "dest"), str(tmp_path / "store")


def retrigger(tmp_path: Path, failed_run: str | None, number: int):
    dest, store = locations(tmp_path)
    return retrigger_failed(
        dest,
        "never-started",
        store,
        failed_run=failed_run,
        retrigger=number,
        max_retriggers=2,
        return_state=True,
    )


def test_the_last_retrigger_that_fails_is_left_for_a_person_with_its_reason(tmp_path) -> None:
    dest, store = locations(tmp_path)
    missing = str(tmp_path / "missing.jsonl")
    first = finalize_run(missing, store, dest, "never-started", return_state=True)
    assert first.is_failed()
    failed_run = str(first.state_details.flow_run_id)
    earlier = retrigger(tmp_path, failed_run, 1)
    assert earlier.is_failed() and earlier.name == "Failed", "the automation retriggers it"
    last = retrigger(tmp_path, str(earlier.state_details.flow_run_id), 2)
    assert last.is_failed() and last.name == NEEDS_ATTENTION
    assert "missing.jsonl" in last.message and "after 2 automatic retriggers" in last.message


@pytest.mark.parametrize("failed_run", [None, str(uuid.uuid4())], ids=["manifest", "flow-run"])
def test_a_run_whose_settings_are_unknown_is_left_for_a_person_at_once(
    tmp_path, failed_run: str | None
) -> None:
    """No manifest (and no flow run named), or a flow run the server does not know: the
    retrigger finalizes nothing, rather than with default settings."""
    state = retrigger(tmp_path, failed_run, 1)
    assert state.is_failed() and state.name == NEEDS_ATTENTION, state
    assert "never-started" in state.message and "settings it ran with are unknown" in state.message
    assert not any((tmp_path / "dest").iterdir()), "nothing was finalized"


@pytest.mark.integrity
@pytest.mark.parametrize(
    ("run_id", "number"),
    [("never-started", 3), (20240601, 3), ("never-started", "3"), ("never-started", "x")],
    ids=["past-the-limit", "bad-parameter", "count-as-text", "no-count"],
)
def test_a_chain_past_its_limit_ends_before_anything_runs(tmp_path, run_id, number) -> None:
    """A retrigger that failed or crashed before it could count itself (Prefect refused its
    parameters, its worker was killed) never makes the chain endless: the next one past
    `max_retriggers` ends `NeedsAttention` at once, whatever its parameters."""
    from tests.support.reliability_figures import record_case

    dest, store = locations(tmp_path)
    state = retrigger_failed(
        dest, run_id, store, retrigger=number, max_retriggers=2, return_state=True
    )
    assert state.is_failed() and state.name == NEEDS_ATTENTION, state
    assert "past max_retriggers" in state.message
    assert not any((tmp_path / "dest").iterdir()), "nothing was finalized"
    record_case("a retrigger chain that cannot count itself still ends")


def test_a_retrigger_within_the_limit_takes_a_text_count(tmp_path) -> None:
    """The count may come as the rendered template's text; within the limit it re-runs."""
    state = retrigger(tmp_path, None, "1")  # type: ignore[arg-type]
    assert state.is_failed() and state.name == NEEDS_ATTENTION, state
    assert "settings it ran with are unknown" in state.message


@pytest.mark.integrity
@pytest.mark.parametrize("limit", [0, -1, "0"], ids=["zero", "negative", "zero-as-text"])
def test_a_limit_below_one_means_no_automatic_retrigger(tmp_path, limit) -> None:
    """`max_retriggers` below 1 never lets the automation retrigger a run forever: its first
    retrigger ends `NeedsAttention` at once, naming the limit, and runs nothing."""
    from tests.support.reliability_figures import record_case

    dest, store = locations(tmp_path)
    missing = str(tmp_path / "missing.jsonl")
    first = finalize_run(missing, store, dest, "never-started", return_state=True)
    assert first.is_failed()
    state = retrigger_failed(
        dest,
        "never-started",
        store,
        failed_run=str(first.state_details.flow_run_id),
        retrigger=1,
        max_retriggers=limit,
        return_state=True,
    )
    assert state.is_failed() and state.name == NEEDS_ATTENTION, state
    assert "max_retriggers" in state.message and "no automatic retrigger" in state.message
    assert not any((tmp_path / "dest").iterdir()), "nothing was finalized"
    record_case("a retrigger limit below 1 means no automatic retrigger")


@pytest.mark.integrity
def test_a_retrigger_by_hand_with_a_limit_below_one_is_left_for_a_person(tmp_path) -> None:
    """A person's retrigger (count 0) still runs with a limit below 1, and when it fails it
    ends `NeedsAttention`, never the plain `Failed` the automation would retrigger."""
    dest, store = locations(tmp_path)
    missing = str(tmp_path / "missing.jsonl")
    first = finalize_run(missing, store, dest, "never-started", return_state=True)
    state = retrigger_failed(
        dest,
        "never-started",
        store,
        failed_run=str(first.state_details.flow_run_id),
        retrigger=0,
        max_retriggers=0,
        return_state=True,
    )
    assert state.is_failed() and state.name == NEEDS_ATTENTION, state
    assert "missing.jsonl" in state.message, "it ran, and says why it failed"


@pytest.mark.integrity
@pytest.mark.parametrize(
    ("given", "rendered"),
    [(1, 2), ("2", 3), ("x", None), (None, None)],
    ids=["number", "text", "not-a-number", "none"],
)
def test_the_shipped_trigger_counts_a_retrigger_started_by_hand(tmp_path, given, rendered) -> None:
    """The automation's count of a retrigger that failed after a person started it with a
    count as text is that count plus one; a count that is no number renders past any limit,
    so the next retrigger ends `NeedsAttention` at once rather than restarting the chain."""
    from tests.support.prefect_api_reads import flow_run
    from tests.support.shipped_triggers import triggered_parameters

    dest, store = locations(tmp_path)
    by_hand = retrigger_failed(
        dest, "never-started", store, retrigger=given, max_retriggers=3, return_state=True
    )
    assert by_hand.is_failed()
    env = {"TOKCAP_INBOX": str(tmp_path / "inbox"), "TOKCAP_STORE": store, "TOKCAP_DEST": dest}
    failed = flow_run(by_hand.state_details.flow_run_id)
    parameters = triggered_parameters("retrigger-failed", failed, env)
    if rendered is not None:
        assert parameters["retrigger"] == rendered
        return
    assert parameters["retrigger"] > 3, parameters["retrigger"]
    state = retrigger_failed(**parameters, return_state=True)
    assert state.is_failed() and state.name == NEEDS_ATTENTION, state
    assert "past max_retriggers" in state.message
