"""Off-policy corrections from the rows: weight lag, truncated and masked importance sampling.

An asynchronous trainer corrects for stale samples with the ratio of its own log prob of a
token to the sampling one (`generation_logprobs`), rather than only by masking old
versions: truncated importance sampling weights each token by `min(ratio, cap)`; masked
importance sampling drops tokens whose ratio leaves `[low, high]`; decoupled PPO and
lag-aware schedules read each token's lag behind the trainer. Each helper is vectorized
over a part's flattened positions (numpy); the trainer's log probs are one flat float array
aligned with the rows' positions (row after row, as `token_ids` flattens). Positions outside
`loss_mask` get weight 0 and mask 0: they were not sampled, so no ratio exists there.
Staleness masking (`staleness_mask`) stays one policy beside these.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from capture_core.errors import InvalidInputError
from capture_core.rows.row_provenance import NO_WEIGHT_VERSION


def _flat(table: pa.Table, name: str) -> np.ndarray:
    if name not in table.column_names:
        raise InvalidInputError(
            f"the rows have no {name} column; read it (include {name!r} in `columns`)"
        )
    return table.column(name).combine_chunks().flatten().to_numpy(zero_copy_only=False)


def _aligned(table: pa.Table, logp_train: np.ndarray) -> np.ndarray:
    values = np.asarray(logp_train, dtype=np.float64).reshape(-1)
    positions = int(
        pa.compute.sum(pa.compute.list_value_length(table.column("loss_mask"))).as_py() or 0
    )
    if values.shape[0] != positions:
        raise InvalidInputError(
            f"logp_train holds {values.shape[0]} log probs for {positions} positions; give "
            "one per position of the rows, row after row (prompt positions included)"
        )
    return values


def weight_lag(table: pa.Table, current_weight_version: int) -> pa.Array:
    """Per position, `current_weight_version - weight_version`: how many updates behind
    the trainer the token was sampled (int32; null where the version is unknown, at prompt
    positions and for captures without versions). A flat array over the rows' positions."""
    versions = _flat(table, "weight_version").astype(np.int64)
    unknown = versions == NO_WEIGHT_VERSION
    lag = (current_weight_version - versions).astype(np.int32)
    return pa.array(lag, pa.int32(), mask=unknown)


def importance_ratio(table: pa.Table, logp_train: np.ndarray) -> np.ndarray:
    """Per position, `exp(logp_train - generation_logprobs)` at loss-mask positions, 0
    elsewhere (float64)."""
    values = _aligned(table, logp_train)
    sampled = _flat(table, "loss_mask") != 0
    behaviour = _flat(table, "generation_logprobs").astype(np.float64)
    ratio = np.zeros_like(values)
    ratio[sampled] = np.exp(values[sampled] - behaviour[sampled])
    return ratio


def truncated_importance_weights(table: pa.Table, logp_train: np.ndarray, cap: float) -> np.ndarray:
    """Truncated importance sampling: per position `min(exp(logp_train -
    generation_logprobs), cap)` at loss-mask positions, 0 elsewhere."""
    if not cap > 0:
        raise InvalidInputError(f"cap is {cap!r}; it must be above 0 (e.g. 2.0)")
    return np.minimum(importance_ratio(table, logp_train), cap)


def importance_mask(
    table: pa.Table, logp_train: np.ndarray, high: float, low: float = 0.0
) -> np.ndarray:
    """Masked importance sampling: per position 1 (int8) where the token is in `loss_mask`
    and its ratio lies within `[low, high]`, else 0. Tokens the trainer's policy has moved
    far from are dropped rather than down-weighted."""
    if not 0 <= low < high:
        raise InvalidInputError(f"bounds low={low!r}, high={high!r}; need 0 <= low < high")
    ratio = importance_ratio(table, logp_train)
    sampled = _flat(table, "loss_mask") != 0
    return (sampled & (ratio >= low) & (ratio <= high)).astype(np.int8)
