"""run_index without a Prefect server: the runs of a destination, from small files only.

Runs are laid out with the run layer's own writers (manifest, ledger, summary, receipt
names) on every backend; `list_runs` reads them back.
"""

from __future__ import annotations

import pytest

from capture_core.operator.mask_reasons import kind_counts
from capture_core.operator.run_index import (
    COMPLETE,
    INCOMPLETE,
    INTERRUPTED,
    NOT_FINISHED,
    UNREADABLE,
    WAITING,
    list_runs,
    read_summary,
    record_summary,
    refresh_summary,
)
from capture_core.operator.run_report import summarize
from capture_core.run.receipt import retirement_key
from capture_core.run.run_layout import LedgerLine, RunLayout
from capture_core.storage import ByteStore, open_byte_store
from tests.support.claimed_runs import claimed_layout


@pytest.fixture()
def dest(store_location: tuple[str, dict]) -> ByteStore:
    root, options = store_location
    return open_byte_store(root, options)


def claim(dest: ByteStore, run_id: str, started_at: float | None, batches: int = 4) -> RunLayout:
    return claimed_layout(dest, run_id, batches=batches, started_at=started_at)


def line(n: int, **fields: object) -> LedgerLine:
    base = {"rollout_id": f"r{n}", "line": n, "finalized": True, "handed_off": True}
    return LedgerLine.model_validate({"masked": False, "retired": True, **base, **fields})


def finish(layout: RunLayout, ledger: list[LedgerLine], seconds: float, at: float) -> None:
    """What the report task does at the end of a run: the ledger, then its summary."""
    layout.write_ledger(ledger)
    record_summary(layout, summarize(layout.run_id, ledger), seconds=seconds, now=at)


MASKED = {"masked": True, "retired": False, "mask_reason": "capture incomplete: lost"}


def test_runs_are_listed_newest_first_with_state_counts_and_rate(dest: ByteStore) -> None:
    complete = claim(dest, "complete-run", started_at=100.0)
    finish(complete, [line(1), line(2, **MASKED), line(3), line(4)], seconds=2.0, at=200.0)
    waiting = claim(dest, "waiting-run", started_at=300.0)
    finish(waiting, [line(1, retired=False, awaiting_consumer="trainer")], seconds=1.0, at=310.0)
    failed = claim(dest, "failed-run", started_at=50.0)
    finish(failed, [line(1), line(2, handed_off=False, retired=False)], seconds=1.0, at=60.0)
    interrupted = claim(dest, "interrupted-run", started_at=400.0)
    for batch in ("batch-00000-" + "a" * 16, "batch-00001-" + "b" * 16):
        dest.create(interrupted.receipt_key(batch), b"{}")
    dest.create(interrupted.receipt_key(retirement_key("batch-00000-" + "a" * 16, "c" * 16)), b"1")
    claim(dest, "started-run", started_at=500.0)
    listing = list_runs(dest)
    rows = {row.run_id: row for row in listing.runs}
    order = ["started-run", "interrupted-run", "waiting-run", "complete-run", "failed-run"]
    assert [row.run_id for row in listing.runs] == order and listing.total == 5
    assert [rows[name].state for name in order] == [
        NOT_FINISHED,
        INTERRUPTED,
        WAITING,
        COMPLETE,
        INCOMPLETE,
    ]
    done = rows["complete-run"]
    assert (done.rollouts, done.masked, done.retired, done.complete) == (4, 1, 3, True)
    assert done.mask_rate == 0.25 and done.mask_reasons == {"lost call": 1}, "status's words"
    assert done.rollouts_per_second == 2.0 and done.updated_at == 200.0
    assert rows["waiting-run"].awaiting_consumer == 1
    assert rows["failed-run"].note == "1 rollout not handed off"
    stopped = rows["interrupted-run"]
    assert (stopped.batches_handed_off, stopped.batches_retired, stopped.batches) == (2, 1, 4)
    assert stopped.cells()["details"].startswith("2/4 batches handed off, 1 retired")
    assert rows["started-run"].batches_handed_off == 0
    assert rows["complete-run"].cells() == {
        "run id": "complete-run",
        "updated (UTC)": "1970-01-01 00:03:20",
        "state": "complete",
        "rollouts": "4",
        "masked": "1 (25.0%)",
        "retired": "3",
        "waiting": "0",
        "rollouts/s": "2.0",
        "details": "lost call (1)",
    }


def test_the_top_three_mask_reasons_are_the_most_frequent(dest: ByteStore) -> None:
    """Counted by kind, in the words `tokcap status` and the report use (`kind_counts`)."""
    layout = claim(dest, "reasons", started_at=1.0)
    counts = {
        "capture contains no token records": 1,
        "unresolved retries: r": 2,
        "capture incomplete: lost": 3,
        "recorded parents missing": 1,
        "terminal not attributable": 4,
        "something new": 3,
    }
    ledger = [
        line(n, **{**MASKED, "mask_reason": reason})
        for n, reason in enumerate(r for r, count in counts.items() for _ in range(count))
    ]
    finish(layout, ledger, seconds=1.0, at=2.0)
    (row,) = list_runs(dest).runs
    assert row.mask_reasons == {"lost call": 4, "scored call not found": 4, "other reason": 3}
    assert row.cells()["details"] == kind_counts(
        {"lost call": 4, "scored call not found": 4, "other reason": 3}
    )


def test_a_run_with_a_summary_is_listed_without_reading_its_ledger(dest: ByteStore) -> None:
    layout = claim(dest, "big", started_at=1.0)
    finish(layout, [line(1), line(2)], seconds=1.0, at=2.0)
    dest.replace(layout.ledger_key, b"not a ledger at all\n")
    (row,) = list_runs(dest).runs
    assert (row.state, row.rollouts, row.retired) == (COMPLETE, 2, 2)


def test_a_run_from_before_summaries_is_read_from_its_ledger(dest: ByteStore) -> None:
    layout = claim(dest, "old", started_at=None)
    layout.write_ledger([line(1), line(2, **MASKED)])
    claim(dest, "new", started_at=5.0)
    rows = list_runs(dest).runs
    assert [row.run_id for row in rows] == ["new", "old"], "a run of unknown time is last"
    assert (rows[1].state, rows[1].rollouts, rows[1].masked) == (COMPLETE, 2, 1)
    assert rows[1].cells()["updated (UTC)"] == "-"


def test_the_limit_keeps_the_newest_and_counts_them_all(dest: ByteStore) -> None:
    for n in range(4):
        claim(dest, f"run-{n}", started_at=float(n))
    listing = list_runs(dest, limit=2)
    assert [row.run_id for row in listing.runs] == ["run-3", "run-2"] and listing.total == 4


def test_an_unreadable_manifest_is_a_row_that_says_so_and_other_folders_are_no_runs(
    dest: ByteStore,
) -> None:
    dest.create("torn/run.json", b"{not json")
    dest.create("not-a-run/something.txt", b"x")
    (row,) = list_runs(dest).runs
    assert row.run_id == "torn" and row.state == UNREADABLE and "cannot be read" in row.note


def test_a_retirement_outside_a_run_updates_the_summary_and_keeps_the_rate(
    dest: ByteStore,
) -> None:
    layout = claim(dest, "later", started_at=1.0)
    finish(layout, [line(1, retired=False, awaiting_consumer="trainer")], seconds=4.0, at=2.0)
    layout.mark_retired(["r1"])
    refresh_summary(layout)
    found = read_summary(layout)
    assert found is not None and found.summary.retired == 1 and found.seconds == 4.0
    (row,) = list_runs(dest).runs
    assert row.state == COMPLETE and row.rollouts_per_second == 0.25


def test_an_empty_destination_has_no_runs(dest: ByteStore) -> None:
    listing = list_runs(dest)
    assert listing.runs == [] and listing.total == 0
