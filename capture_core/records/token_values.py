"""The values a captured call holds: which fields carry tokens, what a token id is, and
which log probs trainer rows can hold.

Token ids index the vocabulary (integers 0 to `MAX_TOKEN_ID`, packed in one C pass); log
probs must be finite numbers float32 holds. Every check here is one or two C passes over a
list, never a Python loop per token, since a put checks every token it stores.
This module imports nothing beyond the standard library.
"""

from __future__ import annotations

import math
import struct
import sys
from array import array
from numbers import Integral
from typing import Any

REQUIRED_TOKEN_FIELDS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")
TOKEN_FIELDS = (*REQUIRED_TOKEN_FIELDS, "routed_experts")
TOKEN_ID_FIELDS = ("prompt_token_ids", "generation_token_ids")
FLOAT32_MAX = 3.4028234663852886e38
"""The largest magnitude a float32 holds. Trainer rows store log probs as float32, so a log
prob beyond it would become an infinity there: it is no finite log prob."""


def all_finite(values: list[float]) -> bool:
    """Whether every value is a finite number that float32 holds: no NaN, no infinity, no
    magnitude above `FLOAT32_MAX` (trainer rows store float32, where it would be an
    infinity), no integer beyond any float. A value too small for float32 becomes 0 or a
    subnormal there, a log prob of about 0 either way: it is finite.

    Two C passes: a NaN or infinity makes the sum non-finite (the sum is a float from its
    start, so integers too large for a float cannot cancel out unseen; a sum that overflows
    holds a value beyond float32), then packing as float32 refuses a finite value it would
    turn into an infinity. A value that is neither a float nor an integer (`None`, a string,
    a `Decimal`) raises `TypeError`."""
    try:
        if not math.isfinite(sum(values, 0.0)):
            return False
    except OverflowError:
        return False  # an integer beyond any float, or finite values beyond float32
    return float32_holds(values)


def float32_holds(values: list[float]) -> bool:
    """Whether float32 holds every one of these finite numbers without turning it into an
    infinity (one C pass: packing refuses a value that would overflow, as float32 rounds)."""
    try:
        struct.pack(f"<{len(values)}f", *values)
    except (OverflowError, struct.error):
        return False
    return True


MAX_TOKEN_ID = 2**63 - 1
"""The largest token id: trainer rows hold ids as int64."""
_SIGN_BYTE = 7 if sys.byteorder == "little" else 0


def token_id_array(values: Any) -> array | None:
    """A list of ids from 0 to `MAX_TOKEN_ID` as 64-bit integers, packed in one C pass that
    refuses anything else (a float, a string, `None`, a negative id: the array is unsigned,
    which packs about four times faster than a signed one), then one pass over each id's top
    byte for an id beyond int64; else `None`."""
    if not isinstance(values, list):
        return None
    packed = array("Q")
    try:
        packed.fromlist(values)
    except (TypeError, OverflowError):
        return None
    if not packed.tobytes()[_SIGN_BYTE::8].isascii():
        return None  # a top bit is set: an id beyond int64
    return packed


def are_token_ids(values: Any) -> bool:
    """Whether `values` is a list of token ids: integers from 0 to `MAX_TOKEN_ID` (ids index
    the vocabulary; trainer rows hold them as int64).

    One C pass (`token_id_array`) decides every list of plain ids; only a list it refuses is
    read value by value, for the integers it cannot pack (NumPy's unsigned ones). `bool` and
    NumPy integers count as the integers they are, as validation reads them.
    """
    if token_id_array(values) is not None:
        return True
    return isinstance(values, list) and all(
        isinstance(value, Integral) and 0 <= value <= MAX_TOKEN_ID for value in values
    )


def first_non_id(ids: Any) -> str:
    """What is wrong with a value that is not a list of token ids, for an error message."""
    if not isinstance(ids, list):
        return f"is a {type(ids).__name__}, not a list of token ids"
    for position, value in enumerate(ids):
        if isinstance(value, Integral) and value < 0:
            return f"holds {value!r} at position {position}, a negative id"
        if not isinstance(value, Integral) or value > MAX_TOKEN_ID:
            return f"holds {value!r} at position {position}, which is no token id"
    return "is not a list of token ids"
