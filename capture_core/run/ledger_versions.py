"""Each ledger line's weight-version figures, written by the batch path as it finalizes.

A delivered, unmasked record carries the `token_provenance` key beside its envelope; its
`versions` give the ledger line `weight_versions` ([min, max], or null when no generated
token's version is known), `weight_version_tokens` and `unknown_version_tokens`.
A record without the key gives none of them, so ledgers of such runs are unchanged.
The run's tally in words is an operator's view (`capture_core.operator.version_tally`).
This module does not import Prefect.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from capture_core.builder.token_provenance import TOKEN_PROVENANCE_KEY


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def version_figures(record: Mapping[str, Any], masked: bool) -> dict[str, Any]:
    """The ledger figures of one finalized record, from its `token_provenance` key's
    `versions`; none for a masked record or one without the key."""
    key = record.get(TOKEN_PROVENANCE_KEY)
    if masked or not isinstance(key, Mapping):
        return {}
    versions = key.get("versions")
    versions = versions if isinstance(versions, Mapping) else {}
    low, high = versions.get("min"), versions.get("max")
    tokens = versions.get("tokens")
    unknown = versions.get("unknown_tokens")
    return {
        "weight_versions": [low, high] if _count(low) and _count(high) else None,
        "weight_version_tokens": {
            str(v): n
            for v, n in (tokens.items() if isinstance(tokens, Mapping) else ())
            if _count(n) and str(v).isascii() and str(v).isdigit()
        },
        "unknown_version_tokens": unknown if _count(unknown) else 0,
    }
