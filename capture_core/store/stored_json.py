"""The one JSON encoding of everything tokcap stores: sorted keys, numpy arrays as lists.

Sorted keys make equal payloads byte-identical, so create-only writes can compare bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

ENCODE_OPTIONS = orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY


def encode_json(payload: Mapping[str, Any]) -> bytes:
    """A payload's canonical stored bytes."""
    return orjson.dumps(payload, option=ENCODE_OPTIONS)
