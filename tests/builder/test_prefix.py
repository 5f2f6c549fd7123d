"""Prefix keys: one key for a sequence however it is split, and a match only on real prefixes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from capture_core.builder.prefix import joined_key, prefix_key

tokens = st.lists(st.integers(0, 2**40), max_size=40)


@given(head=tokens, tail=tokens)
def test_joined_key_is_the_key_of_the_joined_sequence(head: list[int], tail: list[int]) -> None:
    joined = head + tail
    if joined:
        assert joined_key(head, tail) == prefix_key(joined, len(joined))


@given(sequence=tokens.filter(bool), data=st.data())
def test_a_prefix_has_the_key_of_its_whole_sequence(sequence: list[int], data) -> None:
    length = data.draw(st.integers(1, len(sequence)))
    assert prefix_key(sequence, length) == prefix_key(sequence[:length], length)


def test_keys_differ_by_length_even_when_sampled_tokens_agree() -> None:
    assert prefix_key([7, 7, 7, 7], 3) != prefix_key([7, 7, 7, 7], 4)
    assert joined_key([1, 2], [3]) == (3, 1, 2, 3)
    assert joined_key([], [5, 6]) == (2, 5, 6, 6) and joined_key([5, 6], []) == (2, 5, 6, 6)
