"""The corrections from the rows, each checked against a plain Python loop on real parts."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest

from capture_core.dataset import (
    RowConsumer,
    RowStream,
    importance_mask,
    truncated_importance_weights,
    weight_lag,
)
from capture_core.errors import InvalidInputError
from tests.support.stream_runs import land_run


@pytest.fixture()
def parts(tmp_path) -> list[pa.Table]:
    """Real rows parts of two runs, with versions set at their generated positions: part
    n's tokens alternate between versions n and n+1, every fifth one unknown."""
    where = {"store": str(tmp_path / "store"), "dest": str(tmp_path / "dest"), "options": None}
    where["rollouts"] = str(tmp_path / "in" / "rollouts.jsonl")
    land_run(where, "c1", task=1, rollouts=3)
    land_run(where, "c2", task=2, rollouts=2)
    plain = [p.table for p in RowStream(where["dest"], "plain", follow=False)]
    assert plain and all("weight_version" not in t.column_names for t in plain), (
        "weight_version is decoded only when masking or asked for"
    )
    projected = RowStream(where["dest"], "p", follow=False, columns=["token_ids", "reward"])
    assert {tuple(p.table.column_names) for p in projected} == {("token_ids", "reward")}
    one_run = RowConsumer(where["dest"], "c1", "p", columns=["token_ids", "reward"])
    whole = RowConsumer(where["dest"], "c1", "whole")
    for part, full in zip(one_run, whole, strict=True):  # RowConsumer projects the same way
        assert part.table.column_names == ["token_ids", "reward"]
        assert part.table.equals(full.table.select(["token_ids", "reward"]))
    tables = []
    wanted = ["token_ids", "generation_logprobs", "loss_mask", "weight_version"]
    for n, part in enumerate(RowStream(where["dest"], "t", follow=False, columns=wanted)):
        table = part.table
        loss = table.column("loss_mask").to_pylist()
        versions = [
            [(-1 if i % 5 == 0 else n + i % 2) if m else -1 for i, m in enumerate(row)]
            for row in loss
        ]
        column = pa.array(versions, table.schema.field("weight_version").type)
        index = table.column_names.index("weight_version")
        tables.append(table.set_column(index, "weight_version", column))
    assert len(tables) == 3
    return tables


def trainer_logprobs(table: pa.Table, seed: int) -> np.ndarray:
    """Made-up trainer log probs near the sampling ones, one per position."""
    behaviour = table.column("generation_logprobs").combine_chunks().flatten().to_numpy()
    rng = np.random.default_rng(seed)
    return behaviour + rng.normal(0, 0.7, behaviour.shape[0])


def rows_of(table: pa.Table, name: str) -> list[list]:
    return table.column(name).to_pylist()


def test_weight_lag_is_the_trainers_version_minus_each_tokens_null_where_unknown(parts) -> None:
    for table in parts:
        expected = [
            None if v == -1 else 7 - v for row in rows_of(table, "weight_version") for v in row
        ]
        assert weight_lag(table, 7).to_pylist() == expected
        assert any(v is None for v in expected) and any(v is not None for v in expected)


def test_truncated_weights_and_the_masked_variant_match_a_loop(parts) -> None:
    for seed, table in enumerate(parts):
        logp = trainer_logprobs(table, seed)
        flat_loss = [m for row in rows_of(table, "loss_mask") for m in row]
        flat_behaviour = [x for row in rows_of(table, "generation_logprobs") for x in row]
        weights, mask = [], []
        for m, train, behaviour in zip(flat_loss, logp, flat_behaviour, strict=True):
            ratio = math.exp(train - behaviour) if m else 0.0
            weights.append(min(ratio, 2.0) if m else 0.0)
            mask.append(1 if m and 0.5 <= ratio <= 2.0 else 0)
        got = truncated_importance_weights(table, logp, cap=2.0)
        assert np.allclose(got, weights, rtol=1e-6)
        assert importance_mask(table, logp, high=2.0, low=0.5).tolist() == mask
        assert 0 < sum(mask) < sum(flat_loss), "some tokens masked, some kept"


def test_log_probs_not_aligned_with_the_positions_are_refused(parts) -> None:
    logp = trainer_logprobs(parts[0], 0)
    with pytest.raises(InvalidInputError, match="one per position"):
        truncated_importance_weights(parts[0], logp[:-1], cap=2.0)
