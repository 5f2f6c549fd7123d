"""`RowStream`: every run of a destination, exactly once per consumer name, across ranks.

Runs land from a thread while the stream follows them (local disk and S3 through moto); a
reader SIGKILLed between read and acknowledgement gets the part again; two ranks read
disjoint parts; a change of `world_size` is refused until every rank is drained; the
stream's acknowledgements are the ones retirement after a consumer reads.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from capture_core.dataset import (
    AlreadyAcknowledgedError,
    PartMismatchError,
    RowConsumer,
    RowStream,
    WorldSizeChangedError,
)
from capture_core.rows.row_cursor import acknowledged_receipts, read_stored_receipt, receipt_keys
from capture_core.run.run_layout import RunLayout
from capture_core.storage import open_byte_store
from tests.support.pipeline_helpers import REPO
from tests.support.stream_runs import land_run

DEADLINE = 120.0


def stream(locations: dict, name: str = "trainer", **settings: object) -> RowStream:
    return RowStream(locations["dest"], name, storage_options=locations["options"], **settings)


def test_a_stream_follows_runs_as_they_land_and_resumes_what_was_not_acknowledged(
    locations,
) -> None:
    first = land_run(locations, "run-a", task=1)
    later: list[str] = []
    landing = threading.Thread(
        target=lambda: later.extend(
            land_run(locations, "run-b", task=2, rows="arrow")
            + land_run(locations, "run-c", task=3)
        )
    )
    reader = stream(locations, follow=True, poll_seconds=0.05)
    seen: list[tuple[str | None, str]] = []

    def read_six() -> None:
        for part in reader:
            seen.append((part.run_id, part.key))
            if len(seen) <= 5:  # the last part stays unacknowledged: a crash before its ack
                reader.ack(part.key)
            if len(seen) == 6:
                break

    reading = threading.Thread(target=read_six, daemon=True)  # a stream that misses a run
    landing.start()  # would follow forever: the test waits for it until a deadline only
    reading.start()
    reading.join(DEADLINE)
    landing.join(DEADLINE)
    assert not reading.is_alive(), f"the stream yielded {len(seen)} of 6 parts in {DEADLINE} s"
    for run_id, key in seen:
        assert key.startswith(f"{run_id}/rows/")
        assert key.endswith(".arrow" if run_id == "run-b" else ".parquet")
    assert [key for _, key in seen[:2]] == first, "run-a was there first, in batch order"
    assert sorted(key for _, key in seen) == sorted(first + later), "every part, once"
    for run in ("run-a", "run-b", "run-c"):
        keys = [key for run_id, key in seen if run_id == run]
        assert keys == sorted(keys), f"{run}'s parts in batch order"
    again = [part.key for part in stream(locations, follow=False)]
    assert again == [seen[5][1]], "a restart yields only the part never acknowledged"
    run_id, key = seen[0]
    with pytest.raises(AlreadyAcknowledgedError):  # the stream's ack is RowConsumer's own
        RowConsumer(locations["dest"], run_id or "", "trainer", locations["options"]).ack(key)
    other = [part.key for part in stream(locations, "other", follow=False)]
    assert sorted(other) == sorted(first + later), "another name reads every run anew"


def test_parts_come_in_handoff_order_not_claim_order_on_every_rank_and_restart(
    locations,
) -> None:
    first = land_run(locations, "handed-off-first", task=1)
    # Claimed an hour before the other run, handed off after it: a long-running run.
    late = land_run(locations, "claimed-first", task=2, started_at=time.time() - 3600)
    handoff_order = first + late
    assert [p.key for p in stream(locations, follow=False)] == handoff_order
    ranks = [stream(locations, "ranked", rank=r, world_size=2, follow=False) for r in (0, 1)]
    for reader in ranks:
        keys = [part.key for part in reader]
        assert keys == [k for k in handoff_order if k in keys], "each rank in handoff order"
    reader = stream(locations, follow=False)
    for part in reader:
        if part.key in late:
            reader.ack(part.key)
    assert [p.key for p in stream(locations, follow=False)] == first, "a restart: same order"


def test_two_ranks_read_disjoint_parts_and_a_world_size_change_waits_for_the_drain(
    locations,
) -> None:
    parts = land_run(locations, "r1", task=1, rollouts=6) + land_run(locations, "r2", task=2)
    ranks = [stream(locations, rank=r, world_size=2, follow=False) for r in (0, 1)]
    read = [[part.key for part in rank] for rank in ranks]
    assert read[0] and read[1], "both ranks get parts"
    assert set(read[0]).isdisjoint(read[1]) and sorted(read[0] + read[1]) == sorted(parts)
    again = [
        [part.key for part in stream(locations, rank=r, world_size=2, follow=False)] for r in (0, 1)
    ]
    assert again == read, "a part's rank is recorded: a restarted rank reads the same parts"
    for key in read[0]:
        ranks[0].ack(key)
    dest = open_byte_store(locations["dest"], locations["options"])
    acked = set()
    for run in ("r1", "r2"):
        layout = RunLayout(dest, run)
        receipts = [read_stored_receipt(layout, key) for key in receipt_keys(layout)]
        acked |= {r.rows.key for r in acknowledged_receipts(layout, "trainer", receipts) if r.rows}
    assert acked == set(read[0]), "rank 1 not reading holds back none of rank 0's batches"
    with pytest.raises(WorldSizeChangedError, match="world_size 2.*drain every rank"):
        list(stream(locations, follow=False))
    for key in read[1]:
        ranks[1].ack(key)
    assert [p.key for p in stream(locations, follow=False)] == [], "drained: size 1 accepted"
    new = land_run(locations, "r3", task=3)
    assert [p.key for p in stream(locations, follow=False)] == new


def test_acknowledgements_through_the_stream_are_the_ones_retirement_waits_for(
    locations,
) -> None:
    land_run(locations, "x1", task=1)
    land_run(locations, "x2", task=2)
    reader = stream(locations, follow=False)
    for part in reader:
        reader.ack(part.key)
    dest = open_byte_store(locations["dest"], locations["options"])
    for run in ("x1", "x2"):
        layout = RunLayout(dest, run)
        receipts = [read_stored_receipt(layout, key) for key in receipt_keys(layout)]
        assert acknowledged_receipts(layout, "trainer", receipts) == receipts
        assert list(RowConsumer(locations["dest"], run, "trainer", locations["options"])) == []


WORKER = [sys.executable, "-m", "tests.support.row_stream_worker"]


def test_a_stream_reader_killed_between_read_and_ack_gets_the_part_again(
    locations, tmp_path
) -> None:
    parts = land_run(locations, "k1", task=1) + land_run(locations, "k2", task=2)
    log = str(tmp_path / "stream.log")
    endpoint = (locations["options"] or {}).get("endpoint_url")
    args = [locations["dest"], "trainer", log, *([endpoint] if endpoint else [])]
    for crash in ({"TOKCAP_KILL_BETWEEN": "1"}, {}):
        env = {**os.environ, "PYTHONPATH": REPO, **crash}
        run = subprocess.run(
            [*WORKER, *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=120
        )
        assert run.returncode == (-9 if crash else 0), run.stderr
    with open(log) as f:
        lines = [line.split() for line in f.read().splitlines()]
    yielded = [key for word, *key in lines if word == "yield" for key in key]
    acked = [key for word, *key in lines if word == "acked" for key in key]
    assert yielded == [parts[0], *parts], "the killed read comes again first"
    assert acked == parts, "every part acknowledged exactly once, in stream order"


def test_a_part_its_receipt_does_not_vouch_for_is_never_yielded(locations) -> None:
    parts = land_run(locations, "t1", task=1)
    dest = open_byte_store(locations["dest"], locations["options"])
    dest.replace(parts[1], (dest.get(parts[1]) or b"")[:-1] + b"\0")
    reader = stream(locations, follow=False)
    yielded = []
    with pytest.raises(PartMismatchError, match=parts[1]):
        for part in reader:
            yielded.append(part.key)
    assert yielded == [parts[0]]


@pytest.mark.integrity
def test_a_part_that_does_not_verify_stops_the_stream_by_name_or_is_held_never_skipped(
    locations, caplog
) -> None:
    bad = land_run(locations, "h1", task=1)
    good = land_run(locations, "h2", task=2)
    dest = open_byte_store(locations["dest"], locations["options"])
    original = dest.get(bad[0]) or b""
    dest.replace(bad[0], original[:-1] + b"\0")
    with pytest.raises(PartMismatchError) as stopped:
        list(stream(locations, follow=False))
    message = str(stopped.value)
    for named in (bad[0], "run h1", "rank 0 of 1", "Restore", "on_unverified='hold'"):
        assert named in message, f"{named!r} missing from: {message}"
    reader = stream(locations, follow=False, on_unverified="hold")
    read = [part.key for part in reader]
    assert read == bad[1:] + good, "every other part, in handoff order; the bad one never"
    assert list(reader.held) == [bad[0]] and "sha256" in reader.held[bad[0]]
    assert any(bad[0] in r.getMessage() and r.levelname == "ERROR" for r in caplog.records)
    for key in read:
        reader.ack(key)
    assert reader.pending() == [bad[0]], "held, never acknowledged: its captures are kept"
    dest.replace(bad[0], original)
    again = stream(locations, follow=False, on_unverified="hold")
    assert [part.key for part in again] == [bad[0]] and again.held == {}, "restored: read"


@pytest.mark.integrity
def test_a_projection_reads_alike_on_parquet_and_arrow_runs(locations) -> None:
    """A stream over a Parquet run and an Arrow run gives every part the same columns for
    one projection (a column named twice once), and a misspelt column is refused by name
    on either, never dropped silently from the parts a trainer reads."""
    from capture_core.errors import InvalidInputError

    land_run(locations, "run-p", task=1)
    land_run(locations, "run-a", task=2, rows="arrow")
    parts = list(stream(locations, follow=False, columns=["token_ids", "loss_mask", "token_ids"]))
    assert {p.key.rsplit(".", 1)[-1] for p in parts} == {"parquet", "arrow"}
    assert {tuple(p.table.column_names) for p in parts} == {("token_ids", "loss_mask")}
    for run_id in ("run-p", "run-a"):
        one = RowConsumer(
            locations["dest"], run_id, "t", locations["options"], columns=["loss_masks"]
        )
        with pytest.raises(InvalidInputError, match="no column 'loss_masks'"):
            next(iter(one))
