"""The trajectory builders and the projection (docs/contract.md, Building trajectories)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capture_core.builder import (
    BuildNotes,
    BuildOutput,
    assert_prefix_contiguity,
    per_request,
    prefix_merging,
    project_chain_to_output_items,
    project_main_chain_response,
    run_builder,
)
from capture_core.records import TokenEntry
from capture_core.testing.synthetic import RolloutShape, synthetic_rollout
from tests.support.token_calls import deep_rollout, shallow_stack, token_call


def call(
    cid: str,
    prompt: list[int],
    gen: list[int],
    *,
    created_at: float = 0.0,
    items: list[dict] | None = None,
    index: int | None = None,
) -> TokenEntry:
    return token_call(
        cid, prompt, gen, output_items=items or [], token_item_index=index, created_at=created_at
    )


def linear(turns: int = 4) -> list[TokenEntry]:
    return synthetic_rollout(
        "r", RolloutShape(turns=turns, prompt_tokens=8, generated_tokens=4, tool_tokens=2)
    )


def test_linear_rollout_is_one_contiguous_main_chain() -> None:
    built = prefix_merging(linear())
    assert [c.chain_id for c in built.chains] == ["main"]
    assert built.notes.roots == built.notes.chains == 1
    assert built.notes.delivered_fraction == 1.0
    assert built.notes.generated_tokens_delivered == built.notes.generated_tokens_captured == 16
    response = project_main_chain_response("r", built)
    assert_prefix_contiguity(response)
    chain = built.chains[0]
    assert chain.root_prompt == chain.links[0].entry.prompt_token_ids
    assert chain.links[0].interstitial == [], "the root prompt is the chain's root_prompt"
    assert len(chain.links[1].interstitial) == 2, "tool tokens between turns, loss mask 0"


def test_fifteen_hundred_turns_build_without_recursion() -> None:
    with shallow_stack():
        built = prefix_merging(deep_rollout())
        response = project_main_chain_response("r", built)
        assert_prefix_contiguity(response)
    assert len(built.chains[0].links) == 1500


@settings(max_examples=40, deadline=None)
@given(order=st.permutations(range(7)))
def test_capture_order_does_not_matter(order: list[int]) -> None:
    shape = RolloutShape(
        turns=5,
        prompt_tokens=6,
        generated_tokens=3,
        tool_tokens=2,
        retried_turn=2,
        auxiliary_call=True,
    )
    entries = synthetic_rollout("r", shape)
    assert len(entries) == 7
    reference = prefix_merging(entries)
    shuffled = prefix_merging([entries[i] for i in order])
    assert shuffled.notes == reference.notes
    assert project_main_chain_response("r", shuffled) == project_main_chain_response("r", reference)


def test_per_request_is_one_chain_per_call_in_prompt_order() -> None:
    built = per_request(list(reversed(linear(3))))
    assert [c.links[0].entry.model_call_id for c in built.chains] == [
        "call-00000",
        "call-00001",
        "call-00002",
    ]
    assert built.notes.builder == "per_request" and built.notes.chains == 3
    assert [c.chain_id for c in built.chains] == ["req-0", "req-1", "req-2"]
    with pytest.raises(ValueError, match="per_request built 3 chains"):
        project_main_chain_response("r", built)
    with pytest.raises(ValueError, match="unknown builder 'trie'"):
        run_builder([], "trie")


def test_projection_puts_arrays_on_the_recorded_carrier_item() -> None:
    items = [
        {"type": "reasoning", "summary": []},
        {"type": "message", "content": []},
        {"type": "function_call", "name": "f"},
    ]
    built = prefix_merging([call("a", [1, 2], [3], items=items, index=1)])
    output = project_chain_to_output_items(built.chains[0])
    assert [("generation_token_ids" in item) for item in output] == [False, True, False]
    assert output[1]["prompt_token_ids"] == [1, 2] and output[1]["generation_log_probs"] == [-0.5]


def test_projection_falls_back_to_inline_arrays_then_to_the_last_item() -> None:
    inline = [{"type": "message"}, {"type": "message", "generation_token_ids": []}, {"type": "x"}]
    out = project_chain_to_output_items(
        prefix_merging([call("a", [1], [2], items=inline)]).chains[0]
    )
    assert out[1]["generation_token_ids"] == [2] and "generation_token_ids" not in out[2]
    plain = [{"type": "reasoning"}, {"type": "message"}]
    out = project_chain_to_output_items(
        prefix_merging([call("a", [1], [2], items=plain)]).chains[0]
    )
    assert "prompt_token_ids" not in out[0], "a leading content-only item carries no token fields"
    assert out[1]["generation_token_ids"] == [2]


def test_call_without_content_items_yields_a_token_only_message() -> None:
    response = project_main_chain_response("r", prefix_merging([call("a", [1], [2, 3])]))
    assert response["output"] == [
        {
            "type": "message",
            "prompt_token_ids": [1],
            "generation_token_ids": [2, 3],
            "generation_log_probs": [-0.5, -0.5],
        }
    ]
    assert response["usage"] == {"input_tokens": 1, "output_tokens": 2}
    experts = call("a", [1], [2])
    experts.routed_experts = [[3, 4]]
    (item,) = project_main_chain_response("r", prefix_merging([experts]))["output"]
    assert set(item) == {
        "type",
        "prompt_token_ids",
        "generation_token_ids",
        "generation_log_probs",
        "routed_experts",
    }
    assert response["id"] == "proj-r" and response["object"] == "response"


def test_contiguity_check_catches_a_gap() -> None:
    good = [
        {"prompt_token_ids": [1], "generation_token_ids": [2]},
        {"type": "reasoning"},
        {"prompt_token_ids": [1, 2, 9], "generation_token_ids": [3]},
    ]
    assert_prefix_contiguity({"output": good})
    gap = [good[0], {"prompt_token_ids": [1, 7, 9], "generation_token_ids": [3]}]
    with pytest.raises(AssertionError, match="output item 1 breaks prefix contiguity"):
        assert_prefix_contiguity({"output": gap})
    short = [good[0], {"prompt_token_ids": [1], "generation_token_ids": [3]}]
    with pytest.raises(AssertionError):
        assert_prefix_contiguity({"output": short})


def test_identical_candidate_parents_quarantine_the_child() -> None:
    entries = [call("a1", [1], [2]), call("a2", [1], [2]), call("b", [1, 2, 5], [6])]
    built = prefix_merging(entries)
    assert "b" in built.quarantined
    assert built.notes.unresolved_retries == ["a1", "a2"], "ambiguous evidence must mask"
    assert built.notes.delivered_fraction < 1.0


def test_resolved_retry_keeps_the_extended_sibling() -> None:
    entries = [
        call("p", [1], [2]),
        call("x1", [1, 2, 3], [4]),
        call("x2", [1, 2, 3], [5]),
        call("c", [1, 2, 3, 5, 6], [7]),
    ]
    built = prefix_merging(entries)
    assert [link.entry.model_call_id for link in built.chains[0].links] == ["p", "x2", "c"]
    assert built.notes.unresolved_retries == [] and built.quarantined == ["x1"]
    assert built.notes.chains == 1


def test_final_call_retry_is_unresolved() -> None:
    entries = [call("p", [1], [2]), call("z2", [1, 2, 3], [4]), call("z1", [1, 2, 3], [5])]
    built = prefix_merging(entries)
    assert built.notes.unresolved_retries == ["z1", "z2"]
    assert [link.entry.model_call_id for link in built.chains[0].links] == ["p", "z1"]
    assert built.quarantined == ["z2"]


def test_root_retries_are_siblings() -> None:
    entries = [call("r1", [1], [2]), call("r2", [1], [3]), call("c", [1, 3, 4], [5])]
    built = prefix_merging(entries)
    assert built.notes.roots == 1 and built.notes.unresolved_retries == []
    assert [link.entry.model_call_id for link in built.chains[0].links] == ["r2", "c"]


def test_earliest_root_is_main_with_call_id_breaking_timestamp_ties() -> None:
    entries = [call("late", [1], [2], created_at=5.0), call("early", [7], [8], created_at=1.0)]
    built = prefix_merging(entries)
    assert [c.links[0].entry.model_call_id for c in built.chains] == ["early", "late"]
    assert [c.chain_id for c in built.chains] == ["main", "branch-0"]
    tied = prefix_merging(
        [call("b", [1], [2], created_at=1.0), call("a", [7], [8], created_at=1.0)]
    )
    assert tied.chains[0].links[0].entry.model_call_id == "a"


def test_auxiliary_call_gives_two_roots_with_the_drop_visible() -> None:
    entries = synthetic_rollout("r", RolloutShape(turns=3, auxiliary_call=True))
    built = prefix_merging(entries)
    assert built.notes.roots == 2 and built.notes.chains == 2
    assert built.chains[0].links[0].entry.model_call_id == "call-00000"
    assert built.notes.delivered_fraction < 1.0


def test_post_compaction_chain_is_a_second_root() -> None:
    entries = [
        call("a", [1, 2], [3], created_at=1),
        call("b", [1, 2, 3, 4], [5], created_at=2),
        call("after-compaction", [9, 5], [6], created_at=3),
    ]
    built = prefix_merging(entries)
    assert built.notes.roots == 2 and built.chains[0].links[-1].entry.model_call_id == "b"


def test_empty_generations_are_not_parents_and_only_empty_builds_nothing() -> None:
    entries = [call("empty", [1], []), call("a", [1], [2]), call("b", [1, 2, 3], [4])]
    built = prefix_merging(entries)
    assert built.notes.empty_generation_calls == ["empty"] and built.notes.chains == 1
    assert [link.entry.model_call_id for link in built.chains[0].links] == ["a", "b"]
    nothing = prefix_merging([call("e1", [1], []), call("e2", [1, 2], [])])
    assert nothing.chains == [] and nothing.notes.empty_generation_calls == ["e1", "e2"]
    with pytest.raises(ValueError, match="no safe trainable chain"):
        project_main_chain_response("r", nothing)


def test_log_prob_count_mismatch_invalidates_the_chain() -> None:
    bad = call("a", [1], [2])
    bad.generation_log_probs = []
    with pytest.raises(ValueError, match="the chain is invalid"):
        project_chain_to_output_items(prefix_merging([bad]).chains[0])


def test_builder_api_has_nemo_gym_signatures() -> None:
    entries = linear(2)
    built = run_builder(entries)
    assert built == run_builder(entries, builder="prefix_merging")
    assert isinstance(built.chains, list) and built.quarantined == []
    assert built.notes.builder == "prefix_merging"
    assert built.chains[0].chain_id == "main"
    assert [type(link).__name__ for link in built.chains[0].links] == ["ChainLink"] * 2
    with pytest.raises(TypeError, match=r"takes the entries first.*builder='prefix_merging'"):
        run_builder("prefix_merging", entries)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="takes the entries first"):
        run_builder("per_request")  # type: ignore[arg-type]


def test_projection_uses_the_model_as_given() -> None:
    built = prefix_merging([call("a", [1], [2])])
    built.chains[0].links[0].entry.model = "captured-model"
    assert project_main_chain_response("r", built)["model"] == ""
    assert project_main_chain_response("r", built, model="policy")["model"] == "policy"


def test_contiguity_check_takes_the_whole_response() -> None:
    response = project_main_chain_response("r", prefix_merging(linear(3)))
    assert_prefix_contiguity(response)
    with pytest.raises(TypeError, match="whole response dict"):
        assert_prefix_contiguity(response["output"])  # type: ignore[arg-type]


def test_chain_validate_refuses_a_log_prob_mismatch() -> None:
    bad = call("a", [1], [2])
    chain = prefix_merging([bad]).chains[0]
    chain.validate()
    bad.generation_log_probs = []
    with pytest.raises(ValueError, match="1 tokens but 0 log probs"):
        chain.validate()


def test_main_chain_among_several_leaves_is_the_first_leaf_by_prompt_length() -> None:
    entries = [
        call("a", [1], [2], created_at=1.0),
        call("b", [1, 2, 3], [4], created_at=2.0),
        call("d", [1, 2, 3, 4, 5], [6], created_at=4.0),
        call("c", [1, 2, 7, 7], [8], created_at=3.0),
        call("other-root", [9], [9], created_at=0.5),
        call("e", [1, 2, 7, 7], [5], created_at=5.0),
        call("f", [1, 2, 7, 7, 5, 1], [1], created_at=6.0),
    ]
    built = prefix_merging(entries)
    chains = {c.chain_id: [link.entry.model_call_id for link in c.links] for c in built.chains}
    assert chains == {
        "main": ["other-root"],
        "branch-0": ["a", "b", "d"],
        "branch-1": ["a", "e", "f"],
    }, "c is a retry of e that nobody extended, so it is quarantined"
    later = [e for e in entries if e.model_call_id != "other-root"]
    built = prefix_merging([*later, call("g", [1, 2, 9], [1], created_at=7.0)])
    assert [[link.entry.model_call_id for link in c.links] for c in built.chains] == [
        ["a", "g"],
        ["a", "b", "d"],
        ["a", "e", "f"],
    ], "leaf g has the shortest prompt of the earliest root's leaves"
    assert [c.chain_id for c in built.chains] == ["main", "branch-0", "branch-1"]


def test_build_notes_have_nemo_gyms_defaults_and_order() -> None:
    """Only `builder` is required; NeMo Gym's fields come first, in its order."""
    notes = BuildNotes(builder="prefix_merging")
    assert (notes.roots, notes.chains, notes.delivered_fraction) == (0, 0, 0.0)
    assert (notes.generated_tokens_captured, notes.generated_tokens_delivered) == (0, 0)
    assert notes.unresolved_retries == [] and notes.empty_generation_calls == []
    positional = BuildNotes("prefix_merging", 1, 1, 3, 3, 1.0, ["r1"], ["e1"])
    assert positional.unresolved_retries == ["r1"] and positional.empty_generation_calls == ["e1"]
    assert BuildOutput([]).notes == BuildNotes(builder="")


def test_run_builder_takes_the_terminal_call_id_as_nemo_gym_does() -> None:
    """`run_builder(entries, builder, terminal_call_id)`: positional or by keyword."""
    entries = synthetic_rollout("r", RolloutShape(turns=3, auxiliary_call=True))
    positional = run_builder(entries, "prefix_merging", "call-00001")
    keyword = run_builder(entries, builder="prefix_merging", terminal_call_id="call-00001")
    assert positional.notes.terminal_chain == keyword.notes.terminal_chain == "delivered"
    assert [link.entry.model_call_id for link in positional.chains[0].links] == [
        "call-00000",
        "call-00001",
    ]
