"""Property test over random capture shapes: unmasked records are exactly the main chain."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capture_core.builder import assert_prefix_contiguity
from capture_core.builder.build_result import BuildResult
from capture_core.builder.snapshot import assemble
from capture_core.delivery import mask_reason
from capture_core.records import TokenEntry

pytestmark = pytest.mark.integrity


@st.composite
def captures(draw: st.DrawFn) -> tuple[list[TokenEntry], list[TokenEntry], bool]:
    """(all entries shuffled, the intended main path, whether the shape must mask)."""
    token = st.integers(min_value=0, max_value=50)
    turns = draw(st.integers(min_value=1, max_value=8))
    prompt = draw(st.lists(token, min_size=1, max_size=6))
    entries: list[TokenEntry] = []
    main: list[TokenEntry] = []
    must_mask = False

    def call(cid: str, p: list[int], g: list[int], at: float) -> TokenEntry:
        lps = [-(i + 1) / 10 for i in range(len(g))]
        return TokenEntry(
            rollout_id="r",
            model_call_id=cid,
            prompt_token_ids=p,
            generation_token_ids=g,
            generation_log_probs=lps,
            created_at=at,
            output_items=[{"type": "message", "content": [{"text": cid}]}],
            token_item_index=0,
        )

    for turn in range(turns):
        gen = draw(st.lists(token, min_size=1, max_size=5))
        if draw(st.booleans()) and draw(st.booleans()):
            dropped = draw(
                st.lists(token, min_size=1, max_size=5).filter(lambda g, gen=gen: g[0] != gen[0])
            )
            entries.append(call(f"t{turn}-retry", list(prompt), dropped, 10.0 + turn))
            must_mask = must_mask or turn == turns - 1
        kept = call(f"t{turn}", list(prompt), gen, 10.5 + turn)
        entries.append(kept)
        main.append(kept)
        if draw(st.integers(0, 9)) == 0:
            entries.append(call(f"t{turn}-empty", [*prompt, 99], [], 11.0 + turn))
        prompt = prompt + gen + draw(st.lists(token, min_size=0, max_size=4))
    if draw(st.integers(0, 5)) == 0:
        entries.append(call("aux", [77, 78], [1], 100.0))
        must_mask = True
    if turns > 1 and draw(st.integers(0, 5)) == 0:
        base = main[0]
        fork = base.prompt_token_ids + base.generation_token_ids + [88, 89]
        entries.append(call("fork", fork, [3], 50.0))
        must_mask = True
    order = draw(st.permutations(range(len(entries))))
    return [entries[i] for i in order], main, must_mask


@settings(max_examples=300, deadline=None)
@given(captures())
def test_unmasked_records_are_contiguous_and_carry_exactly_the_main_chain(shape) -> None:
    entries, main, must_mask = shape
    built = assemble("r", entries, "prefix_merging", "").to_dict()
    if must_mask:
        assert built["mask_sample"], "an unsafe shape must mask"
    if built["mask_sample"]:
        return
    output = built["rebuilt_response"]["output"]
    assert_prefix_contiguity(built["rebuilt_response"])
    generated = [item for item in output if item.get("generation_token_ids")]
    assert [item["generation_token_ids"] for item in generated] == [
        e.generation_token_ids for e in main
    ]
    assert [item["generation_log_probs"] for item in generated] == [
        e.generation_log_probs for e in main
    ]
    assert generated[0]["prompt_token_ids"] == main[0].prompt_token_ids
    assert built["metrics"]["delivered_fraction"] <= 1.0


@settings(max_examples=150, deadline=None)
@given(captures())
def test_the_typed_build_and_its_seed_dict_agree(shape) -> None:
    entries, _main, _must_mask = shape
    typed = assemble("r", entries, "prefix_merging", "")
    built = typed.to_dict()
    assert built == assemble("r", entries, "prefix_merging", "").to_dict(), "one build, one dict"
    assert BuildResult.from_dict(built) == typed
    assert mask_reason(built) == typed.mask_reason()
    assert (typed.mask_reason() is None) is (not typed.mask_sample)
