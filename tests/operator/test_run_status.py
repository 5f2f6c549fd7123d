"""What `tokcap status` makes of a run's receipts, ledger and acknowledgements (no Prefect)."""

from __future__ import annotations

from capture_core.operator.run_report import RunSummary, summarize
from capture_core.operator.run_status import HandoffProgress, count_acknowledged, run_state
from capture_core.run.receipt import HandoffReceipt, RolloutOutcome
from capture_core.run.run_layout import LedgerLine


def progress(rollouts: int) -> HandoffProgress:
    return HandoffProgress(batches=2, batches_handed_off=1, rollouts_handed_off=rollouts)


def waiting(n: int, retired: bool = False) -> LedgerLine:
    return LedgerLine(
        rollout_id=f"r{n}", line=n, finalized=True, handed_off=True, retired=retired,
        awaiting_consumer=None if retired else "trainer",
    )  # fmt: skip


def test_no_ledger_or_receipts_beyond_it_is_a_started_run() -> None:
    ledger = summarize("run", [waiting(1, retired=True), waiting(2, retired=True)])
    assert run_state(None, progress(2), []) == "started"
    assert run_state(ledger, progress(3), []) == "started", "a later run handed off more"
    assert run_state(ledger, progress(2), []) == "ok"
    assert run_state(ledger, progress(2), ["receipt x cannot be read"]) == "failed"
    assert run_state(RunSummary(run_id="run", failed=1), progress(0), []) == "failed"


def test_captures_acknowledged_since_the_run_are_told_apart_from_those_waiting() -> None:
    ledger = [waiting(1), waiting(2), waiting(3), waiting(4, retired=True)]
    summary = summarize("run", ledger)
    assert summary.awaiting_consumer == 3
    acked = HandoffReceipt(
        run_id="run", batch=0, receipt_key="k", part_key="p", sha256="", bytes=0, records=2,
        rollouts=[RolloutOutcome(line=n, rollout_id=f"r{n}") for n in (1, 2)],
    )  # fmt: skip
    count_acknowledged(summary, ledger, [acked])
    assert (summary.acknowledged_unretired, summary.awaiting_consumer) == (2, 1)
    assert not summary.complete
