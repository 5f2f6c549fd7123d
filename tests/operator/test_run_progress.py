"""The run's pure bookkeeping: mask gate, lookahead, tally, ledger and ledger diffs."""

from __future__ import annotations

from capture_core.operator.run_progress import (
    Lookahead,
    MaskGate,
    RunTally,
    ledger_changes,
    ledger_lines,
    retire_counts,
)
from capture_core.run.receipt import HandoffReceipt, RolloutOutcome
from capture_core.run.retirement import RetireOutcome
from capture_core.run.run_layout import LedgerLine


def outcome(line: int, masked: bool = False, can_retire: bool = True) -> RolloutOutcome:
    return RolloutOutcome(
        line=line,
        rollout_id=f"r{line}",
        masked=masked,
        mask_reason="capture incomplete: lost call" if masked else None,
        can_retire=can_retire and not masked,
    )


def receipt(*outcomes: RolloutOutcome, key: str = "k") -> HandoffReceipt:
    return HandoffReceipt(
        run_id="run", batch=0, receipt_key=key, part_key="p", sha256="", bytes=0,
        records=len(outcomes), rollouts=list(outcomes),
    )  # fmt: skip


def test_gate_waits_for_enough_samples() -> None:
    gate = MaskGate(0.5, min_samples=3)
    gate.add([outcome(1, masked=True), outcome(2, masked=True)])
    assert gate.exceeded() is None


def test_gate_trips_over_the_limit_naming_the_reasons() -> None:
    gate = MaskGate(0.5, min_samples=2)
    gate.add([outcome(1, masked=True), outcome(2, masked=True)])
    assert "masked fraction 2/2" in (gate.exceeded() or "")
    assert "reasons: lost call (2)." in (gate.exceeded() or "")


def test_gate_without_a_limit_never_trips() -> None:
    gate = MaskGate(None, min_samples=0)
    gate.add([outcome(1, masked=True)])
    assert gate.exceeded() is None


def test_a_tripped_gate_aborts_the_tally_and_fails_the_batch() -> None:
    tally = RunTally(run_id="r")
    assert not tally.may_hand_off(MaskGate(0.0, 1), 4, [outcome(1, masked=True)])
    assert tally.abort is not None and tally.failed[4][1].startswith("not handed off")
    assert tally.all_errors()[-1] == tally.abort


def test_lookahead_starts_at_most_ahead_items() -> None:
    started: list[int] = []
    ahead = Lookahead(range(5), lambda i: started.append(i) or i * 10, lambda i: i, 2)
    assert started == [0, 1]
    assert ahead.take(0) == 0 and started == [0, 1]
    ahead.refill()
    assert started == [0, 1, 2]


def test_a_stopped_lookahead_starts_nothing_more() -> None:
    started: list[int] = []
    ahead = Lookahead(range(5), started.append, lambda i: i, 2)
    ahead.stop()
    ahead.refill()
    assert started == [0, 1]


def test_the_ledger_marks_kept_captures_typed() -> None:
    tally = RunTally(run_id="r")
    retire = RetireOutcome(receipt_key="k", retired=["r1"], kept={"r2": "not retired: changed"})
    tally.retired(receipt(outcome(1), outcome(2)), retire)
    first, second = tally.ledger()
    assert (first.retired, first.kept, first.error) == (True, False, None)
    assert (second.retired, second.kept, second.error) == (False, True, "not retired: changed")


def test_the_ledger_lists_failed_batches_in_input_order() -> None:
    tally = RunTally(run_id="r")
    tally.batch_failed(1, [outcome(5)], "batch 1: upload failed: x")
    tally.retired(receipt(outcome(2)), RetireOutcome(receipt_key="k"))
    assert [(line.line, line.handed_off) for line in tally.ledger()] == [(2, True), (5, False)]
    assert tally.ledger()[1].error == "batch 1: upload failed: x"


def test_a_failed_retirement_fails_each_retirable_rollout() -> None:
    tally = RunTally(run_id="r")
    failed = tally.retire_failed(receipt(outcome(1), outcome(2, masked=True)), "boom")
    assert failed.failed == {"r1": "retirement failed: boom"}
    assert tally.errors == ["batch 0: retirement failed: boom"]


def test_retire_counts_split_now_earlier_and_kept() -> None:
    now = RetireOutcome(receipt_key="a", retired=["r1"])
    before = RetireOutcome(receipt_key="b", retired=["r2"], earlier=True)
    receipts = [receipt(outcome(1), outcome(3, masked=True)), receipt(outcome(2), key="b")]
    assert retire_counts(receipts, [now, before]) == {
        "receipts": 2, "retired": 1, "retired_earlier": 1, "kept": 1, "waiting": 0,
    }  # fmt: skip


def test_retire_counts_count_captures_waiting_for_a_consumer() -> None:
    waiting = RetireOutcome(receipt_key="a", waiting_for="trainer")
    receipts = [receipt(outcome(1), outcome(2), outcome(3, masked=True))]
    assert retire_counts(receipts, [waiting])["waiting"] == 2


def line(n: int, handed_off: bool, retired: bool = False, error: str | None = None) -> LedgerLine:
    return LedgerLine(
        rollout_id=f"r{n}", line=n, finalized=True, handed_off=handed_off, masked=False,
        retired=retired, error=error,
    )  # fmt: skip


def test_ledger_changes_name_what_a_rerun_completed() -> None:
    before = [line(1, False, error="upload failed"), line(2, True)]
    after = [line(1, True, retired=True), line(2, True, retired=True)]
    changes = ledger_changes("run", before, after)
    assert changes.newly_handed_off == ["r1"]
    assert changes.newly_retired == ["r1", "r2"]
    assert changes.still_failing == []


def test_ledger_changes_list_what_still_fails() -> None:
    changes = ledger_changes("run", [], [line(1, False, error="x"), line(2, True, error="kept")])
    assert changes.still_failing == ["r1", "r2"]


def test_ledger_changes_count_an_interrupted_runs_work_as_earlier() -> None:
    """A run killed before its ledger leaves none: what its receipts and retirements did is
    marked in the re-run's ledger (`earlier`, `retired_earlier`), never counted as new."""
    after = [
        line(1, True, retired=True).model_copy(update={"earlier": True, "retired_earlier": True}),
        line(2, True, retired=True).model_copy(update={"earlier": True}),
        line(3, True, retired=True),
    ]
    changes = ledger_changes("run", [], after)
    assert (changes.newly_handed_off, changes.newly_retired) == (["r3"], ["r2", "r3"])
    assert (changes.handed_off_earlier, changes.retired_earlier) == (2, 1)
    assert changes.describe() == (
        "1 newly handed off (2 by an earlier run), 2 newly retired (1 by an earlier run), "
        "0 still failing"
    )


def test_a_cached_retirement_is_marked_retired_earlier_in_the_ledger() -> None:
    earlier = RetireOutcome(receipt_key="a", retired=["r1"], earlier=True)
    now = RetireOutcome(receipt_key="b", retired=["r2"])
    receipts = [receipt(outcome(1), key="a"), receipt(outcome(2), key="b")]
    lines = ledger_lines(receipts, {"a": earlier, "b": now}, {}, earlier=["a"])
    assert [(x.rollout_id, x.earlier, x.retired_earlier) for x in lines] == [
        ("r1", True, True),
        ("r2", False, False),
    ]
