"""Without a Prefect server: a retrigger says a run cannot complete until its input changes
only when its malformed lines are all that is left; a run with good rollouts still not handed
off (or not retired) fails as any other, so the automation's chain goes on."""

from __future__ import annotations

import pytest

from capture_core.operator.run_progress import RetriggerReport
from capture_core.operator.run_report import only_malformed_left
from capture_core.run.run_layout import LedgerLine
from tokcap.flows.retrigger import input_to_change


def line(n: int, **fields: object) -> LedgerLine:
    base = {"rollout_id": f"r{n}", "line": n, "finalized": True, "handed_off": True}
    return LedgerLine.model_validate({"masked": False, **base, **fields})


MALFORMED = line(3, rollout_id=None, finalized=False, handed_off=False, error="not JSON")
REPORT = RetriggerReport(run_id="run", still_failing=["r2", "line 3"])


@pytest.mark.integrity
def test_good_rollouts_not_handed_off_leave_the_chain_going() -> None:
    """An S3 outage left r2 not handed off: a later retrigger can still hand it off."""
    ledger = [line(1, retired=True), line(2, handed_off=False, error="upload failed"), MALFORMED]
    assert only_malformed_left(ledger) == []
    assert input_to_change("run", "/in/file.jsonl", ledger, REPORT) is None


@pytest.mark.integrity
def test_a_failed_retirement_leaves_the_chain_going() -> None:
    ledger = [line(1, error="retire failed: store unreachable"), MALFORMED]
    assert only_malformed_left(ledger) == []
    assert input_to_change("run", "/in/file.jsonl", ledger, REPORT) is None


def test_only_malformed_lines_left_means_the_input_must_change() -> None:
    ledger = [line(1, retired=True), line(2, retired=True), MALFORMED]
    assert only_malformed_left(ledger) == [MALFORMED]
    said = input_to_change("run", "/in/file.jsonl", ledger, REPORT)
    assert said is not None and "cannot complete until its input changes" in said
    assert "/in/file.jsonl has 1 malformed line(s) (line 3: not JSON)" in said, said
    assert "the other lines of run run are handed off already" in said, said


def test_a_clean_or_missing_ledger_is_no_input_problem() -> None:
    assert input_to_change("run", None, [], REPORT) is None
    assert input_to_change("run", None, [line(1, retired=True)], REPORT) is None
