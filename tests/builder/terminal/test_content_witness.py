"""The content witness: whole transcripts, trailing blocks, and how different matches settle.

A match is settled only by evidence (the whole transcript along a root-to-call path, or a
later call extending one retry); a tie that evidence cannot break is ambiguous, never picked.
"""

from __future__ import annotations

from capture_core.builder.call_content import entry_fingerprint, path_items
from capture_core.builder.terminal import abstention_reasons
from tests.builder.terminal.test_witnesses import attribute, call, message, tool_call, tool_result


def test_a_merged_transcript_without_breaks_matches_the_root_to_call_path() -> None:
    """Turns back to back (no tool result between): neither call's own items are a reading."""
    entries = [
        call("a", [1], [2], [message("plan")]),
        call("b", [1, 2, 3], [4], [message("answer")]),
        call("aux", [7], [8], [message("answer")]),
    ]
    verdict = attribute(entries, response={"output": [message("plan"), message("answer")]})
    assert (verdict.method, verdict.call_id) == ("content", "b")
    own = {id(e): entry_fingerprint(e) for e in entries}
    assert path_items(entries[1], entries, own) == (("text", "plan"), ("text", "answer"))
    reordered = attribute(entries, response={"output": [message("answer"), message("plan")]})
    assert reordered.call_id is None, "a path must hold the items in their order"


def test_the_whole_transcript_settles_the_same_text_at_two_depths() -> None:
    """ "Done." twice: the merged transcript fits only the deeper call's whole path."""
    entries = [
        call("d1", [1], [2], [message("Done.")]),
        call("d2", [1, 2, 3], [4], [message("Done.")]),
    ]
    merged = [message("Done."), tool_result("ok"), message("Done.")]
    verdict = attribute(entries, response={"output": merged})
    assert (verdict.method, verdict.call_id) == ("content", "d2")
    final_turn = attribute(entries, response={"output": [message("Done.")]})
    assert final_turn.call_id is None and "content_ambiguous" in abstention_reasons(
        final_turn.reason
    ), "one item fits d1's whole path and d2's final turn alike: ambiguous"


def same_answer_twins(*, extend: tuple[str, ...] = ()) -> list:
    """A final call retried with the same answer from other tokens, and what extends them."""
    submit = tool_call("submit", answer=42)
    entries = [
        call("root", [1], [2], [message("plan")]),
        call("t1", [1, 2, 3], [4], [submit], "resp_t1"),
        call("t2", [1, 2, 3], [5], [submit], "resp_t2"),
    ]
    for n, twin in enumerate(extend):
        gen = [4] if twin == "t1" else [5]
        entries.append(call(f"summary{n}", [1, 2, 3, *gen, 9], [6], [message("summary")]))
    return entries


def test_a_same_answer_retry_nothing_tells_apart_is_ambiguous() -> None:
    output = [message("plan"), tool_result("ok"), tool_call("submit", answer=42), tool_result("")]
    verdict = attribute(same_answer_twins(), response={"output": output})
    assert verdict.call_id is None and not verdict.must_mask
    assert abstention_reasons(verdict.reason) == ["response_has_no_id", "content_ambiguous"]
    both = attribute(same_answer_twins(extend=("t1", "t2")), response={"output": output})
    assert both.call_id is None, "both attempts continued: still a tie"
    served = attribute(same_answer_twins(), response={"id": "resp_t2", "output": output})
    assert (served.method, served.call_id) == ("response_id", "t2")


def test_a_later_call_extending_one_retry_does_not_make_it_the_kept_one() -> None:
    """A summary of the kept attempt and a judge of an abandoned one look alike."""
    output = [message("plan"), tool_result("ok"), tool_call("submit", answer=42)]
    for extended in ("t1", "t2"):
        verdict = attribute(same_answer_twins(extend=(extended,)), response={"output": output})
        assert verdict.call_id is None
        assert "content_ambiguous" in abstention_reasons(verdict.reason)


def test_extension_settles_only_retries_of_one_prompt() -> None:
    """A shallower call is always extended by the deeper one: that says nothing about which
    was scored, so extension never settles matches with different prompts."""
    entries = [
        call("d1", [1], [2], [message("Done.")]),
        call("d2", [1, 2, 3], [4], [message("Done.")]),
    ]
    verdict = attribute(entries, response={"output": [message("Done.")]})
    assert verdict.call_id is None


def test_many_calls_with_the_same_text_are_ambiguous_without_reading_every_path() -> None:
    """Reading paths is bounded: the same text in many calls abstains instead of scanning."""
    entries = [
        call(f"d{n:02}", list(range(2 * n + 1)), [2 * n + 1], [message("Done.")]) for n in range(20)
    ]
    merged = [message("Done."), tool_result("ok"), message("Done.")]
    verdict = attribute(entries, response={"output": merged})
    assert verdict.call_id is None and "content_ambiguous" in abstention_reasons(verdict.reason)
    twice = attribute(entries[:2], response={"output": merged})
    assert twice.call_id == "d01", "few candidates are still settled by their paths"
