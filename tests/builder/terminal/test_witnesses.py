"""Terminal attribution: each witness, each abstention reason, the verdict, collapsing."""

from __future__ import annotations

import json
from typing import Any

import pytest

from capture_core.builder.call_content import ContentReader, entry_fingerprint
from capture_core.builder.terminal import TerminalInputs, abstention_reasons, blocking_reason
from capture_core.builder.terminal_witnesses import attribute_terminal
from capture_core.builder.transcript import transcript_readings
from capture_core.records import TokenEntry, token_entry_from_response
from tests.support.token_calls import token_call


def message(text: str, role: str = "assistant") -> dict[str, Any]:
    return {"type": "message", "role": role, "content": [{"type": "output_text", "text": text}]}


def tool_call(name: str, **args: Any) -> dict[str, Any]:
    return {"type": "function_call", "name": name, "arguments": json.dumps(args)}


def tool_result(text: str) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": "x", "output": text}


def call(
    cid: str,
    prompt: list[int],
    gen: list[int],
    items: list[dict[str, Any]] | None = None,
    response_id: str | None = None,
) -> TokenEntry:
    return token_call(
        cid, prompt, gen, log_prob=-0.1, output_items=items or [], response_id=response_id
    )


def chain() -> list[TokenEntry]:
    """A two-turn chain (a tool call, then an answer) and an auxiliary title call."""
    return [
        call("a", [1, 2], [3], [tool_call("search", q="x", n=1)], "resp_a"),
        call("b", [1, 2, 3, 4], [5], [message("the answer")], "resp_b"),
        call("aux", [9], [8], [message("a title")], "resp_aux"),
    ]


def attribute(entries: list[TokenEntry], **inputs: Any):
    return attribute_terminal(entries, TerminalInputs(**inputs))


def test_explicit_witness_names_a_captured_call_or_stops_and_masks() -> None:
    verdict = attribute(chain(), explicit_call_id="b")
    assert (verdict.method, verdict.call_id, verdict.must_mask) == ("explicit", "b", False)
    missing = attribute(chain(), explicit_call_id="gone", response={"id": "resp_b"})
    assert missing.call_id is None and missing.must_mask, "never falls back to another witness"
    assert abstention_reasons(missing.reason) == ["explicit_terminal_not_captured"]
    assert blocking_reason(missing.metrics()) is not None


def test_declared_witness_attributes_and_its_failures_stop_and_mask() -> None:
    verdict = attribute(chain(), declared_response_id="resp_b")
    assert (verdict.method, verdict.call_id) == ("declared", "b")
    missing = attribute(chain(), declared_response_id="resp_zz", explicit_call_id="b")
    assert missing.call_id is None and missing.must_mask, "never falls back to another witness"
    assert abstention_reasons(missing.reason) == ["declared_terminal_not_captured"]
    assert blocking_reason(missing.metrics()) is not None
    twins = [call("x1", [1], [2], response_id="dup"), call("x2", [1], [3], response_id="dup")]
    ambiguous = attribute(twins, declared_response_id="dup")
    assert ambiguous.call_id is None and ambiguous.must_mask
    assert abstention_reasons(ambiguous.reason) == ["declared_ambiguous"]


def test_response_id_witness_and_its_three_abstentions() -> None:
    verdict = attribute(chain(), response={"id": "resp_b", "output": []})
    assert (verdict.method, verdict.call_id) == ("response_id", "b")
    assert "content:no_content_match" in verdict.reason, "the trail is kept on success"
    no_id = attribute(chain(), response={"output": []})
    assert "response_id:response_has_no_id" in no_id.reason and no_id.call_id is None
    no_match = attribute(chain(), response={"id": "resp_minted", "output": []})
    assert "response_id:response_id_no_match" in no_match.reason
    twins = [call("x1", [1], [2], response_id="dup"), call("x2", [1], [3], response_id="dup")]
    ambiguous = attribute(twins, response={"id": "dup", "output": []})
    assert ambiguous.call_id is None and not ambiguous.must_mask
    assert "response_id_ambiguous" in abstention_reasons(ambiguous.reason)


def test_content_witness_reads_the_final_turn_and_the_trailing_block() -> None:
    final_only = attribute(chain(), response={"output": [message("the answer")]})
    assert (final_only.method, final_only.call_id) == ("content", "b")
    merged = [
        message("task", role="user"),
        {"type": "function_call", "name": "search", "arguments": '{"n": 1,  "q": "x"}'},
        tool_result("found"),
        {"type": "reasoning", "summary": []},
        message("the answer"),
    ]
    assert attribute(chain(), response={"output": merged}).call_id == "b"
    chat = {"choices": [{"message": {"role": "assistant", "content": "the answer"}}]}
    assert attribute(chain(), response=chat).call_id == "b", "chat dialect compares the same"
    first_turn = [message("task", role="user"), tool_call("search", n=1, q="x")]
    assert attribute(chain(), response={"output": first_turn}).call_id == "a"


def test_tool_results_after_the_last_model_turn_are_skipped_by_the_trailing_block() -> None:
    """A harness that ran the final call's tool (a submit) keeps its output at the end.

    Reading that as "no trailing block" masked every such merged transcript.
    """
    submitted = [message("task", role="user"), tool_call("search", q="x", n=1), tool_result("..")]
    full, trailing = transcript_readings(submitted)
    assert trailing == full and len(full) == 1
    chat_tool_turn = {"role": "tool", "content": "ok"}
    assert transcript_readings([*submitted[:2], chat_tool_turn])[1] == trailing
    assert transcript_readings([*submitted, message("more", role="user")])[1] == ()
    later = transcript_readings([*submitted, {"type": "reasoning"}, message("the answer")])
    assert later[1] == (("text", "the answer"),), "a model turn after the results starts over"
    two_turns = [*submitted, message("the answer"), tool_result("done")]
    verdict = attribute(chain(), response={"output": two_turns})
    assert (verdict.method, verdict.call_id) == ("content", "b")
    unknown = attribute(chain(), response={"output": [*submitted, tool_call("search", q="y")]})
    assert unknown.call_id is None and abstention_reasons(unknown.reason) == [
        "response_has_no_id",
        "no_content_match",
    ]


def test_content_abstains_on_no_match_and_on_two_different_matches() -> None:
    changed = attribute(chain(), response={"output": [message("the answer, edited")]})
    assert "content:no_content_match" in changed.reason and changed.call_id is None
    depths = [
        call("d1", [1], [2], [message("Done.")]),
        call("d2", [1, 2, 3], [4], [message("Done.")]),
    ]
    twice = attribute(depths, response={"output": [message("Done.")]})
    assert twice.call_id is None and "content:content_ambiguous" in twice.reason


def test_identical_sequences_collapse_to_the_smallest_call_id() -> None:
    retries = [
        call("z9", [1, 2], [3], [message("same")], "resp_1"),
        call("k2", [1, 2], [3], [message("same")], "resp_2"),
    ]
    by_content = attribute(retries, response={"output": [message("same")]})
    assert (by_content.method, by_content.call_id) == ("content", "k2")
    corroborated = attribute(retries, response={"id": "resp_1", "output": [message("same")]})
    assert corroborated.call_id == "k2" and "corroborated_by=content" in corroborated.reason
    retries[1].generation_token_ids = [4]
    different = attribute(retries, response={"output": [message("same")]})
    assert different.call_id is None and "content_ambiguous" in different.reason


def test_disagreeing_witnesses_attribute_nothing_and_mask() -> None:
    verdict = attribute(
        chain(), explicit_call_id="a", response={"id": "resp_b", "output": [message("the answer")]}
    )
    assert verdict.call_id is None and verdict.must_mask
    assert "witness_disagreement[explicit=a;response_id=b;content=b]" in verdict.reason
    assert abstention_reasons(verdict.reason) == ["witness_disagreement"]
    assert blocking_reason(verdict.metrics()).startswith("terminal not attributable")


def test_agreeing_witnesses_report_the_first_and_the_corroboration() -> None:
    verdict = attribute(
        chain(),
        explicit_call_id="b",
        declared_response_id="resp_b",
        response={"id": "resp_b", "output": [message("the answer")]},
    )
    assert (verdict.method, verdict.call_id) == ("explicit", "b")
    assert verdict.reason == "corroborated_by=declared,response_id,content"
    assert verdict.metrics("delivered") == {
        "method": "explicit",
        "call_id": "b",
        "reason": verdict.reason,
        "chain": "delivered",
    }


def test_attribution_never_raises_an_internal_error_is_an_abstention() -> None:
    malformed = {"output": [{"type": "message", "role": "assistant", "tool_calls": 5}]}
    verdict = attribute(chain(), response=malformed)
    assert verdict.call_id is None and not verdict.must_mask
    assert abstention_reasons(verdict.reason) == [
        "response_has_no_id",
        "attribution_error[TypeError]",
    ], "only the witness that read the malformed item abstains for it"
    declared = attribute(chain(), declared_response_id="resp_b", response=malformed)
    assert (declared.method, declared.call_id) == ("declared", "b")
    unreadable = [*chain(), object()]
    broken = attribute_terminal(unreadable, TerminalInputs(None, "resp_b"))  # type: ignore[list-item]
    assert broken.call_id is None and broken.must_mask, "a declaration never checked masks"
    assert abstention_reasons(broken.reason) == ["attribution_error[AttributeError]"]


def test_a_reader_reads_each_object_once_and_a_malformed_response_each_time() -> None:
    reader, calls = ContentReader(), chain()
    own = reader.own(calls[1])
    assert own == entry_fingerprint(calls[1]) and reader.own(calls[1]) is own
    assert reader.own(chain()[1]) == own, "an equal call read anew gives the same keys"
    response = {"output": [tool_call("search", q="x", n=1), message("the answer")]}
    items = reader.items(response)
    assert reader.items(response) is items and len(items) == 2
    assert reader.readings(response) == transcript_readings(items)
    assert reader.readings({"output": [message("other")]}) != transcript_readings(items)
    shared = attribute_terminal(calls, TerminalInputs(response=response), reader)
    assert (shared.method, shared.call_id) == ("content", "b")
    assert shared == attribute_terminal(calls, TerminalInputs(response=response))
    malformed = {"output": [{"type": "message", "role": "assistant", "tool_calls": 5}]}
    for _ in range(2):
        with pytest.raises(TypeError):
            reader.readings(malformed)


def test_a_silent_final_turn_is_told_before_an_unreadable_earlier_item() -> None:
    response = {
        "output": [
            {"type": "message", "role": "assistant", "tool_calls": 5},
            {"type": "message", "role": "user", "content": "u"},
            {"type": "reasoning"},
        ]
    }
    verdict = attribute(chain(), response=response)
    assert abstention_reasons(verdict.reason) == [
        "response_has_no_id",
        "final_turn_without_content",
    ]


def test_inputs_come_from_the_record_and_ignore_wrong_types() -> None:
    record = {
        "_ng_terminal_model_call_id": "b",
        "terminal_response_id": 7,
        "response": {"id": "resp_b"},
    }
    inputs = TerminalInputs.from_record(record)
    assert inputs == TerminalInputs("b", None, {"id": "resp_b"})
    assert TerminalInputs.from_record(None) == TerminalInputs()
    assert attribute_terminal(chain(), None).reason == ""


def test_capture_helper_records_the_served_response_id() -> None:
    served = {
        "id": "chatcmpl-42",
        "choices": [
            {
                "message": {
                    "role": "assistant",
                    "content": "hi",
                    "prompt_token_ids": [1],
                    "generation_token_ids": [2],
                    "generation_log_probs": [-0.2],
                }
            }
        ],
    }
    entry = token_entry_from_response("r", "c1", served)
    assert entry is not None and entry.response_id == "chatcmpl-42"
    assert TokenEntry.model_validate_json(entry.model_dump_json()).response_id == "chatcmpl-42"
    served["id"] = ""
    assert token_entry_from_response("r", "c1", served).response_id is None


def test_a_served_id_of_another_type_testifies_to_nothing_and_never_fails_a_record() -> None:
    """A writer that stored a number (or an empty id) still yields a buildable record."""
    fields = {
        "rollout_id": "r",
        "model_call_id": "c1",
        "prompt_token_ids": [1],
        "generation_token_ids": [2],
        "generation_log_probs": [-0.2],
    }
    for served in (12345, "", {"id": "x"}, ["x"]):
        assert TokenEntry.model_validate({**fields, "response_id": served}).response_id is None
    assert TokenEntry.model_validate({**fields, "response_id": "resp_1"}).response_id == "resp_1"
