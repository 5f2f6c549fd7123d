"""A mask gate that trips in the middle of a run, with later batches already finalizing.

Nothing after the abort may be handed off or retired; what was handed off before it is
retired as usual; and a re-run of the same run id produces the same records and ledger (which
marks the batch the first run handed off as handed off earlier).
"""

from __future__ import annotations

import re

import pytest

from capture_core.operator.run_progress import MaskGate
from capture_core.run.receipt import RolloutOutcome
from capture_core.run.run_layout import read_ledger
from capture_core.storage import open_byte_store
from capture_core.store import TokenCaptureStore
from tests.support.pipeline_helpers import dest_records, make_batch, rollout_ids, write_rollouts
from tests.support.reliability_figures import record_case
from tokcap.flows.cli.checks import known_run
from tokcap.flows.finalize import RunFailedError, finalize_run

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
    same = {"exclude": {"earlier", "retired_earlier"}}
    assert [x.model_dump(**same) for x in again[1]] == [x.model_dump(**same) for x in first[1]]
    assert [x.rollout_id for x in again[1] if x.earlier] == ids[:2], "its first run handed them off"
    assert [x.rollout_id for x in again[1] if x.retired_earlier] == ids[:2], "and retired them"
    assert [rid for rid in ids if store.read_entries(rid)] == left


def test_a_gated_run_accounts_for_every_input_line_and_its_advice_completes_it(tmp_path) -> None:
    store_root, dest = str(tmp_path / "store"), str(tmp_path / "dest")
    records = make_batch(TokenCaptureStore(store_root), 10, masked={0})
    rollouts = write_rollouts(str(tmp_path / "in.jsonl"), records)
    gate = {"max_mask_fraction": 0.02, "mask_fraction_min_samples": 2}
    with pytest.raises(RunFailedError) as failed:
        finalize_run(rollouts, store_root, dest, "gate-all", batch_size=2, **gate)
    summary = failed.value.summary
    counts = (summary.rollouts, summary.handed_off, summary.gated, summary.not_started)
    assert counts == (10, 0, 2, 8), "every input line: gated, or never started"
    assert summary.failed == 0 and summary.malformed_lines == 0 and not summary.ok
    _manifest, status = known_run(dest, "gate-all", {})
    assert status is not None and (status.gated, status.not_started) == (2, 8)
    advice = str(failed.value)
    assert "fix the capture" not in advice
    assert "same run id" in advice and "--max-mask-fraction 0.5" in advice, advice
    again = finalize_run(
        rollouts, store_root, dest, "gate-all", batch_size=2, max_mask_fraction=0.5
    )
    assert (again.handed_off, again.masked, again.gated, again.not_started) == (10, 1, 0, 0)
    assert again.ok, "the advice completes the run"


def test_following_the_gate_advice_gets_the_whole_file_through(tmp_path) -> None:
    """The fraction rises after the gate trips (masks at rollouts 2, 6 and 7): the value that
    passes the tripping batch would trip again later, so the advice says so and names the
    value that gets every batch through."""
    store_root, dest = str(tmp_path / "store"), str(tmp_path / "dest")
    records = make_batch(TokenCaptureStore(store_root), 10, masked={2, 6, 7})
    rollouts = write_rollouts(str(tmp_path / "in.jsonl"), records)
    gate = {"max_mask_fraction": 0.2, "mask_fraction_min_samples": 2}
    with pytest.raises(RunFailedError) as failed:
        finalize_run(rollouts, store_root, dest, "gate-rises", batch_size=2, **gate)
    advice = str(failed.value)
    assert "masked fraction 1/4 = 0.250 exceeds max_mask_fraction 0.2 at batch 1" in advice
    assert "judged after every batch" in advice and "0.25 gets this run past batch 1 only" in advice
    whole = re.search(
        r"whole file through, finalize again with the same run id and "
        r"--max-mask-fraction ([0-9.]+)",
        advice,
    )
    assert whole is not None, advice
    again = finalize_run(
        rollouts, store_root, dest, "gate-rises", batch_size=2, max_mask_fraction=float(whole[1])
    )
    assert (again.handed_off, again.masked, again.gated, again.not_started) == (10, 3, 0, 0)
    assert again.ok, "the advice gets the whole file through"


def test_the_gate_advice_for_an_unresolved_retry_names_what_can_resolve_it() -> None:
    gate = MaskGate(0.0, 1)
    gate.add(
        [
            RolloutOutcome(
                line=1, rollout_id="r", masked=True, mask_reason="unresolved retries ['c2']"
            )
        ]
    )
    advice = gate.exceeded() or ""
    assert "fix the capture" not in advice
    assert "_ng_terminal_model_call_id" in advice and "new run id" in advice, advice


def test_the_advised_threshold_always_passes_the_gate_it_was_advised_for() -> None:
    """The advice rounds the masked fraction up to three decimals; the gate compares it
    exactly, so 29 of 100 advised 0.29 passes at 0.29 (in floats 0.29 * 100 < 29)."""
    masked_one = RolloutOutcome(line=1, rollout_id="r", masked=True)
    plain_one = RolloutOutcome(line=1, rollout_id="r")
    for seen in (50, 100, 137, 500):
        for masked in range(1, seen + 1):
            outcomes = [masked_one] * masked + [plain_one] * (seen - masked)
            gate = MaskGate(0.0, 1)
            gate.add(outcomes)
            advice = gate.exceeded()
            assert advice is not None
            advised = float(re.search(r"--max-mask-fraction ([0-9.]+)", advice).group(1))
            again = MaskGate(advised, 1)
            again.add(outcomes)
            assert again.exceeded() is None, (masked, seen, advised)
