"""Building with a terminal call: its path is delivered, off-path calls excluded, breaks mask."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from capture_core.builder import prefix_merging
from capture_core.builder.snapshot import assemble
from capture_core.builder.terminal import (
    NOT_ATTRIBUTED,
    STRICT_CONTRADICTED,
    TerminalInputs,
    blocking_reason,
)
from capture_core.builder.terminal_witnesses import check_strict_chain
from capture_core.consumer import trajectories_from_source
from capture_core.delivery import finalize_rollout_token_capture, mask_reason
from capture_core.operator.run_report import reason_category
from capture_core.records import TokenEntry
from capture_core.store import TokenCaptureStore
from tests.builder.terminal.test_witnesses import message, tool_result
from tests.support.token_calls import deep_rollout, shallow_stack, token_call


def call(cid: str, prompt: list[int], gen: list[int], **extra: Any) -> TokenEntry:
    return token_call(
        cid,
        prompt,
        gen,
        rollout_id="3-4",
        log_prob=-0.3,
        output_items=[message(f"text of {cid}")],
        response_id=f"resp_{cid}",
        **extra,
    )


def path(built) -> list[str]:
    return [link.entry.model_call_id for link in built.chains[0].links]


def agent() -> list[TokenEntry]:
    """root -> mid (retried: mid-x abandoned) -> end (retried: end-x) -> after; plus off-path."""
    return [
        call("title", [50, 51], [52], created_at=-1.0),
        call("root", [1, 2], [3]),
        call("mid-x", [1, 2, 3, 4], [9]),
        call("mid", [1, 2, 3, 4], [5]),
        call("fork", [1, 2, 3, 4, 5, 70], [71]),
        call("end", [1, 2, 3, 4, 5, 6], [7]),
        call("end-x", [1, 2, 3, 4, 5, 6], [8]),
        call("after", [1, 2, 3, 4, 5, 6, 7, 0], [1]),
        call("compacted", [60, 61], [62]),
    ]


def test_the_main_chain_is_the_path_and_every_off_path_kind_is_excluded() -> None:
    built = prefix_merging(agent(), terminal_call_id="end")
    assert path(built) == ["root", "mid", "end"]
    assert built.notes.terminal_chain == "delivered" and built.notes.chains == 1
    assert built.notes.excluded_calls == sorted(
        ["title", "mid-x", "fork", "end-x", "after", "compacted"]
    ), "auxiliary root, abandoned retries, sub-agent fork, later call, other root"
    assert built.notes.unresolved_retries == []
    assert built.notes.delivered_fraction < 1.0


def test_a_final_call_retry_is_resolved_by_the_terminal() -> None:
    entries = [call("p", [1], [2]), call("z1", [1, 2, 3], [4]), call("z2", [1, 2, 3], [5])]
    assert prefix_merging(entries).notes.unresolved_retries == ["z1", "z2"]
    built = prefix_merging(entries, terminal_call_id="z2")
    assert path(built) == ["p", "z2"] and built.notes.excluded_calls == ["z1"]
    result = assemble("3-4", entries, "prefix_merging", "", TerminalInputs("z2")).to_dict()
    assert result["mask_sample"] is False and result["unresolved_retries"] == []
    generated = [i for i in result["rebuilt_response"]["output"] if "generation_token_ids" in i]
    assert generated[-1]["generation_token_ids"] == [5]


def test_identical_parents_collapse_only_with_a_terminal() -> None:
    entries = [call("a2", [1], [2]), call("a1", [1], [2]), call("b", [1, 2, 3], [4])]
    assert "b" in prefix_merging(entries).quarantined, "the strict policy is unchanged"
    built = prefix_merging(entries, terminal_call_id="b")
    assert path(built) == ["a1", "b"] and built.notes.terminal_chain == "delivered"


def test_a_path_through_a_quarantined_call_is_broken_and_masks() -> None:
    lineage = {"parent_resolution": "resolved", "parent_call_id": "lost"}
    entries = [
        call("a", [1], [2]),
        call("b", [1, 2, 3], [4], **lineage),
        call("c", [1, 2, 3, 4, 5], [6]),
    ]
    built = prefix_merging(entries, terminal_call_id="c")
    assert built.notes.terminal_chain == "broken" and built.chains == []
    result = assemble("3-4", entries, "prefix_merging", "", TerminalInputs("c")).to_dict()
    assert result["mask_sample"] is True and result["rebuilt_response"] is None
    assert result["error"].startswith("terminal chain broken: call 'c'")
    assert reason_category(mask_reason(result)) == "terminal chain broken", "grouped in reports"
    assert result["metrics"]["terminal_attribution"]["chain"] == "broken"


def test_an_attributed_terminal_without_generated_tokens_is_not_captured_and_masks() -> None:
    entries = [call("a", [1], [2]), call("empty", [1, 2, 3], [])]
    result = assemble("3-4", entries, "prefix_merging", "", TerminalInputs("empty")).to_dict()
    assert result["mask_sample"] is True
    assert result["metrics"]["terminal_attribution"] == {
        "method": "explicit",
        "call_id": "empty",
        "reason": "",
        "chain": "not_captured",
    }


def test_a_declared_id_that_cannot_be_attributed_masks_a_clean_chain() -> None:
    entries = [call("a", [1], [2]), call("b", [1, 2, 3], [4])]
    strict = assemble("3-4", entries, "prefix_merging", "").to_dict()
    assert strict["mask_sample"] is False
    result = assemble(
        "3-4", entries, "prefix_merging", "", TerminalInputs(None, "resp_nope")
    ).to_dict()
    assert result["mask_sample"] is True
    assert "declared_terminal_not_captured" in mask_reason(result)
    assert reason_category(mask_reason(result)) == "terminal not attributable"


def test_disagreeing_witnesses_mask_a_clean_chain() -> None:
    entries = [call("a", [1], [2]), call("b", [1, 2, 3], [4])]
    inputs = TerminalInputs("a", None, {"id": "resp_b", "output": []})
    result = assemble("3-4", entries, "prefix_merging", "", inputs).to_dict()
    assert result["mask_sample"] is True and "witness_disagreement" in mask_reason(result)


def test_without_attribution_the_strict_policy_still_masks_an_auxiliary_root() -> None:
    result = assemble("3-4", agent(), "prefix_merging", "", TerminalInputs()).to_dict()
    assert result["mask_sample"] is True
    assert result["metrics"]["terminal_attribution"] == {
        "method": "",
        "call_id": None,
        "reason": "",
        "chain": "",
    }


def test_recorded_parents_settle_identical_parents_and_contradictions_quarantine() -> None:
    named = {"parent_resolution": "resolved", "parent_call_id": "a2"}
    entries = [call("a1", [1], [2]), call("a2", [1], [2]), call("b", [1, 2, 3], [4], **named)]
    built = prefix_merging(entries)
    assert path(built) == ["a2", "b"] and built.notes.unresolved_retries == []
    wrong = {"parent_resolution": "resolved", "parent_call_id": "c"}
    conflict = [call("a", [1], [2]), call("c", [7], [8]), call("b", [1, 2, 3], [4], **wrong)]
    assert "b" in prefix_merging(conflict).quarantined, "a parent the tokens deny is refused"
    root_claim = [call("a", [1], [2]), call("b", [1, 2, 3], [4], parent_resolution="root")]
    assert "b" in prefix_merging(root_claim).quarantined
    bad_length = [call("a", [1], [2], cum_len=3), call("b", [1, 2, 3], [4])]
    assert "a" in prefix_merging(bad_length).quarantined
    same_digest = [call("a", [1], [2], digest="d"), call("x", [5], [6], digest="d")]
    assert prefix_merging(same_digest).quarantined == ["a", "x"]
    unresolved = [call("a", [1], [2]), call("b", [1, 2, 3], [4], parent_resolution="unresolved")]
    assert path(prefix_merging(unresolved)) == ["a", "b"], "no decision: tokens decide"


def _capture(store: TokenCaptureStore, entries: list[TokenEntry]) -> None:
    for entry in entries:
        store.put_now(entry)


def _record() -> dict[str, Any]:
    response = {"id": "resp_end", "object": "response", "output": [message("text of end")]}
    return {"_ng_task_index": 3, "_ng_rollout_index": 4, "reward": 0.5, "response": response}


def test_delivery_attributes_from_the_record_and_delivers_the_scored_chain(store_location):
    store = TokenCaptureStore(*store_location)
    _capture(store, agent())
    strict = asyncio.run(trajectories_from_source("3-4", store))
    assert strict["mask_sample"] is True, "several chains and a final retry mask without it"
    result = _record()
    before = copy.deepcopy(result)
    built = asyncio.run(finalize_rollout_token_capture(result, store))
    assert built["mask_sample"] is False and "mask_sample" not in result
    generated = [i for i in result["response"]["output"] if "generation_token_ids" in i]
    assert [i["generation_token_ids"] for i in generated] == [[3], [5], [7]]
    assert result["reward"] == before["reward"] and result["response"]["id"] == "resp_end"
    attribution = result["_ng_token_capture"]["terminal_attribution"]
    assert (attribution["method"], attribution["call_id"]) == ("response_id", "end")
    assert (
        attribution["chain"] == "delivered" and "corroborated_by=content" in attribution["reason"]
    )
    assert result["_ng_token_capture"]["delivered_fraction"] == round(3 / 9, 4)
    by_record = asyncio.run(trajectories_from_source("3-4", store, record=before))
    assert by_record["rebuilt_response"]["output"] == result["response"]["output"]


def test_a_terminal_deep_in_fifteen_hundred_turns_builds_without_recursion() -> None:
    entries = deep_rollout()
    with shallow_stack():
        built = prefix_merging(entries, terminal_call_id="call-01200")
        attributed = assemble(
            "r", entries, "prefix_merging", "", TerminalInputs("call-01200")
        ).to_dict()
    assert len(built.chains[0].links) == 1201 and len(built.notes.excluded_calls) == 299
    assert attributed["mask_sample"] is False


def test_calls_sharing_one_id_link_by_position_not_by_id() -> None:
    """Two calls with one id: a child links to the call whose tokens it extends.

    Looking parents up by id linked `mid` under the later `dup`, which extends `mid` itself:
    a cycle, so the strict build lost two calls and the anchored build never returned.
    """
    calls = [call("dup", [1], [2]), call("mid", [1, 2, 3], [4]), call("dup", [1, 2, 3, 4, 5], [6])]
    strict = prefix_merging(calls)
    assert [[link.entry.prompt_token_ids for link in c.links] for c in strict.chains] == [
        [[1], [1, 2, 3], [1, 2, 3, 4, 5]]
    ]
    anchored = prefix_merging(calls, terminal_call_id="mid")
    assert anchored.notes.terminal_chain == "delivered"
    assert [link.entry.prompt_token_ids for link in anchored.chains[0].links] == [[1], [1, 2, 3]]


def test_a_terminal_id_carried_by_different_calls_is_broken() -> None:
    """Which of two different calls with the terminal's id was scored cannot be known: mask."""
    calls = [call("root", [1], [2]), call("end", [1, 2, 3], [4]), call("end", [1, 2, 3], [5])]
    built = prefix_merging(calls, terminal_call_id="end")
    assert built.notes.terminal_chain == "broken" and built.chains == []


def test_a_transcript_ending_in_the_submit_output_delivers_its_chain_without_the_summary() -> None:
    """The harness ran the final call's submit tool and kept its output; a summary followed.

    The trailing block skips that output, so content names `end`; before, the transcript
    had no trailing block, nothing was attributed, and the rollout masked.
    """
    submit = {"type": "function_call", "name": "submit", "arguments": "{}"}
    entries = [
        call("root", [1, 2], [3]),
        call("end", [1, 2, 3, 4], [5]).model_copy(update={"output_items": [submit]}),
        call("summary", [1, 2, 3, 4, 5, 6], [7]),
    ]
    transcript = [message("text of root"), tool_result("ok"), submit, tool_result("done")]
    inputs = TerminalInputs(response={"id": "", "output": transcript})
    result = assemble("3-4", entries, "prefix_merging", "", inputs).to_dict()
    verdict = result["metrics"]["terminal_attribution"]
    assert (verdict["method"], verdict["call_id"], verdict["chain"]) == (
        "content",
        "end",
        "delivered",
    )
    assert result["mask_sample"] is False
    generated = [i for i in result["rebuilt_response"]["output"] if "generation_token_ids" in i]
    assert [i["generation_token_ids"] for i in generated] == [[3], [5]], "summary excluded"


def test_a_strict_chain_running_past_the_scored_call_masks() -> None:
    """Unattributed, the strict chain is checked against the response before delivery."""
    entries = [
        call("root", [1, 2], [3]),
        call("end", [1, 2, 3, 4], [5]),
        call("summary", [1, 2, 3, 4, 5, 6], [7]),
    ]
    inputs = TerminalInputs(response={"output": [message("text of root"), message("text of end")]})
    checked = check_strict_chain(NOT_ATTRIBUTED, inputs, entries)
    assert checked.must_mask and STRICT_CONTRADICTED in checked.reason
    assert blocking_reason(checked.metrics()) is not None
    assert check_strict_chain(NOT_ATTRIBUTED, inputs, entries[:2]) == NOT_ATTRIBUTED
    unrelated = TerminalInputs(response={"output": [message("a harness's own summary")]})
    assert check_strict_chain(NOT_ATTRIBUTED, unrelated, entries) == NOT_ATTRIBUTED, (
        "a response matching no call of the chain testifies to nothing: the strict policy stands"
    )


def test_a_malformed_scored_response_silences_only_its_own_witnesses() -> None:
    """An unreadable response item must not discard the explicit terminal.

    Discarding it left the strict policy to deliver the chain that runs on into `summary`.
    """
    entries = [
        call("a", [1], [2]),
        call("b", [1, 2, 3], [4]),
        call("summary", [1, 2, 3, 4, 5], [6]),
    ]
    malformed = {"output": [{"type": "message", "role": "assistant", "tool_calls": 5}]}
    result = assemble(
        "3-4", entries, "prefix_merging", "", TerminalInputs("b", None, malformed)
    ).to_dict()
    verdict = result["metrics"]["terminal_attribution"]
    assert verdict["method"] == "explicit" and verdict["call_id"] == "b"
    assert "content:attribution_error[TypeError]" in verdict["reason"]
    generated = [i for i in result["rebuilt_response"]["output"] if "generation_token_ids" in i]
    assert [i["generation_token_ids"] for i in generated] == [[2], [4]]
