"""The seeded generator of agent captures that the yield benchmark and the tests share."""

from __future__ import annotations

from capture_core.builder import prefix_merging, project_main_chain_response
from capture_core.builder.terminal import TerminalInputs
from capture_core.builder.terminal_witnesses import attribute_terminal
from capture_core.testing.agent_captures import (
    agent_rollout,
    agent_rollouts,
    delivered_tokens,
    scored_tokens,
)

LINEAGE = {"parent_call_id", "parent_resolution", "cum_len", "digest"}


def test_the_same_seed_gives_the_same_rollout_and_parent_fields_change_only_extras() -> None:
    plain = agent_rollout(2, 3, seed=9)
    assert agent_rollout(2, 3, seed=9).record == plain.record
    stamped = agent_rollout(2, 3, seed=9, parent_fields=True)
    for a, b in zip(plain.entries, stamped.entries, strict=True):
        assert a.model_dump() == {k: v for k, v in b.model_dump().items() if k not in LINEAGE}
        assert set(b.__pydantic_extra__) == LINEAGE and not a.__pydantic_extra__
    assert stamped.entries[0].cum_len == len(stamped.entries[0].prompt_token_ids) + len(
        stamped.entries[0].generation_token_ids
    )


def test_the_scored_response_names_the_terminal_and_its_chain_is_a_token_path() -> None:
    for i in range(40):
        rollout = agent_rollout(1, i, seed=4)
        terminal = rollout.scored_chain[-1]
        verdict = attribute_terminal(rollout.entries, TerminalInputs.from_record(rollout.record))
        if rollout.healthy and verdict.call_id is not None:
            named = next(e for e in rollout.entries if e.model_call_id == verdict.call_id)
            assert named.generation_token_ids == terminal.generation_token_ids
        built = prefix_merging(rollout.entries, terminal_call_id=terminal.model_call_id)
        if rollout.healthy:
            output = project_main_chain_response(rollout.rollout_id, built)["output"]
            assert delivered_tokens(output) == scored_tokens(rollout)


def test_a_chain_other_than_the_scored_one_is_detected() -> None:
    rollout = next(
        r for i in range(50) if len((r := agent_rollout(1, i, seed=4)).scored_chain) >= 2
    )
    shorter = prefix_merging(
        rollout.entries, terminal_call_id=rollout.scored_chain[-2].model_call_id
    )
    output = project_main_chain_response(rollout.rollout_id, shorter)["output"]
    assert delivered_tokens(output) != scored_tokens(rollout)


def test_only_a_same_answer_final_retry_that_nothing_names_is_undecidable() -> None:
    """Undecidable means the evidence fits another chain alike: the kept final attempt has a
    twin with its parent and items but other tokens, and no id, terminal or later call
    names the kept one. Naming it in the record makes the rollout decidable again."""
    rollouts = agent_rollouts(400, seed=13)
    undecidable = [r for r in rollouts if not r.decidable]
    assert undecidable and len(undecidable) < 0.05 * len(rollouts)
    for rollout in rollouts:
        terminal = rollout.scored_chain[-1]
        twins = [
            e
            for e in rollout.entries
            if e is not terminal
            and e.prompt_token_ids == terminal.prompt_token_ids
            and e.output_items == terminal.output_items
            and e.generation_token_ids != terminal.generation_token_ids
        ]
        named = {"_ng_terminal_model_call_id", "terminal_response_id"} & set(rollout.record)
        served = rollout.record["response"].get("id") == terminal.response_id
        if not rollout.decidable:
            assert "continuation" not in rollout.shapes and not named and not served
            assert twins or rollout.lost_call_ids, "the twin is captured unless it was lost"
        elif "same_answer_final_retry" in rollout.shapes:
            assert named or served or "continuation" in rollout.shapes
        assert rollout.deliverable == (rollout.healthy and rollout.decidable)
