"""A mask gate that trips in the middle of a run, with later batches already finalizing.

Nothing after the abort may be handed off or retired; what was handed off before it is
retired as usual; and a re-run of the same run id produces the same records and ledger.
"""

from __future__ import annotations

import pytest

from capture_core.run.run_layout import read_ledger
from capture_core.storage import open_byte_store
from capture_core.store import TokenCaptureStore
from flows.finalize import RunFailedError, finalize_run
from tests.support.pipeline_helpers import dest_records, make_batch, rollout_ids, write_rollouts
from tests.support.reliability_figures import record_case

pytestmark = [pytest.mark.integrity, pytest.mark.usefixtures("prefect_api")]


def run_gated(rollouts: str, store: str, dest: str) -> None:
    with pytest.raises(RunFailedError, match="masked fraction 2/4 .* exceeds"):
        finalize_run(
            rollouts,
            store,
            dest,
            "gate-mid",
            batch_size=2,
            max_mask_fraction=0.3,
            mask_fraction_min_samples=3,
            finalize_ahead=2,
        )


def test_a_gate_tripping_mid_run_hands_off_and_retires_nothing_after_it(tmp_path) -> None:
    store_root, dest = str(tmp_path / "store"), str(tmp_path / "dest")
    records = make_batch(TokenCaptureStore(store_root), 8, masked={2, 3})
    rollouts = write_rollouts(str(tmp_path / "in.jsonl"), records)
    ids = rollout_ids(records)
    run_gated(rollouts, store_root, dest)
    first = (
        rollout_ids(dest_records(dest, "gate-mid")),
        read_ledger(open_byte_store(dest), "gate-mid"),
    )
    store = TokenCaptureStore(store_root)
    left = [rid for rid in ids if store.read_entries(rid)]
    record_case(
        "mask gate trips mid-run with batches finalizing ahead",
        records_lost=sum(1 for rid in ids[2:] if rid not in left),
    )
    assert first[0] == ids[:2], "only the batch before the abort is handed off"
    assert left == ids[2:], "the first batch retired; nothing from the abort on"
    assert [line.rollout_id for line in first[1] if line.handed_off] == ids[:2]
    assert not any(line.retired for line in first[1] if line.rollout_id in ids[2:])
    run_gated(rollouts, store_root, dest)
    again = (
        rollout_ids(dest_records(dest, "gate-mid")),
        read_ledger(open_byte_store(dest), "gate-mid"),
    )
    assert again[0] == first[0]
    assert [line.model_dump() for line in again[1]] == [line.model_dump() for line in first[1]]
    assert [rid for rid in ids if store.read_entries(rid)] == left
