"""Staleness masking by the row consumer, on real runs: local disk and S3 (a moto server).

Calls carrying weight versions (one generation across a weight update, one call and one
rollout without any) are put through the store, finalized by the real flow with trainer
rows, and read back by `RowConsumer(..., current_weight_version=V, max_weight_lag=K)`:
every position's version is the captured one, `trainable_mask` is the rule for the trainer's
version when the part is yielded (it moves after each part), `stale_tokens` counts what it
masked, and the cursor, acks and retirement behave exactly as without it.
"""

from __future__ import annotations

import logging

import pytest

from capture_core.dataset import RowConsumer
from capture_core.errors import InvalidInputError
from capture_core.store import TokenCaptureStore
from capture_core.testing.synthetic import RolloutShape, rollout_record, synthetic_rollout
from tests.support.pipeline_helpers import dest_records, finalize_locations, write_rollouts
from tests.support.reliability_figures import record_case
from tests.support.weight_versions import expected_row_versions, rule, versioned_rollout
from tokcap.flows.finalize import retire_uploaded

pytestmark = [pytest.mark.usefixtures("prefect_api"), pytest.mark.integrity]

ROLLOUTS = 6
UNVERSIONED = 5
CURRENT, LAG = 6, 2


def capture(locations: dict) -> dict[str, list]:
    """Rollouts 7-0..7-5 of growing length and version; 7-5 carries no provenance."""
    store = TokenCaptureStore(locations["store"], locations["options"])
    entries = {}
    for i in range(ROLLOUTS):
        rollout_id = f"7-{i}"
        shape = RolloutShape(turns=2 + i, prompt_tokens=16, generated_tokens=6 + 3 * i)
        if i == UNVERSIONED:
            calls = synthetic_rollout(rollout_id, shape)
        else:
            calls = versioned_rollout(rollout_id, base=i, shape=shape, seed=i)
        for entry in calls:
            store.put_now(entry)
        entries[rollout_id] = calls
    return entries


def remaining(locations: dict) -> list[str]:
    store = TokenCaptureStore(locations["store"], locations["options"])
    return [f"7-{i}" for i in range(ROLLOUTS) if store.read_entries(f"7-{i}")]


@pytest.mark.parametrize("delivery", ["main_chain", "all_traces"])
def test_the_consumer_masks_stale_tokens_with_the_captured_versions(locations, delivery) -> None:
    options = locations["options"]
    entries = capture(locations)
    records = [rollout_record(7, i, reward=1.0) for i in range(ROLLOUTS)]
    write_rollouts(locations["rollouts"], records, options)
    run_id = f"stale-{delivery.replace('_', '-')}"
    settings = {"rows": "parquet", "delivery": delivery, "retire_after_consumer": "trainer"}
    finalize_locations(locations, run_id, batch_size=2, **settings)
    delivered = {
        f"7-{r['_ng_rollout_index']}": r for r in dest_records(locations["dest"], run_id, options)
    }
    assert all("token_provenance" in r for r in delivered.values())
    reader = RowConsumer(
        locations["dest"],
        run_id,
        "trainer",
        options,
        current_weight_version=CURRENT,
        max_weight_lag=LAG,
        unknown_version="mask",
    )
    plain = RowConsumer(locations["dest"], run_id, "plain", options)
    plain_parts = {part.key: part.table for part in plain}
    wrong, current = 0, CURRENT
    seen, reported = {"stale": 0, "unknown": 0}, {"stale": 0, "unknown": 0}
    for part in reader:
        assert part.table.drop_columns(["trainable_mask"]).equals(plain_parts[part.key])
        for row in part.table.to_pylist():
            record = delivered[row["rollout_id"]]
            versions = expected_row_versions(record, row, entries[row["rollout_id"]])
            expected = rule(row["loss_mask"], versions, current, LAG)
            wrong += row["weight_version"] != versions or row["trainable_mask"] != expected
            unknown = sum(m and v == -1 for m, v in zip(row["loss_mask"], versions, strict=True))
            seen["stale"] += sum(row["loss_mask"]) - sum(expected) - unknown
            seen["unknown"] += unknown
            if row["rollout_id"] == f"7-{UNVERSIONED}":
                assert not any(row["trainable_mask"]) and row["max_weight_version"] is None
        reported["stale"] += part.stale_tokens
        reported["unknown"] += part.unknown_version_tokens
        assert part.all_versions_unknown is False, "every part holds a versioned rollout"
        reader.ack(part.key)
        current += 1  # the trainer updated its weights: the next part is judged by the new V
        reader.current_weight_version = current
    assert wrong == 0 and seen == reported and min(seen.values()) > 0, (seen, reported)
    assert list(reader) == [] and reader.pending() == [], "acked parts are consumed"
    assert plain.pending(), "another name's cursor is its own"
    retire_uploaded(locations["dest"], run_id, locations["store"], options)
    assert remaining(locations) == [], "every delivered capture retires after its ack"
    record_case(f"the consumer masks stale tokens by their captured versions ({delivery})")


@pytest.mark.parametrize("delivery", ["main_chain", "all_traces"])
def test_tokens_of_unknown_version_are_counted_apart_and_follow_a_stated_policy(
    locations, delivery, caplog
) -> None:
    """Captures without versions (`tokcap make-inputs`' and NeMo Gym's writer's today): with
    staleness masking asked, the consumer refuses to guess what to do with them until told,
    then keeps or masks them as told, counts them apart from stale tokens, and reports each
    part whose trainable tokens are all of unknown version once, in the log and on the part."""
    options = locations["options"]
    shape = RolloutShape(turns=3, prompt_tokens=16, generated_tokens=5)
    store = TokenCaptureStore(locations["store"], options)
    for i in range(4):
        for entry in synthetic_rollout(f"7-{i}", shape):
            store.put_now(entry)
    write_rollouts(locations["rollouts"], [rollout_record(7, i) for i in range(4)], options)
    run_id = f"unversioned-{delivery.replace('_', '-')}"
    finalize_locations(locations, run_id, batch_size=2, rows="parquet", delivery=delivery)

    def reader(name: str, **policy: str) -> RowConsumer:
        return RowConsumer(
            locations["dest"],
            run_id,
            name,
            options,
            current_weight_version=10,
            max_weight_lag=2,
            **policy,
        )

    with pytest.raises(InvalidInputError, match="unknown_version='keep'.*unknown_version='mask'"):
        next(iter(reader("unstated")))
    assert reader("unstated").pending(), "nothing was yielded or acknowledged"
    caplog.set_level(logging.WARNING, logger="capture_core.dataset")
    seen = {}
    for policy in ("keep", "mask"):
        consumer = reader(policy, unknown_version=policy)
        for _ in range(2):  # a part yielded again (not acknowledged) is not reported again
            for part in consumer:
                loss = sum(map(sum, part.table.column("loss_mask").to_pylist()))
                trainable = sum(map(sum, part.table.column("trainable_mask").to_pylist()))
                assert loss > 0 and part.unknown_version_tokens == loss
                assert part.stale_tokens == 0, "unknown is not stale"
                assert part.all_versions_unknown is True
                assert trainable == (loss if policy == "keep" else 0)
                seen.setdefault(policy, []).append(part.key)
        reports = [r for r in caplog.records if r.name == "capture_core.dataset"]
        keys = sorted(set(seen[policy]))
        assert len(keys) == len(reports) == 2, [r.getMessage() for r in reports]
        named = sorted(k for r in reports for k in keys if k in r.getMessage())
        assert named == keys and all("unknown weight version" in r.getMessage() for r in reports)
        caplog.clear()
    assert len(seen["keep"]) == len(seen["mask"]) == 4
    record_case(f"rows without weight versions under staleness masking ({delivery})")
