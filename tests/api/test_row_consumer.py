"""Attacks on the trainer's side of the handoff: rows parts, the consumer and its cursor.

A run finalized with `rows="parquet"` writes one Parquet part per batch beside its JSONL
part, pinned by the same receipt. `RowConsumer` must never yield a part its receipt does
not verify, must acknowledge every part exactly once per name across SIGKILLs at any step,
and retirement after consumption must retire exactly what was acknowledged and verifies.
Flows run against the session's real Prefect server; S3 is a real moto server; consumers
that crash are real subprocesses.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys

import orjson
import pytest

from capture_core.dataset import AlreadyAcknowledgedError, PartMismatchError, RowConsumer
from capture_core.operator.run_status import run_completed
from capture_core.rows.row_cursor import ACK_CRASH_POINTS, read_stored_receipt, receipt_keys
from capture_core.rows.trainer_rows import read_rows
from capture_core.run.inbox import run_id_for_file
from capture_core.run.run_layout import RunLayout, read_ledger
from capture_core.storage import open_byte_store
from capture_core.store import TokenCaptureStore
from capture_core.testing.synthetic import VOCAB
from tests.api.test_finalized_input import carried_ids, made_up_envelope
from tests.support.pipeline_helpers import (
    REPO,
    dest_records,
    finalize_args_for,
    locations_inbox,
    make_batch,
    receipt_args,
    run_cli,
    write_rollouts,
)
from tests.support.reliability_figures import record_case
from tokcap.flows.cli.main import main
from tokcap.flows.finalize import RunFailedError, finalize_run, retire_uploaded
from tokcap.flows.inbox import finalize_inbox

pytestmark = [pytest.mark.usefixtures("prefect_api"), pytest.mark.integrity]

ROLLOUTS = 6
MASKED = {1}


def finalized(locations: dict, run_id: str, **settings: object) -> list[dict]:
    """Capture 6 rollouts (7-1 masked), finalize them in batches of 2 with trainer rows."""
    options = locations["options"]
    records = make_batch(TokenCaptureStore(locations["store"], options), ROLLOUTS, masked=MASKED)
    write_rollouts(locations["rollouts"], records, options)
    finalize_run(
        locations["rollouts"],
        locations["store"],
        locations["dest"],
        run_id,
        batch_size=2,
        storage_options=options,
        **{"rows": "parquet", **settings},
    )
    return records


def consumer(locations: dict, run_id: str, name: str = "trainer") -> RowConsumer:
    return RowConsumer(locations["dest"], run_id, name, storage_options=locations["options"])


def captured(locations: dict) -> list[str]:
    """The rollouts whose captures are still in the store."""
    store = TokenCaptureStore(locations["store"], locations["options"])
    return [f"7-{i}" for i in range(ROLLOUTS) if store.read_entries(f"7-{i}")]


def rows_keys(locations: dict, run_id: str) -> list[str]:
    return open_byte_store(locations["dest"], locations["options"]).list_prefix(f"{run_id}/rows")


@pytest.mark.parametrize("fmt", ["parquet", "arrow"])
def test_rows_parts_hold_exactly_the_delivered_tokens(locations, fmt) -> None:
    finalized(locations, "rows", rows=fmt)
    dest = open_byte_store(locations["dest"], locations["options"])
    layout = RunLayout(dest, "rows")
    receipts = [read_stored_receipt(layout, key) for key in receipt_keys(layout)]
    assert [r.batch for r in receipts] == [0, 1, 2]
    rows = []
    for receipt in receipts:
        assert receipt.rows is not None
        data = dest.get(receipt.rows.key) or b""
        assert receipt.rows.bytes == len(data)
        assert receipt.rows.sha256 == hashlib.sha256(data).hexdigest()
        assert receipt.rows.key.replace("/rows/", "/records/").replace(f".{fmt}", ".jsonl") == (
            receipt.part_key
        )
        rows += read_rows(data).to_pylist()
    tables = [read_rows(dest.get(r.rows.key) or b"") for r in receipts if r.rows is not None]
    single = RowConsumer(
        locations["dest"], "rows", "one-thread", locations["options"], use_threads=False
    )
    for reader in (consumer(locations, "rows"), single):
        assert [part.table for part in reader] == tables, "both decodings yield the part's rows"
    delivered = [r for r in dest_records(locations["dest"], "rows", locations["options"])]
    expected = {}
    for record in delivered:
        if record.get("mask_sample"):
            continue
        last = record["response"]["output"][-1]
        expected[f"{record['_ng_task_index']}-{record['_ng_rollout_index']}"] = (
            last["prompt_token_ids"] + last["generation_token_ids"]
        )
    assert [r["rollout_id"] for r in rows] == ["7-0", "7-2", "7-3", "7-4", "7-5"]
    assert {r["rollout_id"]: r["token_ids"] for r in rows} == expected
    assert all(len(r["loss_mask"]) == len(r["token_ids"]) for r in rows)
    assert all(r["loss_mask"][0] == 0 and sum(r["loss_mask"]) > 0 for r in rows)
    assert [r["reward"] for r in rows] == [0.0, 0.0, 1.0, 0.0, 1.0]
    assert {r["delivery"] for r in rows} == {"main_chain"}
    assert captured(locations) == ["7-1"], "delivered rollouts retire once both parts verify"
    record_case("trainer rows hold the delivered tokens and no masked rollout")


def test_all_traces_delivery_gives_one_row_per_trace_of_the_envelope(locations) -> None:
    finalized(locations, "traced", delivery="all_traces")
    dest = open_byte_store(locations["dest"], locations["options"])
    rows = [
        r
        for key in rows_keys(locations, "traced")
        for r in read_rows(dest.get(key) or b"").to_pylist()
    ]
    traces = {
        t["trace_id"]: t
        for record in dest_records(locations["dest"], "traced", locations["options"])
        for t in (record.get("training_traces") or {}).get("traces", [])
    }
    assert traces and {r["trace_id"] for r in rows} == set(traces)
    assert {r["delivery"] for r in rows} == {"all_traces"}
    for row in rows:
        assert row["token_ids"] == traces[row["trace_id"]]["token_ids"]
        assert row["loss_mask"] == traces[row["trace_id"]]["loss_mask"]
    record_case("trainer rows of multi-trace delivery")


@pytest.mark.parametrize("delivery", ["main_chain", "all_traces"])
def test_a_made_up_envelope_on_the_input_never_reaches_the_consumer(
    locations, delivery: str
) -> None:
    """Every input record arrives with an envelope of tokens never captured (7-3 also with
    sampled ids of its own): the consumer yields only what finalize built, and a capture is
    retired only once the rows it delivered were acknowledged."""
    options = locations["options"]
    records = make_batch(TokenCaptureStore(locations["store"], options), ROLLOUTS, masked=MASKED)
    records[3]["response"] = carried_ids()
    for record in records:
        rollout_id = f"7-{record['_ng_rollout_index']}"
        record["training_traces"] = made_up_envelope(rollout_id)
    write_rollouts(locations["rollouts"], records, options)
    run_id = f"made-up-{delivery.replace('_', '-')}"
    finalize_run(
        locations["rollouts"],
        locations["store"],
        locations["dest"],
        run_id,
        batch_size=2,
        storage_options=options,
        rows="parquet",
        delivery=delivery,
        retire_after_consumer="trainer",
    )
    rows = []
    reader = consumer(locations, run_id)
    for part in reader:
        rows += part.table.to_pylist()
        reader.ack(part.key)
    assert rows and all(max(row["token_ids"]) < VOCAB for row in rows), "no made-up token"
    assert not [row for row in rows if row["trace_id"].endswith(":made-up")]
    for record in dest_records(locations["dest"], run_id, options):
        envelope = record.get("training_traces")
        assert envelope is None or "made-up" not in orjson.dumps(envelope).decode()
        if delivery == "main_chain":
            assert envelope is None
    retire_uploaded(locations["dest"], run_id, locations["store"], options)
    delivered = {row["rollout_id"] for row in rows}
    assert set(captured(locations)) == {f"7-{i}" for i in range(ROLLOUTS)} - delivered
    record_case(f"a made-up envelope on the input never reaches the consumer ({delivery})")


@pytest.mark.parametrize("fmt", ["parquet", "arrow"])
def test_a_rows_part_edited_after_its_receipt_is_never_yielded(locations, fmt) -> None:
    finalized(locations, "edited", retire_after_consumer="trainer", rows=fmt)
    dest = open_byte_store(locations["dest"], locations["options"])
    edited = rows_keys(locations, "edited")[1]
    original = dest.get(edited) or b""
    dest.delete([edited])
    dest.create(edited, original[:-9] + b"X" * 9)
    reader = consumer(locations, "edited")
    seen = []
    with pytest.raises(PartMismatchError) as refused:
        for part in reader:
            seen.append(part.key)
            reader.ack(part.key)
    assert edited in str(refused.value) and "run edited" in str(refused.value)
    assert "not yielded" in str(refused.value)
    assert seen == [rows_keys(locations, "edited")[0]]
    single = RowConsumer(
        locations["dest"], "edited", "trainer", locations["options"], use_threads=False
    )
    with pytest.raises(PartMismatchError, match="not yielded"):
        next(iter(single))
    reader.ack(edited)  # a trainer that acknowledges without reading: retire still verifies
    with pytest.raises(RunFailedError, match="retirement failed"):
        retire_uploaded(
            locations["dest"], "edited", locations["store"], locations["options"]
        )  # batch 0 verifies and retires; batch 1 is acknowledged but does not verify
    assert captured(locations) == [f"7-{i}" for i in range(1, ROLLOUTS)]
    record_case("a rows part edited after its receipt is refused by the consumer")


EDITS = {
    "a byte in a data page": lambda b: b[:200] + bytes([b[200] ^ 0xFF]) + b[201:],
    "the footer": lambda b: b[:-9] + b"X" * 9,
    "truncated": lambda b: b[: len(b) // 2],
    "appended to": lambda b: b + b"\0",
    "zeroed pages": lambda b: b[:4] + bytes(len(b) - 1000) + b[-996:],
}


@pytest.mark.parametrize("fmt", ["parquet", "arrow"])
def test_a_part_is_refused_as_the_mismatch_whatever_was_edited(locations, fmt) -> None:
    """An edit that would still decode and one that would break decoding are both refused
    as the mismatch, in both decoding modes (on one thread bytes reach the decoder only once
    they verify; with threads what the decoder made of them, or raised, is discarded), and
    the restored part is yielded again. An Arrow part reaches its reader only verified."""
    finalized(locations, "edits", rows=fmt)
    dest = open_byte_store(locations["dest"], locations["options"])
    first = rows_keys(locations, "edits")[0]
    original = dest.get(first) or b""
    for what, edit in EDITS.items():
        dest.delete([first])
        dest.create(first, edit(original))
        for use_threads in (True, False):
            reader = RowConsumer(
                locations["dest"], "edits", "t", locations["options"], use_threads=use_threads
            )
            with pytest.raises(PartMismatchError, match="not yielded") as refused:
                next(iter(reader))
            assert first in str(refused.value), what
    dest.delete([first])
    dest.create(first, original)
    part = next(iter(consumer(locations, "edits")))
    assert part.key == first and part.table.num_rows == 1  # 7-1 of batch 0 is masked


@pytest.mark.integrity
def test_a_parquet_part_swapped_for_arrow_bytes_never_reaches_the_arrow_reader(
    locations, monkeypatch
) -> None:
    """A `.parquet` part whose bytes were replaced (same size) by ones that open as an Arrow
    file is refused as the mismatch, and the Arrow reader never sees them: a Parquet part
    is decoded beside its digest, which only Parquet's bounded decoder may be given."""
    from capture_core.rows import trainer_rows
    from capture_core.run import verified_read

    finalized(locations, "swapped")
    dest = open_byte_store(locations["dest"], locations["options"])
    first = rows_keys(locations, "swapped")[0]
    original = dest.get(first) or b""
    dest.delete([first])
    dest.create(first, trainer_rows.ARROW_MAGIC + original[len(trainer_rows.ARROW_MAGIC) :])
    monkeypatch.setattr(verified_read, "DIGEST_BESIDE_BYTES", 0)  # decode beside the digest
    reached: list[int] = []
    read_arrow = trainer_rows._read_arrow

    def spy(data: bytes, *args: object) -> object:
        reached.append(len(data))
        return read_arrow(data, *args)

    monkeypatch.setattr(trainer_rows, "_read_arrow", spy)
    for use_threads in (True, False):
        reader = RowConsumer(
            locations["dest"], "swapped", "t", locations["options"], use_threads=use_threads
        )
        with pytest.raises(PartMismatchError, match="not yielded"):
            next(iter(reader))
    assert reached == [], "unverified bytes reached the Arrow reader"


@pytest.mark.integrity
def test_an_ack_of_the_other_formats_key_acknowledges_nothing(locations) -> None:
    """Acknowledging `part-….arrow` of a run whose parts are `.parquet` (a key no consumer
    yielded) is refused by name and writes no acknowledgement: the ack object is shared by
    both suffixes, so accepting it would acknowledge (and let retire) a part never read."""
    from capture_core.errors import InvalidInputError

    finalized(locations, "suffix")
    reader = consumer(locations, "suffix")
    first = next(iter(reader)).key
    other = first.removesuffix(".parquet") + ".arrow"
    with pytest.raises(InvalidInputError, match="not a rows part of run suffix"):
        reader.ack(other)
    dest = open_byte_store(locations["dest"], locations["options"])
    assert dest.list_prefix("suffix/consumers") == []
    reader.ack(first)
    assert len(dest.list_prefix("suffix/consumers")) == 1


WORKER = [sys.executable, "-m", "tests.support.row_consumer_worker"]
LIFETIMES = [
    {"TOKCAP_KILL_BETWEEN": "1"},
    {"TOKCAP_CRASH_AT": "before-ack"},
    {"TOKCAP_CRASH_AT": "after-ack"},
    {"TOKCAP_KILL_BETWEEN": "1"},
    {"TOKCAP_CRASH_AT": "after-ack"},
    {},
]


def test_a_consumer_killed_at_every_step_acknowledges_each_part_exactly_once(
    locations, tmp_path
) -> None:
    assert {c["TOKCAP_CRASH_AT"] for c in LIFETIMES if "TOKCAP_CRASH_AT" in c} == set(
        ACK_CRASH_POINTS
    ), "every crash point of ack is exercised"
    finalized(locations, "crashes")
    parts = rows_keys(locations, "crashes")
    log = str(tmp_path / "consumer.log")
    endpoint = (locations["options"] or {}).get("endpoint_url")
    args = [locations["dest"], "crashes", "trainer", log, *([endpoint] if endpoint else [])]
    for crash in LIFETIMES:
        env = {**os.environ, "PYTHONPATH": REPO, **crash}
        run = subprocess.run(
            [*WORKER, *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=120
        )
        assert run.returncode == (0 if not crash else -9), run.stderr
    with open(log) as f:
        lines = [line.split() for line in f.read().splitlines()]
    lifetime, yielded, acked_by = "", [], {}
    for words in lines:
        if words[0] == "start":
            lifetime = words[1]
        elif words[0] == "yield":
            yielded.append((lifetime, words[1]))
    dest = open_byte_store(locations["dest"], locations["options"])
    acks = dest.list_prefix("crashes/consumers/trainer")
    assert len(acks) == len(parts) == 3
    for key in acks:
        ack = orjson.loads(dest.get(key) or b"")
        acked_by[ack["part"]] = ack["token"]
    assert sorted(acked_by) == parts
    order = [words[1] for words in lines if words[0] == "start"]
    for owner, part in yielded:
        assert order.index(owner) <= order.index(acked_by[part]), (
            f"{part} was yielded again after lifetime {acked_by[part]} acknowledged it"
        )
    assert lines[-1] == ["done"]
    assert len([w for w in lines if w[0] == "acked"]) == len(
        set(w[1] for w in lines if w[0] == "acked")
    )
    record_case("a row consumer SIGKILLed between yield and ack and inside ack")


def test_consumers_keep_separate_cursors_and_a_second_ack_is_refused(locations) -> None:
    finalized(locations, "cursors")
    parts = rows_keys(locations, "cursors")
    first = consumer(locations, "cursors")
    first_part = next(iter(first))
    first.ack(first_part.key)
    racing = consumer(locations, "cursors")
    with pytest.raises(AlreadyAcknowledgedError, match="already acknowledged"):
        racing.ack(first_part.key)
    assert [p.key for p in consumer(locations, "cursors")] == parts[1:]
    assert [p.key for p in consumer(locations, "cursors", "evaluator")] == parts
    with pytest.raises(ValueError, match="not a rows part"):
        first.ack("cursors/records/part-00000-0000000000000000.jsonl")
    record_case("a part acknowledged twice by one consumer name")


def status_text(locations: dict, run_id: str, capsys: pytest.CaptureFixture) -> str:
    """What `tokcap status` prints of the run (it must exit 0)."""
    options = locations["options"] or {}
    extra = [f"--storage-option=endpoint_url={options['endpoint_url']}"] if options else []
    capsys.readouterr()
    assert main(["status", "--dest", locations["dest"], "--run-id", run_id, *extra]) == 0
    return capsys.readouterr().out


def status_lines(locations: dict, run_id: str, capsys: pytest.CaptureFixture) -> list[str]:
    text = status_text(locations, run_id, capsys)
    return [line for line in text.splitlines() if line.startswith("consumer")]


def retire_command(locations: dict, run_id: str) -> str:
    """How `tokcap status` names the command that retires the run's acknowledged captures."""
    also = " (with the run's --storage-option values)" if locations["options"] else ""
    store, dest = locations["store"], locations["dest"]
    return f"tokcap retire --dest {dest} --run-id {run_id} --store {store}{also}"


@pytest.mark.parametrize("fmt", ["parquet", "arrow"])
def test_retirement_after_consumption_retires_exactly_the_acknowledged_batches(
    locations, capsys, fmt
) -> None:
    finalized(locations, "after", retire_after_consumer="trainer", rows=fmt)
    everything = [f"7-{i}" for i in range(ROLLOUTS)]
    assert captured(locations) == everything, "nothing is retired at handoff"
    assert status_lines(locations, "after", capsys) == [
        "consumer trainer: 0 of 3 rows parts acknowledged, 5 captures waiting for "
        "acknowledgement (retirement waits for it)"
    ]
    reader = consumer(locations, "after")
    first = next(iter(reader))
    retire_uploaded(locations["dest"], "after", locations["store"], locations["options"])
    assert captured(locations) == everything, "yielded is not acknowledged"
    reader.ack(first.key)
    retire_uploaded(locations["dest"], "after", locations["store"], locations["options"])
    assert captured(locations) == ["7-1", "7-2", "7-3", "7-4", "7-5"]
    dest = open_byte_store(locations["dest"], locations["options"])
    assert not run_completed(dest, "after")
    for part in reader:
        reader.ack(part.key)
    text = status_text(locations, "after", capsys)
    assert "consumer trainer: 3 of 3 rows parts acknowledged, 0 captures waiting" in text
    assert "retirement waiting for consumer" not in text, "the consumer acknowledged them all"
    assert re.search(r"^acknowledged, not retired yet\s+4$", text, re.M), text
    assert (
        "4 captures no longer wait for consumer trainer: it acknowledged their parts, and "
        f"nothing retires them until you run: {retire_command(locations, 'after')}" in text
    ), text
    retire_uploaded(locations["dest"], "after", locations["store"], locations["options"])
    assert captured(locations) == ["7-1"], "the masked rollout keeps its capture"
    text = status_text(locations, "after", capsys)
    assert "acknowledged, not retired yet" not in text and "tokcap retire" not in text, text
    ledger = read_ledger(dest, "after") or []
    assert [line.rollout_id for line in ledger if line.retired] == [
        "7-0",
        "7-2",
        "7-3",
        "7-4",
        "7-5",
    ]
    assert run_completed(dest, "after"), "every acknowledged capture is retired"
    record_case("captures retired before their rows were acknowledged")


def test_an_acknowledgement_of_other_bytes_retires_nothing(locations) -> None:
    finalized(locations, "forged", retire_after_consumer="trainer")
    dest = open_byte_store(locations["dest"], locations["options"])
    part = rows_keys(locations, "forged")[0]
    consumer(locations, "forged").ack(part)
    (ack_key,) = dest.list_prefix("forged/consumers/trainer")
    ack = orjson.loads(dest.get(ack_key) or b"")
    dest.delete([ack_key])
    dest.create(ack_key, orjson.dumps({**ack, "sha256": "0" * 64}))
    with pytest.raises(RunFailedError, match="acknowledges other bytes"):
        retire_uploaded(locations["dest"], "forged", locations["store"], locations["options"])
    assert captured(locations) == [f"7-{i}" for i in range(ROLLOUTS)]
    record_case("an acknowledgement edited to name other bytes")


@pytest.mark.parametrize("fmt", ["parquet", "arrow"])
def test_the_scheduled_inbox_pass_retires_what_the_consumer_acknowledged(
    locations, capsys, fmt
) -> None:
    options = locations["options"]
    records = make_batch(TokenCaptureStore(locations["store"], options), 4)
    inbox_file = write_rollouts(f"{locations['inbox']}/a.jsonl", records, options)
    settings = locations_inbox(locations, batch_size=2, rows=fmt, retire_after_consumer="trainer")
    finalize_inbox(settings)
    run_id = run_id_for_file(inbox_file)
    assert len(captured(locations)) == 4, "nothing retired before acknowledgement"
    reader = consumer(locations, run_id)
    first = next(iter(reader))
    reader.ack(first.key)
    text = status_text(locations, run_id, capsys)
    assert re.search(r"^retirement waiting for consumer\s+2$", text, re.M), text
    assert re.search(r"^acknowledged, not retired yet\s+2$", text, re.M), text
    assert (
        "2 captures no longer wait for consumer trainer: it acknowledged their parts. The "
        f"inbox's next pass retires them; to retire them now: {retire_command(locations, run_id)}"
        in text
    ), text
    report = finalize_inbox(settings)
    assert report.finalized == [inbox_file], "a run waiting for its consumer is not done"
    assert captured(locations) == ["7-2", "7-3"]
    for part in reader:
        reader.ack(part.key)
    finalize_inbox(settings)
    assert captured(locations) == []
    report = finalize_inbox(settings)
    assert report.already_done == [inbox_file]
    record_case("the inbox calls a run done while its consumer has not acknowledged it")


@pytest.mark.parametrize("fmt", ["parquet", "arrow"])
def test_tokcap_finalize_with_rows_then_retire_after_the_consumer(
    run_inputs, prefect_api, fmt
) -> None:
    run = ("--dest", run_inputs["dest"], "--run-id", "cli-rows")
    extra = ("--rows", fmt, "--retire-after-consumer", "trainer", "--batch-size", "2")
    done = run_cli(finalize_args_for(run_inputs, "cli-rows", *extra), prefect_api)
    assert done.returncode == 0, done.stderr
    assert re.search(r"^retirement waiting for consumer\s+3$", done.stdout, re.M), done.stdout
    reader = RowConsumer(run_inputs["dest"], "cli-rows", "trainer")
    first = next(iter(reader))
    assert first.key.endswith(f".{fmt}") and first.table.num_rows > 0
    reader.ack(first.key)
    status = run_cli(["status", *run], prefect_api)
    assert status.returncode == 0, status.stderr
    assert "consumer trainer: 1 of 2 rows parts acknowledged, 2 captures waiting" in status.stdout
    as_json = orjson.loads(run_cli(["status", *run, "--json"], prefect_api).stdout)
    assert as_json["consumers"] == [
        {"name": "trainer", "parts": 2, "acknowledged": 1, "captures_waiting": 2}
    ]
    summary = as_json["summary"]
    assert (summary["awaiting_consumer"], summary["acknowledged_unretired"]) == (2, 1)
    retired = run_cli([*receipt_args("retire", *run[1::2], run_inputs["store"])], prefect_api)
    assert retired.returncode == 0, retired.stderr
    assert "1 capture retired from 2 receipts" in retired.stdout, retired.stdout
    assert "2 waiting for the consumer's ack" in retired.stdout, retired.stdout


def test_the_cli_refuses_a_consumer_without_rows(run_inputs, capsys) -> None:
    args = ["finalize", "--rollouts", run_inputs["rollouts"], "--store", run_inputs["store"]]
    args += ["--dest", run_inputs["dest"], "--run-id", "r", "--retire-after-consumer", "t"]
    assert main(args) == 2
    assert "add --rows parquet" in capsys.readouterr().err
    assert main([*args[:-2], "--rows", "parquet", "--retire-after-consumer", "../x"]) == 2
    assert "consumer name" in capsys.readouterr().err
