"""Integrity of terminal attribution: never a chain other than the scored one, never a hole."""

from __future__ import annotations

import asyncio
import copy
import uuid

import pytest

from capture_core.builder.snapshot import assemble
from capture_core.builder.terminal import TerminalInputs
from capture_core.consumer import trajectories_from_source
from capture_core.delivery import finalize_rollout_token_capture, mask_reason
from capture_core.records import TokenEntry
from capture_core.store import TokenCaptureStore
from capture_core.testing.agent_captures import (
    AgentRollout,
    agent_rollout,
    agent_rollouts,
    delivered_tokens,
    scored_tokens,
    write_capture,
)
from tests.builder.terminal.test_content_witness import same_answer_twins
from tests.builder.terminal.test_witnesses import message, tool_call, tool_result
from tests.support.reliability_figures import record_case
from tests.support.token_calls import token_call

pytestmark = pytest.mark.integrity


def finalize(store: TokenCaptureStore, rollout: AgentRollout) -> tuple[dict, bool]:
    record = copy.deepcopy(rollout.record)
    built = asyncio.run(finalize_rollout_token_capture(record, store))
    delivered = built is not None and built.get("rebuilt_response") is not None
    return record, delivered and not record.get("mask_sample")


def stored_without_middle_call(rollout: AgentRollout, root: str) -> TokenCaptureStore:
    """Lose the scored chain's second call silently: the rest is captured at `root`."""
    lost = rollout.scored_chain[1]
    rollout.entries = [e for e in rollout.entries if e is not lost]
    store = TokenCaptureStore(root)
    for entry in rollout.entries:
        store.put_now(entry)
    return store


@pytest.mark.parametrize("parent_fields", [True, False])
def test_agent_captures_deliver_every_attributed_healthy_rollout_and_only_the_scored_chain(
    parent_fields: bool,
) -> None:
    store = TokenCaptureStore(f"memory://terminal-{uuid.uuid4().hex[:12]}")
    rollouts = agent_rollouts(120, seed=11, parent_fields=parent_fields)
    wrong = unhealthy = deliverable_masked = undecidable_delivered = 0
    for rollout in rollouts:
        write_capture(store, rollout)
        record, delivered = finalize(store, rollout)
        if delivered and delivered_tokens(record["response"]["output"]) != scored_tokens(rollout):
            wrong += 1
        unhealthy += delivered and not rollout.healthy
        deliverable_masked += rollout.deliverable and not delivered
        undecidable_delivered += delivered and rollout.healthy and not rollout.decidable
        store.delete(rollout.rollout_id)
    kind = "with" if parent_fields else "without"
    record_case(
        f"agent captures {kind} parent fields: only the scored chain", wrong_tokens_delivered=wrong
    )
    assert {s for r in rollouts for s in r.shapes} >= {
        "auxiliary",
        "subagent",
        "diverse_mid_retry",
        "identical_mid_retry",
        "diverse_final_retry",
        "same_answer_final_retry",
        "continuation",
        "lost_call",
    }
    assert (wrong, unhealthy, deliverable_masked, undecidable_delivered) == (0, 0, 0, 0)


@pytest.mark.parametrize("parent_fields", [True, False])
def test_a_same_answer_final_retry_that_nothing_names_is_never_guessed(parent_fields: bool) -> None:
    """Two final attempts with the same answer from different tokens, no id, no terminal named.

    Every piece of evidence fits both chains; delivering either would train on a chain
    that was scored only with even odds. The same rollout with the served id is delivered.
    """
    store = TokenCaptureStore(f"memory://terminal-{uuid.uuid4().hex[:12]}")
    undecidable = [
        r
        for r in agent_rollouts(400, seed=13, parent_fields=parent_fields)
        if r.healthy and not r.decidable
    ]
    assert len(undecidable) >= 3, "the generator makes undecidable rollouts"
    delivered_count = wrong = 0
    for rollout in undecidable:
        write_capture(store, rollout)
        record, delivered = finalize(store, rollout)
        verdict = record["_ng_token_capture"]["terminal_attribution"]
        assert verdict["call_id"] is None and "content:content_ambiguous" in verdict["reason"]
        delivered_count += delivered
        wrong += delivered and (
            delivered_tokens(record["response"]["output"]) != scored_tokens(rollout)
        )
        rollout.record["response"]["id"] = rollout.scored_chain[-1].response_id
        named, delivered_named = finalize(store, rollout)
        assert delivered_named, "the served id singles out the kept attempt"
        assert delivered_tokens(named["response"]["output"]) == scored_tokens(rollout)
        store.delete(rollout.rollout_id)
    kind = "with" if parent_fields else "without"
    record_case(
        f"same-answer final retry nothing names ({kind} parent fields): not guessed",
        wrong_tokens_delivered=wrong,
    )
    assert delivered_count == 0


def _multi_chain_rollout(parent_fields: bool = False) -> AgentRollout:
    """The first seeded rollout with an auxiliary call or a sub-agent and no lost call."""
    for i in range(200):
        rollout = agent_rollout(4, i, seed=5, parent_fields=parent_fields)
        if rollout.healthy and {"auxiliary", "subagent"} & set(rollout.shapes):
            return rollout
    raise AssertionError("the generator made no multi-chain rollout")


def test_a_forged_explicit_terminal_contradicted_by_the_response_masks(tmp_path) -> None:
    rollout = _multi_chain_rollout()
    store = TokenCaptureStore(str(tmp_path / "store"))
    write_capture(store, rollout)
    scored = {e.model_call_id for e in rollout.scored_chain}
    forged = next(e for e in rollout.entries if e.model_call_id not in scored)
    rollout.record["_ng_terminal_model_call_id"] = forged.model_call_id
    rollout.record.pop("terminal_response_id", None)
    rollout.record["response"]["id"] = rollout.scored_chain[-1].response_id
    record, delivered = finalize(store, rollout)
    record_case("forged explicit terminal", wrong_tokens_delivered=int(delivered))
    assert not delivered and record["mask_sample"] is True
    assert "witness_disagreement" in record["_ng_token_capture"]["terminal_attribution"]["reason"]


def test_a_writer_parent_the_tokens_deny_breaks_the_terminal_chain(tmp_path) -> None:
    rollout = _multi_chain_rollout(parent_fields=True)
    assert len(rollout.scored_chain) >= 2
    store = TokenCaptureStore(str(tmp_path / "store"))
    liar = rollout.scored_chain[-1]
    stranger = next(e for e in rollout.entries if e not in rollout.scored_chain)
    liar.__pydantic_extra__["parent_call_id"] = stranger.model_call_id
    write_capture(store, rollout)
    record, delivered = finalize(store, rollout)
    record_case("writer parent denied by the tokens", wrong_tokens_delivered=int(delivered))
    assert (
        not delivered and record["_ng_token_capture"]["terminal_attribution"]["chain"] == "broken"
    )


def test_a_silently_lost_middle_call_is_caught_by_the_recorded_parent(tmp_path) -> None:
    """No intent marks the loss; the child's recorded parent is missing, so the path is broken."""
    rollout = next(
        r
        for i in range(100)
        if len((r := agent_rollout(6, i, seed=2, parent_fields=True)).scored_chain) >= 3
        and r.healthy
    )
    store = stored_without_middle_call(rollout, str(tmp_path / "store"))
    record, delivered = finalize(store, rollout)
    record_case(
        "silently lost middle call with writer parents",
        records_lost=0,
        wrong_tokens_delivered=int(delivered),
    )
    assert not delivered
    assert record["_ng_token_capture"]["terminal_attribution"]["chain"] == "broken"


def test_without_a_record_a_call_the_writer_evidence_quarantines_masks_the_rollout(
    tmp_path,
) -> None:
    """The strict policy must not drop a contradicted call and deliver what is left.

    A silently lost middle call leaves its child with a recorded parent that is not in the
    snapshot; the child is quarantined. Dropping it delivered the chain up to the loss as
    if it were the whole rollout. A recorded parent the tokens deny does the same.
    """
    rollout = next(
        r
        for i in range(100)
        if len((r := agent_rollout(6, i, seed=2, parent_fields=True)).scored_chain) >= 3
        and r.shapes == ["plain"]
    )
    store = stored_without_middle_call(rollout, str(tmp_path / "store"))
    built = asyncio.run(trajectories_from_source(rollout.rollout_id, store))
    assert built is not None
    delivered = built["rebuilt_response"] is not None and not built["mask_sample"]
    record_case("silently lost middle call, no record", wrong_tokens_delivered=int(delivered))
    assert not delivered and "contradicted" in mask_reason(built)


def test_an_off_path_call_naming_a_lost_parent_masks_the_attributed_rollout(tmp_path) -> None:
    """A recorded parent missing from the snapshot is a lost call, wherever its child lies.

    Here the lost call `p` sat on the scored path, but the terminal's writer could not
    resolve its parent, so the tokens link `t` to `a` and `p`'s generation reads as prompt.
    Only the off-path child `c` names `p`. Excluding `c` delivered a -> t over the hole.
    """
    store = TokenCaptureStore(str(tmp_path / "store"))

    def entry(cid: str, prompt: list[int], gen: list[int], **lineage: str) -> TokenEntry:
        return token_call(cid, prompt, gen, rollout_id="9-1", **lineage)

    store.put_now(entry("a", [1], [2], parent_resolution="root"))
    store.put_now(entry("t", [1, 2, 3, 4, 5], [6], parent_resolution="unresolved"))
    store.put_now(
        entry("c", [1, 2, 3, 4, 9], [8], parent_resolution="resolved", parent_call_id="p")
    )
    record = {"_ng_terminal_model_call_id": "t"}
    built = asyncio.run(trajectories_from_source("9-1", store, record=record))
    assert built is not None
    delivered = built["rebuilt_response"] is not None and not built["mask_sample"]
    record_case("lost call named only by an off-path child", wrong_tokens_delivered=int(delivered))
    assert not delivered, "a lost call anywhere masks"
    assert "'c'" in mask_reason(built) and "'p'" in mask_reason(built)


def test_same_answer_attempts_that_were_both_continued_are_not_guessed() -> None:
    """A later call extends each attempt of a same-answer final retry: no kept one stands out.

    A continuation is no evidence of the kept attempt (a judge of an abandoned attempt
    continues it too), so with one or both continued the build masks rather than guess.
    """
    output = [message("plan"), tool_result("ok"), tool_call("submit", answer=42)]
    entries = same_answer_twins(extend=("t1", "t2"))
    result = assemble(
        "r", entries, "prefix_merging", "", TerminalInputs(response={"output": output})
    ).to_dict()
    verdict = result["metrics"]["terminal_attribution"]
    delivered = not result["mask_sample"] and result["rebuilt_response"] is not None
    record_case(
        "same-answer attempts both continued: not guessed", wrong_tokens_delivered=int(delivered)
    )
    assert verdict["call_id"] is None and "content:content_ambiguous" in verdict["reason"]
    assert result["mask_sample"] is True
    one = same_answer_twins(extend=("t2",))
    single = assemble(
        "r", one, "prefix_merging", "", TerminalInputs(response={"output": output})
    ).to_dict()
    assert single["mask_sample"] is True, "one continued attempt is no evidence either"
