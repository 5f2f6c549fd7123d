"""Attacks on a run whose retirement failed: it stays incomplete until its captures retire.

A store that refuses every drop leaves a run with all batches handed off and no capture
retired. Status, the report and the inbox read the same ledger summary, so each must call
that run incomplete, and the next inbox pass (or `tokcap retire`) must finish it.
Flows run against the session's real Prefect server; S3 is a real moto server.
"""

from __future__ import annotations

import re

import pytest

from capture_core.operator.run_markdown import markdown_report
from capture_core.operator.run_report import summarize
from capture_core.operator.run_status import run_completed
from capture_core.run.inbox import run_id_for_file
from capture_core.run.run_layout import read_ledger
from capture_core.storage import open_byte_store
from capture_core.store import TokenCaptureStore
from tests.support.pipeline_helpers import (
    FAILING_DROP_SOURCE,
    ONE_DELETE_FAILS_SOURCE,
    locations_inbox,
    make_batch,
    write_rollouts,
)
from tests.support.reliability_figures import record_case
from tokcap.flows.cli.main import main
from tokcap.flows.finalize import RunFailedError, finalize_run, retire_uploaded
from tokcap.flows.inbox import InboxFailedError, finalize_inbox

pytestmark = [pytest.mark.integrity, pytest.mark.usefixtures("prefect_api")]


def failing_drops(locations: dict) -> dict:
    """`source_kwargs` that open the locations' store as a `FailingDropStore`."""
    return {"root": locations["store"], "storage_options": locations["options"]}


def status_exit(locations: dict, run_id: str, capsys: pytest.CaptureFixture) -> tuple[int, str]:
    """`tokcap status` in this process (it starts no server): exit code and output."""
    options = locations["options"] or {}
    extra = [f"--storage-option=endpoint_url={options['endpoint_url']}"] if options else []
    capsys.readouterr()
    code = main(["status", "--dest", locations["dest"], "--run-id", run_id, *extra])
    return code, capsys.readouterr().out


def captured(locations: dict, count: int) -> list[bool]:
    store = TokenCaptureStore(locations["store"], locations["options"])
    return [bool(store.read_entries(f"7-{i}")) for i in range(count)]


def test_a_failed_retirement_keeps_the_run_incomplete_until_retire(locations, capsys) -> None:
    options = locations["options"]
    records = make_batch(TokenCaptureStore(locations["store"], options), 4)
    write_rollouts(locations["rollouts"], records, options)
    with pytest.raises(RunFailedError, match="retirements failed"):
        finalize_run(
            locations["rollouts"],
            FAILING_DROP_SOURCE,
            locations["dest"],
            "unretired",
            batch_size=2,
            storage_options=options,
            source_kwargs=failing_drops(locations),
        )
    dest = open_byte_store(locations["dest"], options)
    ledger = read_ledger(dest, "unretired")
    summary = summarize("unretired", ledger)
    assert summary.handed_off == 4 and summary.retire_failed == 4 and not summary.ok
    assert "4 retirements failed" in markdown_report(summary, ledger, [], {})
    assert not run_completed(dest, "unretired"), "the inbox must not call it done"
    code, out = status_exit(locations, "unretired", capsys)
    assert code == 1 and re.search(r"^retirement failed\s+4$", out, re.M), out
    retire_uploaded(locations["dest"], "unretired", locations["store"], options)
    assert captured(locations, 4) == [False] * 4
    code, out = status_exit(locations, "unretired", capsys)
    assert code == 0, out
    assert run_completed(dest, "unretired")
    record_case("a run whose retirement failed reads as complete")


def test_the_next_inbox_pass_finishes_a_failed_retirement(locations) -> None:
    options = locations["options"]
    inbox = locations["inbox"]
    url = write_rollouts(
        f"{inbox}/a.jsonl", make_batch(TokenCaptureStore(locations["store"], options), 4), options
    )
    with pytest.raises(InboxFailedError, match="retirements failed"):
        failing = {"store": FAILING_DROP_SOURCE, "source_kwargs": failing_drops(locations)}
        finalize_inbox(locations_inbox(locations, batch_size=2, **failing))
    assert captured(locations, 4) == [True] * 4
    report = finalize_inbox(locations_inbox(locations, batch_size=2))
    assert report.finalized == [url] and report.already_done == []
    assert captured(locations, 4) == [False] * 4
    dest = open_byte_store(locations["dest"], options)
    assert run_completed(dest, run_id_for_file(url))
    record_case("an inbox pass skips a file whose retirement failed")


def test_a_store_that_refuses_every_retirement_is_reported_once_with_the_command_that_completes_it(
    tmp_path,
) -> None:
    store, dest = str(tmp_path / "store"), str(tmp_path / "dest")
    records = make_batch(TokenCaptureStore(store), 6)
    rollouts = write_rollouts(str(tmp_path / "in.jsonl"), records)
    with pytest.raises(RunFailedError) as failed:
        finalize_run(
            rollouts,
            FAILING_DROP_SOURCE,
            dest,
            "outage",
            batch_size=2,
            source_kwargs={"root": store},
        )
    retirement = [line for line in failed.value.failures if "retirement" in line]
    assert len(retirement) == 1, failed.value.failures
    assert retirement[0].startswith("batches 0-2: "), retirement
    message = str(failed.value)
    assert "6 handed-off rollouts left unretired" in message, message
    command = f"tokcap retire --dest {dest} --run-id outage --store {FAILING_DROP_SOURCE}"
    assert command in message and "--source-kwarg" in message, message
    ledger = read_ledger(open_byte_store(dest), "outage") or []
    report = markdown_report(summarize("outage", ledger), ledger, [], {})
    unretired = report.split("## Handed off, retirement failed (captures kept) (6)", 1)[1]
    rows = [row for row in unretired.split("\n\n")[1].splitlines() if row.startswith("|")]
    assert len(rows) == 3, "a header, a separator and one row for the one reason"
    assert "| 6 | 1-6 |" in rows[2], rows
    counts = retire_uploaded(dest, "outage", store)  # the store is back: the command completes it
    assert counts["retired"] == 6 and captured({"store": store, "options": None}, 6) == [False] * 6


@pytest.mark.integrity
def test_a_batch_retired_but_for_one_rollout_ledgers_the_others_retired(tmp_path) -> None:
    """One rollout's payloads cannot be deleted after its tombstone is durable: the run fails
    naming that one rollout, and the ledger keeps the other three as retired, not failed."""
    record_case("partly failed batch retirement")
    store, dest = str(tmp_path / "store"), str(tmp_path / "dest")
    records = make_batch(TokenCaptureStore(store), 4)
    rollouts = write_rollouts(str(tmp_path / "in.jsonl"), records)
    with pytest.raises(RunFailedError) as failed:
        finalize_run(
            rollouts, ONE_DELETE_FAILS_SOURCE, dest, "partly", source_kwargs={"root": store}
        )
    assert "1 handed-off rollout left unretired" in str(failed.value), str(failed.value)
    ledger = {line.rollout_id: line for line in read_ledger(open_byte_store(dest), "partly") or []}
    assert [rid for rid, line in ledger.items() if line.retired] == ["7-1", "7-2", "7-3"]
    assert "retirement failed" in (ledger["7-0"].error or ""), ledger["7-0"]
    assert summarize("partly", list(ledger.values())).retire_failed == 1
