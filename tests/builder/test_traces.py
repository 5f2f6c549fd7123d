"""The `training_traces` builder and its checks, on calls spelled by their tokens.

Every shape multi-trace delivery is for (stripped thinking, compaction, sub-agents, forks,
parallel samples) owns each sampled call exactly once; what must not train is never owned;
the envelope is deterministic and every rule of `check_envelope` refuses what breaks it.
"""

from __future__ import annotations

import copy
import random
from collections import defaultdict
from decimal import Decimal

import pytest

from capture_core.builder.retry_groups import ABANDONED_TRY, ON_ABANDONED_TRY, UNSETTLED_TRY
from capture_core.builder.terminal import TerminalInputs
from capture_core.builder.trace_envelope import TraceEnvelopeError, check_envelope, owned_calls
from capture_core.builder.traces import AFTER_SCORED, IDENTICAL_DUPLICATE, build_training_traces
from capture_core.config import TokenIdCaptureConfig
from capture_core.records.token_values import FLOAT32_MAX
from capture_core.testing.trace_shapes import SHAPES, episode
from tests.support.token_calls import DEEP_TURNS, deep_rollout, shallow_stack, token_call


def _scored(call_id: str | None = None, response_id: str | None = None) -> TerminalInputs:
    response = {"id": response_id or "", "object": "response", "output": []}
    return TerminalInputs(explicit_call_id=call_id, response=response)


def _owned(built) -> list[str]:
    assert built.envelope is not None, built.error
    return owned_calls(built.envelope)


def test_a_stripped_thinking_history_makes_every_call_a_row_of_its_own() -> None:
    # The next prompt holds the previous prompt plus the answer only (reasoning [9, 9] dropped).
    first = token_call("a", [1, 2], [9, 9, 5])
    second = token_call("b", [1, 2, 5, 7], [8])
    built = build_training_traces("r", [first, second])
    assert sorted(_owned(built)) == ["a", "b"]
    rows = built.envelope["traces"]
    assert [row["model_call_ids"] for row in rows] == [["a"], ["b"]]
    assert rows[1]["token_ids"] == [1, 2, 5, 7, 8]
    assert rows[1]["loss_mask"] == [0, 0, 0, 0, 1]
    assert rows[1]["sampled_spans"] == [{"model_call_id": "b", "start": 4, "end": 5}]


def test_a_chain_is_one_row_with_tool_output_masked() -> None:
    calls = [token_call("a", [1, 2], [3]), token_call("b", [1, 2, 3, 4], [5, 6])]
    built = build_training_traces("r", calls)
    (row,) = built.envelope["traces"]
    assert row["trace_id"] == "r:b" and row["model_call_ids"] == ["a", "b"]
    assert row["token_ids"] == [1, 2, 3, 4, 5, 6]
    assert row["loss_mask"] == [0, 0, 1, 0, 1, 1]
    assert row["generation_logprobs"] == [0.0, 0.0, -0.5, 0.0, -0.5, -0.5]
    assert built.tokens_trained == 3 and built.tokens_captured == 3


def test_a_fork_owns_the_shared_ancestor_once_and_repeats_it_as_context() -> None:
    calls = [
        token_call("a", [1, 2], [3]),
        token_call("b", [1, 2, 3, 4], [5]),
        token_call("c", [1, 2, 3, 6], [7]),
    ]
    built = build_training_traces("r", calls)
    first, second = built.envelope["traces"]
    assert first["model_call_ids"] == ["a", "b"] and second["model_call_ids"] == ["a", "c"]
    assert [s["model_call_id"] for s in first["sampled_spans"]] == ["a", "b"]
    assert [s["model_call_id"] for s in second["sampled_spans"]] == ["c"]
    assert second["loss_mask"] == [0, 0, 0, 0, 1], "the shared ancestor is context there"


def test_parallel_samples_that_are_both_extended_both_train() -> None:
    calls = [
        token_call("s1", [1, 2], [3]),
        token_call("s2", [1, 2], [4]),
        token_call("t1", [1, 2, 3, 9], [5]),
        token_call("t2", [1, 2, 4, 9], [6]),
    ]
    built = build_training_traces("r", calls)
    assert sorted(_owned(built)) == ["s1", "s2", "t1", "t2"]
    assert built.excluded == {}


def test_a_retry_nothing_extends_is_abandoned_with_everything_built_on_it() -> None:
    calls = [
        token_call("kept", [1, 2], [3]),
        token_call("retry", [1, 2], [4]),
        token_call("next", [1, 2, 3, 9], [5]),
    ]
    built = build_training_traces("r", calls)
    assert sorted(_owned(built)) == ["kept", "next"]
    assert built.excluded == {"retry": ABANDONED_TRY}


def test_a_retry_is_found_with_another_root_called_between_its_tries() -> None:
    # A sub-agent's call lands between the two tries: the group is found by prompt, not order.
    calls = [
        token_call("kept", [1, 2], [3]),
        token_call("sub", [7], [8]),
        token_call("retry", [1, 2], [4]),
        token_call("next", [1, 2, 3, 9], [5]),
    ]
    built = build_training_traces("r", calls)
    assert sorted(_owned(built)) == ["kept", "next", "sub"]
    assert built.excluded == {"retry": ABANDONED_TRY}


def test_retry_groups_of_one_prompt_length_are_told_apart_by_their_prompts() -> None:
    # Five roots with prompts of one length: two retry groups, and a prompt sharing the first
    # group's first, middle and last tokens but not its tokens.
    calls = [
        token_call("x1", [1, 7, 7, 2], [3]),
        token_call("x2", [1, 7, 7, 2], [4]),
        token_call("y", [1, 8, 7, 2], [5]),
        token_call("z1", [6, 6, 6, 6], [3]),
        token_call("z2", [6, 6, 6, 6], [4]),
        token_call("xn", [1, 7, 7, 2, 3, 0], [6]),
        token_call("zn", [6, 6, 6, 6, 4, 0], [6]),
    ]
    built = build_training_traces("r", calls)
    assert sorted(_owned(built)) == ["x1", "xn", "y", "z2", "zn"]
    assert built.excluded == {"x2": ABANDONED_TRY, "z1": ABANDONED_TRY}


def test_the_scored_try_of_a_final_retry_is_kept_and_a_judge_of_the_other_is_not() -> None:
    calls = [
        token_call("a", [1, 2], [3]),
        token_call("try1", [1, 2, 3, 4], [5]),
        token_call("try2", [1, 2, 3, 4], [6]),
        token_call("judge", [1, 2, 3, 4, 5, 8], [7]),  # checked try1, which was then retried
    ]
    built = build_training_traces("r", calls, terminal=_scored("try2"))
    assert sorted(_owned(built)) == ["a", "try2"]
    assert built.excluded == {"try1": ABANDONED_TRY, "judge": ON_ABANDONED_TRY}
    counts = built.excluded_counts()
    assert counts == {ABANDONED_TRY: 1, ON_ABANDONED_TRY: 1} and list(counts) == sorted(counts)


def test_an_unsettled_retry_masks_without_a_scored_call() -> None:
    calls = [token_call("a", [1, 2], [3]), token_call("b", [1, 2], [4])]
    built = build_training_traces("r", calls)
    assert built.envelope is None and "unsettled retry groups [['a', 'b']]" in (built.error or "")


def test_an_unsettled_retry_off_the_scored_path_is_excluded_not_masked() -> None:
    calls = [
        token_call("aux1", [7, 7], [1]),
        token_call("aux2", [7, 7], [2]),
        token_call("main", [1, 2, 3], [4]),
    ]
    built = build_training_traces("r", calls, terminal=_scored("main"))
    assert _owned(built) == ["main"]
    assert built.excluded == {"aux1": UNSETTLED_TRY, "aux2": UNSETTLED_TRY}


def test_a_try_the_transcript_names_alone_is_the_used_one() -> None:
    items = [{"type": "message", "role": "assistant", "content": "the answer"}]
    other = [{"type": "message", "role": "assistant", "content": "another answer"}]
    calls = [
        token_call("a", [1, 2], [3], output_items=items),
        token_call("b", [1, 2], [4], output_items=other),
    ]
    response = {"object": "response", "output": [{"type": "message", "role": "user"}, *items]}
    built = build_training_traces("r", calls, terminal=TerminalInputs(response=response))
    assert _owned(built) == ["a"] and built.excluded == {"b": ABANDONED_TRY}


def test_same_answer_tries_are_not_told_apart_by_content() -> None:
    items = [{"type": "message", "role": "assistant", "content": "the answer"}]
    calls = [
        token_call("a", [1, 2], [3], output_items=items),
        token_call("b", [1, 2], [4], output_items=items),
    ]
    response = {"object": "response", "output": items}
    built = build_training_traces("r", calls, terminal=TerminalInputs(response=response))
    assert built.envelope is None, "either try may be the abandoned one"


def test_a_judge_extending_one_of_two_same_answer_tries_settles_nothing() -> None:
    items = [{"type": "message", "role": "assistant", "content": "the answer"}]
    judge = [{"type": "message", "role": "assistant", "content": "rejected"}]
    calls = [
        token_call("a", [1, 2], [3], output_items=items),
        token_call("b", [1, 2], [4], output_items=items),
        token_call("judge", [1, 2, 3, 9], [5], output_items=judge),
    ]
    response = {"object": "response", "output": items}
    built = build_training_traces("r", calls, terminal=TerminalInputs(response=response))
    assert built.envelope is None and "unsettled" in (built.error or "")


def test_a_later_turn_of_the_transcript_settles_same_answer_tries() -> None:
    items = [{"type": "message", "role": "assistant", "content": "let me look"}]
    final = [{"type": "message", "role": "assistant", "content": "found it"}]
    calls = [
        token_call("a", [1, 2], [3], output_items=items),
        token_call("b", [1, 2], [4], output_items=items),
        token_call("next", [1, 2, 3, 9], [5], output_items=final),
    ]
    user = {"type": "message", "role": "user", "content": "go on"}
    response = {"object": "response", "output": [*items, user, *final]}
    built = build_training_traces("r", calls, terminal=TerminalInputs(response=response))
    assert sorted(_owned(built)) == ["a", "next"] and built.excluded == {"b": ABANDONED_TRY}


def test_calls_after_the_scored_response_do_not_train() -> None:
    answer = [30, 31, 32, 33, 34, 35, 36, 37]
    calls = [
        token_call("scored", [1, 2], answer, created_at=2.0),
        token_call("summary", [1, 2, *answer, 5], [6], created_at=3.0),
        token_call("judge", [9, *answer, 9], [7], created_at=4.0),
        token_call("title", [8, 8], [9], created_at=1.0),
    ]
    built = build_training_traces("r", calls, terminal=_scored("scored"))
    assert sorted(_owned(built)) == ["scored", "title"]
    assert built.excluded == {"judge": AFTER_SCORED, "summary": AFTER_SCORED}


def test_identical_calls_train_once() -> None:
    calls = [token_call("a", [1, 2], [3]), token_call("b", [1, 2], [3])]
    built = build_training_traces("r", calls)
    assert _owned(built) == ["a"] and built.excluded == {"b": IDENTICAL_DUPLICATE}


def test_two_different_records_of_one_call_id_mask() -> None:
    calls = [token_call("a", [1, 2], [3]), token_call("a", [1, 2], [4])]
    built = build_training_traces("r", calls)
    assert built.envelope is None and "captured twice" in (built.error or "")


def test_per_request_is_one_row_per_call() -> None:
    calls = [token_call("a", [1, 2], [3]), token_call("b", [1, 2, 3, 4], [5, 6])]
    built = build_training_traces("r", calls, builder="per_request")
    rows = built.envelope["traces"]
    assert [row["model_call_ids"] for row in rows] == [["a"], ["b"]]
    assert rows[0]["token_ids"] == [1, 2, 3] and rows[1]["loss_mask"] == [0, 0, 0, 0, 1, 1]
    assert built.envelope["builder"] == "per_request"


@pytest.mark.parametrize("shape", [s for s in SHAPES if s != "lost"])
def test_every_generated_shape_validates_and_owns_exactly_the_used_calls(shape: str) -> None:
    """A lost call is seen at the snapshot (its intent), so its shape is tested there."""
    for index in range(6):
        ep = episode(index, shape, seed=3)
        built = build_training_traces(
            ep.rollout_id, ep.entries, terminal=TerminalInputs.from_record(ep.record)
        )
        owned = _owned(built)
        calls = {e.model_call_id: e for e in ep.entries}
        check_envelope(built.envelope, ep.rollout_id, calls=calls, owners=owned)
        assert len(owned) == len(set(owned))
        assert not set(owned) & ep.abandoned
        assert set(owned) == ep.used


def test_the_envelope_does_not_depend_on_capture_order() -> None:
    ep = episode(1, "parallel", seed=5)
    inputs = TerminalInputs.from_record(ep.record)
    first = build_training_traces(ep.rollout_id, ep.entries, terminal=inputs)
    shuffled = list(ep.entries)
    random.Random(1).shuffle(shuffled)
    again = build_training_traces(ep.rollout_id, shuffled, terminal=inputs)
    assert first.envelope == again.envelope


def _valid() -> dict:
    calls = [token_call("a", [1, 2], [3]), token_call("b", [1, 2, 3, 4], [5, 6])]
    return build_training_traces("r", calls).envelope


def _broken(edit) -> dict:
    envelope = copy.deepcopy(_valid())
    edit(envelope)
    return envelope


BROKEN = {
    "version 2": lambda e: e.update(schema_version=2),
    "other rollout": lambda e: e.update(rollout_id="s"),
    "no traces": lambda e: e.update(traces=[]),
    "unknown builder": lambda e: e.update(builder="magic"),
    "short log probs": lambda e: e["traces"][0]["generation_logprobs"].pop(),
    "huge log prob": lambda e: e["traces"][0]["generation_logprobs"].__setitem__(2, -(10**400)),
    "nan log prob": lambda e: e["traces"][0]["generation_logprobs"].__setitem__(2, float("nan")),
    "first position trains": lambda e: e["traces"][0]["loss_mask"].__setitem__(0, 1),
    "mask beyond spans": lambda e: e["traces"][0]["loss_mask"].__setitem__(3, 1),
    "log prob outside spans": lambda e: e["traces"][0]["generation_logprobs"].__setitem__(3, -1.0),
    "tiny log prob outside spans": lambda e: e["traces"][0]["generation_logprobs"].__setitem__(
        1, 1e-300
    ),
    "nan outside spans": lambda e: e["traces"][0]["generation_logprobs"].__setitem__(
        3, float("nan")
    ),
    "a span's 0.0 traded for a gap's log prob": lambda e: e["traces"][0][
        "generation_logprobs"
    ].__setitem__(slice(2, 4), [0.0, -1.0]),
    "null outside spans": lambda e: e["traces"][0]["generation_logprobs"].__setitem__(1, None),
    "text outside spans": lambda e: e["traces"][0]["generation_logprobs"].__setitem__(1, "0"),
    "float mask": lambda e: e["traces"][0]["loss_mask"].__setitem__(2, 1.0),
    "negative id": lambda e: e["traces"][0]["token_ids"].__setitem__(0, -1),
    "string id": lambda e: e["traces"][0]["token_ids"].__setitem__(0, "1"),
    "wrong trace id": lambda e: e["traces"][0].update(trace_id="r:a"),
    "span of a stranger": lambda e: e["traces"][0]["sampled_spans"][0].update(model_call_id="z"),
    "span naming a list": lambda e: e["traces"][0]["sampled_spans"][0].update(model_call_id=["a"]),
    "span without its call id": lambda e: e["traces"][0]["sampled_spans"].__setitem__(
        0, defaultdict(lambda: "a", start=2, end=3)
    ),
    "span that is a list": lambda e: e["traces"][0]["sampled_spans"].__setitem__(0, ["a", 1, 2]),
    "overlapping spans": lambda e: e["traces"][0]["sampled_spans"][1].update(start=2),
    "owned twice": lambda e: e["traces"].append(copy.deepcopy(e["traces"][0])),
    "missing field": lambda e: e["traces"][0].pop("loss_mask"),
}


def _capture() -> dict:
    return {"a": token_call("a", [1, 2], [3]), "b": token_call("b", [1, 2, 3, 4], [5, 6])}


@pytest.mark.parametrize(
    "against_capture, calls_finite",
    [(False, False), (True, False), (True, True)],
    ids=["alone", "against the capture", "against a capture checked finite"],
)
@pytest.mark.parametrize("name", sorted(BROKEN))
def test_check_envelope_refuses_each_broken_rule(
    name: str, against_capture: bool, calls_finite: bool
) -> None:
    """Every rule holds on its own and beside the capture: the capture's comparisons never
    stand in for a rule of the envelope, nor does a capture known to be finite."""
    calls = _capture() if against_capture else None
    check_envelope(_valid(), "r", calls=calls, calls_finite=calls_finite)
    with pytest.raises(TraceEnvelopeError, match="training_traces"):
        check_envelope(_broken(BROKEN[name]), "r", calls=calls, calls_finite=calls_finite)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_build_refuses_calls_made_non_finite_after_validation(bad: float) -> None:
    """The build checks its envelope against calls it found finite itself, when it read them:
    a call whose log probs were reassigned after validation is refused there."""
    calls = [token_call("a", [1, 2], [3]), token_call("b", [1, 2, 3, 4], [5, 6])]
    calls[1].generation_log_probs = [-0.5, bad]
    with pytest.raises(ValueError, match="NaN or infinite"):
        build_training_traces("r", calls)

    def changing_as_read():  # an entry changed after it was handed over, as the next is read
        fresh = [token_call("a", [1, 2], [3]), token_call("b", [1, 2, 3, 4], [5, 6])]
        yield fresh[0]
        fresh[0].generation_log_probs[0] = bad
        yield fresh[1]

    with pytest.raises(ValueError, match="NaN or infinite"):
        build_training_traces("r", changing_as_read())


def test_any_zero_outside_the_spans_is_accepted() -> None:
    """A gap is compared with 0.0 by value: a parsed `0`, `0.0` or `-0.0` is not refused."""
    calls = {"a": token_call("a", [1, 2], [3]), "b": token_call("b", [1, 2, 3, 4], [5, 6])}
    for zero in (0, 0.0, -0.0):
        envelope = _broken(
            lambda e, z=zero: e["traces"][0]["generation_logprobs"].__setitem__(3, z)
        )
        check_envelope(envelope, "r", calls=calls, owners=["a", "b"])


def test_a_sampled_log_prob_of_zero_is_accepted() -> None:
    """A sampled token may have log prob 0.0 (probability 1): it is a span's value, not a
    gap's, and the gaps are still all 0.0."""
    envelope = _broken(lambda e: e["traces"][0]["generation_logprobs"].__setitem__(2, 0.0))
    check_envelope(envelope, "r")


def test_check_envelope_against_the_capture_refuses_other_tokens() -> None:
    calls = {"a": token_call("a", [1, 2], [3]), "b": token_call("b", [1, 2, 3, 4], [5, 6])}
    check_envelope(_valid(), "r", calls=calls, owners=["a", "b"])
    edited = _broken(lambda e: e["traces"][0]["token_ids"].__setitem__(5, 7))
    with pytest.raises(TraceEnvelopeError, match="exactly the tokens the call generated"):
        check_envelope(edited, "r", calls=calls)
    context = _broken(lambda e: e["traces"][0]["token_ids"].__setitem__(3, 8))
    with pytest.raises(TraceEnvelopeError, match="prompt the call was served"):
        check_envelope(context, "r", calls=calls)
    with pytest.raises(TraceEnvelopeError, match="unowned"):
        check_envelope(_valid(), "r", calls=calls, owners=["a", "b", "c"])


@pytest.mark.parametrize(
    "bad", [float("nan"), float("-inf"), None, -(10**400)], ids=["nan", "-inf", "null", "huge"]
)
def test_a_capture_log_prob_that_is_no_finite_number_is_refused(bad: object) -> None:
    """A log prob reassigned on a validated call after the fact (validation is skipped on
    assignment) is refused even where the row carries that very object."""
    calls = _capture()
    calls["b"].generation_log_probs = [-0.5, bad]
    envelope = _broken(lambda e: e["traces"][0]["generation_logprobs"].__setitem__(5, bad))
    with pytest.raises(TraceEnvelopeError, match="not a finite number"):
        check_envelope(envelope, "r", calls=calls)


def test_log_probs_no_float_can_hold_are_refused_even_where_they_cancel_out() -> None:
    """Integers beyond any float, as stdlib `json` parses 400-digit numbers, in two spans
    whose exact sum is 0: refused alone and against a capture reassigned to hold them."""
    huge = 10**400

    def cancel(envelope: dict) -> None:
        envelope["traces"][0]["generation_logprobs"][:] = [0, 0, huge, 0, -huge, -1]

    with pytest.raises(TraceEnvelopeError, match="not a finite number"):
        check_envelope(_broken(cancel), "r")
    calls = _capture()
    calls["a"].generation_log_probs = [huge]
    calls["b"].generation_log_probs = [-huge, -1]
    with pytest.raises(TraceEnvelopeError, match="not a finite number"):
        check_envelope(_broken(cancel), "r", calls=calls)


def test_a_capture_whose_log_probs_miss_their_span_is_refused() -> None:
    """Reassigned log probs one too long on one call and one too short on the next leave the
    row's length whole; each call's count must still be its span's."""
    calls = _capture()
    calls["a"].generation_log_probs = [-0.5, 0.0]
    calls["b"].generation_log_probs = [-0.5]
    envelope = _broken(
        lambda e: e["traces"][0]["generation_logprobs"].__setitem__(
            slice(None), [0.0, 0.0, -0.5, 0.0, 0.0, -0.5]
        )
    )
    with pytest.raises(TraceEnvelopeError, match="sampling-time log probs"):
        check_envelope(envelope, "r", calls=calls)


def test_a_capture_of_decimal_infinities_is_refused_by_name() -> None:
    calls = _capture()
    calls["a"].generation_log_probs = [Decimal("Infinity")]
    calls["b"].generation_log_probs = [Decimal("-Infinity"), Decimal(0)]
    with pytest.raises(TraceEnvelopeError):
        check_envelope(_valid(), "r", calls=calls)


@pytest.mark.parametrize("beyond", [-1e308, -1e39, 1e39, -3.5e38])
def test_log_probs_float32_cannot_hold_are_refused_and_its_largest_are_accepted(
    beyond: float,
) -> None:
    """Rows store float32: a finite float64 beyond its range would be an infinity there.
    Values at float32's largest magnitude, whose sum a float holds, are accepted."""
    calls = _capture()
    calls["a"].generation_log_probs = [-FLOAT32_MAX]
    calls["b"].generation_log_probs = [-FLOAT32_MAX, -FLOAT32_MAX]
    held = [-FLOAT32_MAX, 0.0, -FLOAT32_MAX, -FLOAT32_MAX]
    set_span_log_probs = _broken(
        lambda e: e["traces"][0]["generation_logprobs"].__setitem__(slice(2, 6), held)
    )
    check_envelope(set_span_log_probs, "r", calls=calls, owners=["a", "b"])
    calls["b"].generation_log_probs = [-FLOAT32_MAX, beyond]
    beyond_row = _broken(
        lambda e: e["traces"][0]["generation_logprobs"].__setitem__(
            slice(2, 6), [*held[:3], beyond]
        )
    )
    for against in (calls, None):
        with pytest.raises(TraceEnvelopeError, match="not a finite number"):
            check_envelope(beyond_row, "r", calls=against)


def test_spans_listed_out_of_order_are_read_by_position() -> None:
    calls = {"a": token_call("a", [1, 2], [3]), "b": token_call("b", [1, 2, 3, 4], [5, 6])}
    reversed_spans = _broken(lambda e: e["traces"][0]["sampled_spans"].reverse())
    check_envelope(reversed_spans, "r", calls=calls, owners=["a", "b"])

    def overlap_out_of_order(envelope: dict) -> None:
        spans = envelope["traces"][0]["sampled_spans"]
        spans[1].update(start=2)
        spans.reverse()

    with pytest.raises(TraceEnvelopeError, match="overlaps"):
        check_envelope(_broken(overlap_out_of_order), "r")


def _generated_envelopes() -> list[tuple[str, dict, dict]]:
    """Every delivered envelope of a few generated episodes per shape, with its capture."""
    found = []
    for shape in SHAPES:
        for index in range(3):
            ep = episode(index, shape, seed=11)
            inputs = TerminalInputs.from_record(ep.record)
            built = build_training_traces(ep.rollout_id, ep.entries, terminal=inputs)
            if built.envelope is not None:
                calls = {e.model_call_id: e for e in ep.entries}
                found.append((ep.rollout_id, built.envelope, calls))
    return found


def test_every_one_token_edit_of_a_generated_envelope_is_refused() -> None:
    """One token changed anywhere in a row (context, a prompt, a generation) is refused, as
    is a trainable first position or a span moved onto the one before it."""
    envelopes = _generated_envelopes()
    assert envelopes
    edits = 0
    for rollout_id, envelope, calls in envelopes:
        check_envelope(envelope, rollout_id, calls=calls)
        for t, trace in enumerate(envelope["traces"]):
            for position in {0, 1, *(s["start"] - 1 for s in trace["sampled_spans"])}:
                edited = copy.deepcopy(envelope)
                edited["traces"][t]["token_ids"][position] += 1
                with pytest.raises(TraceEnvelopeError, match="prompt the call|the call generated"):
                    check_envelope(edited, rollout_id, calls=calls)
                edits += 1
            first = copy.deepcopy(envelope)
            first["traces"][t]["loss_mask"][0] = 1
            with pytest.raises(TraceEnvelopeError, match="first position"):
                check_envelope(first, rollout_id, calls=calls)
            if len(trace["sampled_spans"]) > 1:
                overlapping = copy.deepcopy(envelope)
                spans = overlapping["traces"][t]["sampled_spans"]
                spans[1]["start"] = spans[0]["end"] - 1
                with pytest.raises(TraceEnvelopeError, match="overlaps"):
                    check_envelope(overlapping, rollout_id, calls=calls)
    assert edits > len(envelopes)


def test_the_delivery_key_is_read_and_a_misspelt_one_refused() -> None:
    block = {"enabled": True, "dir": "/captures", "delivery": "all_traces"}
    assert TokenIdCaptureConfig.from_global({"token_id_capture": block}).delivery == "all_traces"
    assert TokenIdCaptureConfig.from_global({}).delivery == "main_chain"
    with pytest.raises(ValueError, match="token_id_capture.delivery"):
        TokenIdCaptureConfig.from_global({"token_id_capture": {**block, "delivery": "all"}})


def test_thousands_of_turns_build_without_recursion() -> None:
    calls = deep_rollout()
    with shallow_stack():
        built = build_training_traces("r", calls)
    assert len(_owned(built)) == len(calls) == DEEP_TURNS
    assert len(built.envelope["traces"]) == 1
