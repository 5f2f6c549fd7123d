"""Prefix keys: a cheap index key for "this token sequence starts with that one".

A key is a prefix's length plus three of its tokens (first, middle, last). Equal keys are
necessary for a prefix match, never sufficient: every user verifies a candidate by comparing
whole token lists. The builder indexes calls by the key of their prompt plus generation to
find parents. It is a hot path, so a key reads three tokens and never slices or concatenates.
(The store finds delta parents by comparing int64 token bytes instead: `compact`.)
"""

from __future__ import annotations

from collections.abc import Sequence

PrefixKey = tuple[int, int, int, int]


def prefix_key(tokens: Sequence[int], length: int) -> PrefixKey:
    """The key of `tokens[:length]`; `length` is between 1 and `len(tokens)`."""
    return (length, tokens[0], tokens[length // 2], tokens[length - 1])


def joined_key(head: Sequence[int], tail: Sequence[int]) -> PrefixKey:
    """The key of `head + tail` (not both empty), read from the two parts without joining."""
    cut = len(head)
    n = cut + len(tail)
    mid = n // 2
    first = head[0] if cut else tail[0]
    middle = head[mid] if mid < cut else tail[mid - cut]
    last = tail[-1] if tail else head[-1]
    return (n, first, middle, last)
