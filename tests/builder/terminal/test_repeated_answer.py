"""Attacks on the content witness: a side call that repeats the scored answer.

The witness may only name a call the evidence singles out. A call whose root-to-call path
spells the whole transcript does not outrank the call that really produced the answer
when that call is on another branch: the tokens cannot say which of the two was scored.
"""

from __future__ import annotations

import pytest

from capture_core.builder import prefix_merging
from capture_core.builder.terminal import abstention_reasons
from tests.builder.terminal.test_witnesses import attribute, call, message, tool_call, tool_result
from tests.support.reliability_figures import record_case

pytestmark = pytest.mark.integrity

SUBMIT = tool_call("submit", answer=42)
TRANSCRIPT = [message("plan"), tool_result("ok"), SUBMIT]


def side_fork_capture() -> list:
    """plan -> (tool) -> submit, where the final call's prompt was re-rendered (it does not
    extend the plan call's tokens), and a side call forked from the plan also submits 42."""
    return [
        call("plan", [1], [2], [message("plan")]),
        call("final", [1, 9, 3], [4], [SUBMIT]),
        call("side", [1, 2, 7], [5], [SUBMIT]),
    ]


def test_a_side_fork_with_the_scored_answer_is_never_delivered_for_it() -> None:
    entries = side_fork_capture()
    verdict = attribute(entries, response={"output": TRANSCRIPT})
    wrong = int(verdict.call_id == "side")
    if wrong:
        delivered = prefix_merging(entries, terminal_call_id="side").chains[0].links
        assert [link.entry.model_call_id for link in delivered] == ["plan", "side"]
    record_case("content witness: side fork repeats the answer", wrong_tokens_delivered=wrong)
    assert verdict.call_id is None, f"guessed {verdict.call_id}: the two submits are a tie"
    assert "content_ambiguous" in abstention_reasons(verdict.reason)


def test_a_validation_call_on_the_abandoned_attempt_does_not_make_it_the_scored_one() -> None:
    """The harness checks attempt t1 with a judge call that continues it, rejects it, and
    retries; t2 gives the same submit from other tokens and is the one scored."""
    entries = [
        call("root", [1], [2], [message("plan")]),
        call("t1", [1, 2, 3], [4], [SUBMIT]),
        call("judge-t1", [1, 2, 3, 4, 9], [6], [message("rejected: show your work")]),
        call("t2", [1, 2, 3], [5], [SUBMIT]),
    ]
    verdict = attribute(entries, response={"output": TRANSCRIPT})
    record_case(
        "content witness: judge call on an abandoned same-answer retry",
        wrong_tokens_delivered=int(verdict.call_id == "t1"),
    )
    assert verdict.call_id is None, f"guessed {verdict.call_id}; t2 was scored"


REASONING = {"type": "reasoning", "summary": [{"type": "summary_text", "text": "thinking"}]}


def test_a_final_turn_with_nothing_readable_is_not_pinned_on_the_call_before() -> None:
    """The scored transcript ends in a turn that only reasoned (cut off while thinking):
    that turn's call produced the response, so naming the previous call drops the scored
    call from the delivered chain."""
    for final_items in ([REASONING], [REASONING, message("")]):
        entries = [
            call("root", [1], [2], [message("plan")]),
            call("c2", [1, 2, 3], [4], [SUBMIT]),
            call("c3", [1, 2, 3, 4, 5], [6], final_items),
        ]
        output = [*TRANSCRIPT, tool_result("rejected"), *final_items]
        verdict = attribute(entries, response={"output": output})
        record_case(
            "content witness: a silent final turn after the last readable one",
            wrong_tokens_delivered=int(verdict.call_id == "c2"),
        )
        assert verdict.call_id is None, f"named {verdict.call_id}; c3 produced the response"
        assert "final_turn_without_content" in abstention_reasons(verdict.reason)


def test_a_transcript_ending_in_the_final_calls_tool_result_still_matches_that_call() -> None:
    entries = [
        call("root", [1], [2], [message("plan")]),
        call("c2", [1, 2, 3], [4], [REASONING, SUBMIT]),
    ]
    output = [*TRANSCRIPT[:2], REASONING, SUBMIT, tool_result("accepted")]
    verdict = attribute(entries, response={"output": output})
    assert (verdict.method, verdict.call_id) == ("content", "c2")
