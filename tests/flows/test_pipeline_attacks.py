"""Attacks on the pipeline: duplicated input, damaged receipts and parts, line splitting, caches.

Each test closes one attack case and records it for `bench/reliability_report.py`.
Flows run against the session's real Prefect server; S3 is a real moto server.
"""

from __future__ import annotations

import hashlib
import os

import orjson
import pytest

from capture_core.errors import is_transient
from capture_core.run.receipt import receipt_key
from capture_core.run.rollout_io import plan_rollout_file, read_batch
from capture_core.run.run_layout import read_ledger
from capture_core.storage import open_byte_store
from capture_core.store import TokenCaptureStore
from tests.support.pipeline_helpers import (
    FAILING_DROP_SOURCE,
    dest_records,
    finalize_args,
    finalize_locations,
    make_batch,
    receipt_args,
    rollout_ids,
    run_cli,
    write_rollouts,
)
from tests.support.reliability_figures import record_case
from tokcap.flows.finalize import RunFailedError, finalize_run, retire_uploaded
from tokcap.tasks.receipts import read_receipt

pytestmark = [pytest.mark.integrity, pytest.mark.usefixtures("prefect_api")]


def handed_off_not_retired(
    locations: dict, run_id: str, count: int = 4, masked: set[int] = frozenset()
) -> list[dict]:
    """Finalize `count` rollouts in batches of 2 with drops failing: receipts, no retirement."""
    options = locations["options"]
    records = make_batch(TokenCaptureStore(locations["store"], options), count, masked=masked)
    write_rollouts(locations["rollouts"], records, options)
    kwargs = {"root": locations["store"], "storage_options": options}
    with pytest.raises(RunFailedError, match="retirements failed"):
        finalize_run(
            locations["rollouts"],
            FAILING_DROP_SOURCE,
            locations["dest"],
            run_id,
            batch_size=2,
            storage_options=options,
            source_kwargs=kwargs,
        )
    return records


def finalized(locations: dict, run_id: str, count: int) -> None:
    """Capture `count` rollouts and finalize them in batches of 2: every capture retired."""
    options = locations["options"]
    records = make_batch(TokenCaptureStore(locations["store"], options), count)
    write_rollouts(locations["rollouts"], records, options)
    finalize_locations(locations, run_id, batch_size=2)


def captured(locations: dict, count: int = 4) -> list[bool]:
    store = TokenCaptureStore(locations["store"], locations["options"])
    return [bool(store.read_entries(f"7-{i}")) for i in range(count)]


def receipt_path(locations: dict, run_id: str, batch_index: int) -> str:
    batch = plan_rollout_file(locations["rollouts"], 2, locations["options"]).batches[batch_index]
    return f"{run_id}/receipts/{receipt_key(batch)}"


def overwrite(locations: dict, key: str, data: bytes | None) -> None:
    """Replace (or, with `None`, delete) a destination object behind the pipeline's back."""
    dest = open_byte_store(locations["dest"], locations["options"])
    if data is None:
        dest.delete([key])
    else:
        dest.replace(key, data)


# -- duplicate rollout ids --------------------------------------------------------------------


def test_duplicate_rollout_ids_are_input_errors_and_no_copy_is_finalized(locations) -> None:
    options = locations["options"]
    store = TokenCaptureStore(locations["store"], options)
    records = make_batch(store, 4)
    copies = [records[0], records[1], records[2], records[1], records[3], records[1]]
    write_rollouts(locations["rollouts"], copies, options)
    with pytest.raises(RunFailedError, match=r"rollout id 7-1 appears on lines 2, 4, 6"):
        finalize_locations(locations, "dup", batch_size=2)
    out = dest_records(locations["dest"], "dup", options)
    record_case(
        "duplicate rollout ids in one input file",
        records_lost=0 if store.read_entries("7-1") else 1,
        wrong_tokens_delivered=rollout_ids(out).count("7-1"),
    )
    assert rollout_ids(out) == ["7-0", "7-2", "7-3"], "no copy of 7-1 is delivered"
    ledger = read_ledger(open_byte_store(locations["dest"], options), "dup")
    by_line = {line.line: line for line in ledger}
    assert sorted(by_line) == [1, 2, 3, 4, 5, 6], "every copy is in the ledger"
    for line_no in (2, 4, 6):
        line = by_line[line_no]
        assert (line.rollout_id, line.handed_off, line.retired) == ("7-1", False, False)
        assert "lines 2, 4, 6" in (line.error or "")
    assert all(by_line[n].retired for n in (1, 3, 5))
    assert not any("FROZEN" in key for key in store.byte_store.list_prefix("7-1")), "not frozen"
    assert len(store.read_entries("7-1")) == 3, "its capture is kept"


def test_duplicate_rollout_ids_exit_the_cli_non_zero(tmp_path, prefect_api: str) -> None:
    store, dest = str(tmp_path / "store"), str(tmp_path / "dest")
    records = make_batch(TokenCaptureStore(store), 2)
    rollouts = write_rollouts(str(tmp_path / "in.jsonl"), [records[0], records[1], records[0]])
    done = run_cli(finalize_args(rollouts, store, dest, "dup-cli"), prefect_api)
    assert done.returncode == 1, done.stdout + done.stderr[-2000:]
    delivered = rollout_ids(dest_records(dest, "dup-cli"))
    record_case(
        "duplicate rollout ids in one input file", wrong_tokens_delivered=delivered.count("7-0")
    )
    assert "rollout id 7-0 appears on lines 1, 3" in done.stderr
    assert delivered == ["7-1"]


# -- line splitting ---------------------------------------------------------------------------


def test_bare_cr_inside_a_record_is_one_line_for_planner_and_reader(locations) -> None:
    options = locations["options"]
    first = b'{"_ng_rollout_id": "cr-0",\r"reward": 1.0}\n'
    second = b'{"_ng_rollout_id": "cr-1", "reward": 0.0}\r\n'
    write_rollouts(locations["rollouts"], [], options, extra_lines=[first, second])
    plan = plan_rollout_file(locations["rollouts"], 10, options)
    assert plan.rollouts == 2
    parsed = read_batch(locations["rollouts"], plan.batches[0], options)
    assert [(p.line, p.error, (p.record or {}).get("_ng_rollout_id")) for p in parsed] == [
        (1, None, "cr-0"),
        (2, None, "cr-1"),
    ]
    record_case("bare CR inside a valid JSON record")


def test_bare_cr_keeps_ledger_line_numbers(tmp_path) -> None:
    store, dest = str(tmp_path / "store"), str(tmp_path / "dest")
    records = make_batch(TokenCaptureStore(store), 2)
    with_cr = orjson.dumps(records[0]).replace(b", ", b",").replace(b",", b",\r", 1)
    rollouts = write_rollouts(
        str(tmp_path / "in.jsonl"), [], extra_lines=[with_cr + b"\n", orjson.dumps(records[1])]
    )
    summary = finalize_run(rollouts, store, dest, "cr", batch_size=5)
    record_case("bare CR inside a valid JSON record", records_lost=summary.malformed_lines)
    assert summary.ok and summary.malformed_lines == 0
    ledger = read_ledger(open_byte_store(dest), "cr")
    assert [(line.line, line.rollout_id, line.retired) for line in ledger] == [
        (1, "7-0", True),
        (2, "7-1", True),
    ]


# -- unreadable receipts ----------------------------------------------------------------------


@pytest.mark.parametrize("damage", [b"", b"\x00garbage", b'{"result": "trunc'])
def test_unreadable_receipt_is_a_loud_error_and_nothing_is_refinalized(
    locations, damage: bytes
) -> None:
    options = locations["options"]
    records = make_batch(TokenCaptureStore(locations["store"], options), 4)
    write_rollouts(locations["rollouts"], records, options)
    args = (locations["rollouts"], locations["store"], locations["dest"], "rcpt")
    finalize_run(*args, batch_size=2, storage_options=options)
    before = dest_records(locations["dest"], "rcpt", options)
    damaged = receipt_path(locations, "rcpt", 0)
    overwrite(locations, damaged, damage)
    with pytest.raises(
        Exception, match=rf"receipt .*{damaged.rsplit('/', 1)[-1]}.* cannot be read"
    ):
        finalize_run(*args, batch_size=2, storage_options=options)
    after = dest_records(locations["dest"], "rcpt", options)
    record_case("unreadable receipt", records_lost=sum(bool(r.get("mask_sample")) for r in after))
    assert after == before, "no part is replaced"
    assert not any(r.get("mask_sample") for r in before)
    with pytest.raises(Exception, match=rf"{damaged.rsplit('/', 1)[-1]}.* cannot be read"):
        retire_uploaded(locations["dest"], "rcpt", locations["store"], options)


def test_retire_with_an_unreadable_receipt_exits_non_zero(tmp_path, prefect_api: str) -> None:
    locations = {
        "store": str(tmp_path / "store"),
        "dest": str(tmp_path / "dest"),
        "rollouts": str(tmp_path / "in.jsonl"),
        "options": None,
    }
    handed_off_not_retired(locations, "rcpt-cli")
    damaged = receipt_path(locations, "rcpt-cli", 1)
    overwrite(locations, damaged, b"not a receipt")
    args = receipt_args("retire", locations["dest"], "rcpt-cli", locations["store"])
    done = run_cli(args, prefect_api)
    assert done.returncode == 1, done.stdout + done.stderr[-2000:]
    assert damaged.rsplit("/", 1)[-1] in done.stderr and "cannot be read" in done.stderr
    kept = captured(locations)
    record_case("unreadable receipt", records_lost=kept[2:].count(False))
    assert "captures retired" not in done.stdout
    assert kept == [True] * 4, "nothing retired on an unreadable receipt"


def test_transient_receipt_read_error_is_not_absent(tmp_path) -> None:
    dead = {"endpoint_url": "http://127.0.0.1:9"}
    with pytest.raises(Exception) as raised:
        read_receipt("s3://bucket/dest", "run", "batch-00000-0123456789abcdef", dead)
    assert is_transient(raised.value), f"{type(raised.value).__name__}: {raised.value}"
    record_case("transient receipt read error counted as absent")


def test_lost_receipt_conflict_never_advises_losing_records(tmp_path) -> None:
    store, dest = str(tmp_path / "store"), str(tmp_path / "dest")
    records = make_batch(TokenCaptureStore(store), 2)
    rollouts = write_rollouts(str(tmp_path / "in.jsonl"), records)
    finalize_run(rollouts, store, dest, "lost", batch_size=2)
    part = dest_records(dest, "lost")
    locations = {"rollouts": rollouts, "dest": dest, "options": None}
    overwrite(locations, receipt_path(locations, "lost", 0), None)
    with pytest.raises(RunFailedError, match="already exists with other content") as raised:
        finalize_run(rollouts, store, dest, "lost", batch_size=2)
    message = str(raised.value).lower()
    assert "move it away" not in message and "delete" not in message
    assert "keep it" in message
    after = dest_records(dest, "lost")
    record_case(
        "conflict advice that would replace handed-off records",
        records_lost=sum(bool(r.get("mask_sample")) for r in after),
    )
    assert after == part, "the handed-off part is never replaced"


# -- retire re-verifies the part --------------------------------------------------------------


@pytest.mark.parametrize("damage", ["deleted", "truncated", "edited"])
def test_retire_reverifies_the_part_before_dropping(locations, damage: str) -> None:
    handed_off_not_retired(locations, "part")
    options = locations["options"]
    dest = open_byte_store(locations["dest"], options)
    part_key = dest.list_prefix("part/records")[1]
    data = dest.get(part_key) or b""
    overwrite(
        locations,
        part_key,
        {"deleted": None, "truncated": data[: len(data) // 2], "edited": data.replace(b"7", b"8")}[
            damage
        ],
    )
    with pytest.raises(RunFailedError, match=rf"part .*{part_key.rsplit('/', 1)[-1]}") as raised:
        retire_uploaded(locations["dest"], "part", locations["store"], options)
    kept = captured(locations)
    record_case(f"retire after the part was {damage}", records_lost=kept[2:].count(False))
    assert "sha256" in str(raised.value) and hashlib.sha256(data).hexdigest()[:12] in str(
        raised.value
    )
    assert kept == [False, False, True, True], "the damaged batch keeps captures"
    ledger = read_ledger(dest, "part")
    assert [line.retired for line in ledger] == [True, True, False, False]


# -- retire cache keyed by store identity -----------------------------------------------------


def test_retire_against_another_store_claims_nothing(locations) -> None:
    options = locations["options"]
    finalized(locations, "cache", count=3)
    other = locations["store"] + "-other"
    if "://" not in other:
        os.makedirs(other)
    counts = retire_uploaded(locations["dest"], "cache", other, options)
    assert counts["retired"] == 0 and counts["retired_earlier"] == 0, counts
    again = retire_uploaded(locations["dest"], "cache", locations["store"], options)
    assert (again["retired"], again["retired_earlier"]) == (0, 3), again
    record_case("retire cache hit against another store")


def test_retire_against_the_same_store_spelled_differently_claims_no_new_work(
    locations,
) -> None:
    """`/x/store/` and `file:///x/store` are `/x/store`: the earlier retirement is reported."""
    options = locations["options"]
    finalized(locations, "spelled", count=3)
    spellings = [locations["store"] + "/"]
    if "://" not in locations["store"]:
        spellings.append("file://" + locations["store"])
    for spelled in spellings:
        again = retire_uploaded(locations["dest"], "spelled", spelled, options)
        assert (again["retired"], again["retired_earlier"]) == (0, 3), (spelled, again)
    record_case("retire against the same store spelled another way")


def test_retire_cli_against_another_store_prints_no_earlier_count(
    tmp_path, prefect_api: str
) -> None:
    store, dest = str(tmp_path / "store"), str(tmp_path / "dest")
    records = make_batch(TokenCaptureStore(store), 3)
    rollouts = write_rollouts(str(tmp_path / "in.jsonl"), records)
    done = run_cli(finalize_args(rollouts, store, dest, "cache-cli"), prefect_api)
    assert done.returncode == 0, done.stderr[-2000:]
    other = str(tmp_path / "other-store")
    os.makedirs(other)
    retire = run_cli(receipt_args("retire", dest, "cache-cli", other), prefect_api)
    assert retire.returncode == 0, retire.stderr[-2000:]
    record_case("retire cache hit against another store")
    assert "0 captures retired" in retire.stdout, retire.stdout
    assert "3 captures retired" not in retire.stdout
