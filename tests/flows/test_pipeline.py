"""The Prefect flows on a real test server, with local and S3 (moto) stores and destinations."""

from __future__ import annotations

import os
import uuid

import orjson
import pytest

from capture_core.run.rollout_io import plan_rollout_file
from capture_core.run.run_layout import read_ledger
from capture_core.storage import open_byte_store
from capture_core.store import TokenCaptureStore
from tests.support.attempts import captured_keys
from tests.support.pipeline_helpers import (
    FAILING_DROP_SOURCE,
    dest_records,
    finalize_locations,
    make_batch,
    rollout_ids,
    write_rollouts,
)
from tokcap.flows.clear import dispatch_clear
from tokcap.flows.finalize import RunFailedError, finalize_run, retire_uploaded

pytestmark = pytest.mark.usefixtures("prefect_api")


def test_finalize_run_hands_off_every_rollout_and_retires_only_clean_ones(locations) -> None:
    options = locations["options"]
    store = TokenCaptureStore(locations["store"], options)
    records = make_batch(store, 7, masked={2, 5})
    write_rollouts(locations["rollouts"], records, options)
    summary = finalize_locations(locations, "run-1", batch_size=3)
    assert (summary.rollouts, summary.handed_off, summary.masked, summary.retired) == (7, 7, 2, 5)
    out = dest_records(locations["dest"], "run-1", options)
    assert rollout_ids(out) == [f"7-{i}" for i in range(7)], "one record per rollout, in order"
    for i, record in enumerate(out):
        assert record.get("mask_sample", False) is (i in {2, 5})
        assert record["reward"] == float(i % 2)
    for i in range(7):
        kept = store.byte_store.list_prefix(f"7-{i}")
        if i in {2, 5}:
            assert any("/e/" in key for key in kept), "masked rollouts keep their evidence"
        else:
            assert not any("/e/" in key for key in kept), "handed-off captures are retired"
    ledger = read_ledger(open_byte_store(locations["dest"], options), "run-1")
    assert [(line.rollout_id, line.handed_off, line.masked, line.retired) for line in ledger] == [
        (f"7-{i}", True, i in {2, 5}, i not in {2, 5}) for i in range(7)
    ]
    assert all(line.mask_reason for line in ledger if line.masked)


def test_rerun_after_success_changes_nothing(tmp_path) -> None:
    store_root, dest = str(tmp_path / "store"), str(tmp_path / "dest")
    records = make_batch(TokenCaptureStore(store_root), 5, masked={1})
    rollouts = write_rollouts(str(tmp_path / "in.jsonl"), records)
    finalize_run(rollouts, store_root, dest, "again", batch_size=2)
    parts = sorted(os.listdir(tmp_path / "dest" / "again" / "records"))
    before = dest_records(dest, "again")
    snapshot = {p: os.stat(tmp_path / "dest" / "again" / "records" / p).st_ino for p in parts}
    summary = finalize_run(rollouts, store_root, dest, "again", batch_size=2)
    assert summary.already_handed_off == 5 and summary.handed_off == 5 and summary.masked == 1
    assert sorted(os.listdir(tmp_path / "dest" / "again" / "records")) == parts
    assert {
        p: os.stat(tmp_path / "dest" / "again" / "records" / p).st_ino for p in parts
    } == snapshot
    assert dest_records(dest, "again") == before
    assert summary.retired == 4, "retired captures are reported, not retired twice"


def test_malformed_lines_and_records_without_ids(tmp_path) -> None:
    store_root, dest = str(tmp_path / "store"), str(tmp_path / "dest")
    records = make_batch(TokenCaptureStore(store_root), 2)
    rollouts = write_rollouts(
        str(tmp_path / "in.jsonl"),
        records,
        extra_lines=[b"{not json\n", b'{"reward": 0.5}\n', b"[1, 2]\n"],
    )
    with pytest.raises(RunFailedError, match="2 malformed input lines") as failed:
        finalize_run(rollouts, store_root, dest, "bad-lines", batch_size=10)
    summary = failed.value.summary
    assert summary.malformed_lines == 2 and summary.handed_off == 3 and not summary.ok
    ledger = read_ledger(open_byte_store(dest), "bad-lines")
    by_line = {line.line: line for line in ledger}
    assert by_line[3].error and f"{rollouts} line 3: malformed JSON" in by_line[3].error
    assert by_line[5].error and "line 5: not a JSON object" in by_line[5].error
    assert (
        by_line[4].handed_off and by_line[4].masked and by_line[4].mask_reason == "no capture key"
    )
    assert by_line[1].retired and by_line[2].retired, "the rest is processed"
    assert len(dest_records(dest, "bad-lines")) == 3


def test_unreachable_or_missing_locations_fail_before_any_work(tmp_path) -> None:
    rollouts = write_rollouts(str(tmp_path / "in.jsonl"), [{"_ng_rollout_id": "a"}])
    dest = str(tmp_path / "dest")
    with pytest.raises(FileNotFoundError, match="store root .* does not exist"):
        finalize_run(rollouts, str(tmp_path / "missing"), dest, "r1")
    dead = {"endpoint_url": "http://127.0.0.1:9"}
    with pytest.raises(Exception, match="unreachable"):
        finalize_run(rollouts, str(tmp_path), "s3://bucket/dest", "r1", storage_options=dead)
    assert not os.path.exists(dest), "nothing was written"


def test_existing_part_with_other_content_is_never_overwritten(tmp_path) -> None:
    store_root, dest = str(tmp_path / "store"), str(tmp_path / "dest")
    records = make_batch(TokenCaptureStore(store_root), 4)
    rollouts = write_rollouts(str(tmp_path / "in.jsonl"), records)
    batch = plan_rollout_file(rollouts, 2).batches[1]
    stale = f"conflict/records/part-00001-{batch.sha256[:16]}.jsonl"
    open_byte_store(dest).create(stale, b'{"stale": true}\n')
    with pytest.raises(RunFailedError, match="already exists with other content"):
        finalize_run(rollouts, store_root, dest, "conflict", batch_size=2)
    assert open_byte_store(dest).get(stale) == b'{"stale": true}\n'
    ledger = read_ledger(open_byte_store(dest), "conflict")
    assert [line.handed_off for line in ledger] == [True, True, False, False]
    assert not any(line.retired for line in ledger[2:]), "nothing retired without a receipt"
    assert len(TokenCaptureStore(store_root).read_entries("7-2")) == 3


def test_mask_fraction_limit_aborts_with_reasons(tmp_path) -> None:
    store_root, dest = str(tmp_path / "store"), str(tmp_path / "dest")
    records = make_batch(TokenCaptureStore(store_root), 6, masked={0, 1, 2, 3})
    rollouts = write_rollouts(str(tmp_path / "in.jsonl"), records)
    with pytest.raises(
        RunFailedError, match=r"masked fraction 3/3 .* exceeds.*several conversations \(3\)"
    ):
        finalize_run(
            rollouts,
            store_root,
            dest,
            "gate",
            batch_size=3,
            max_mask_fraction=0.5,
            mask_fraction_min_samples=3,
        )
    assert dest_records(dest, "gate") == []
    assert all(TokenCaptureStore(store_root).read_entries(f"7-{i}") for i in range(6))


def test_run_id_cannot_be_reused_for_other_input(tmp_path) -> None:
    store_root, dest = str(tmp_path / "store"), str(tmp_path / "dest")
    records = make_batch(TokenCaptureStore(store_root), 2)
    first = write_rollouts(str(tmp_path / "a.jsonl"), records[:1])
    second = write_rollouts(str(tmp_path / "b.jsonl"), records[1:])
    finalize_run(first, store_root, dest, "once")
    with pytest.raises(ValueError, match="was used for other input"):
        finalize_run(second, store_root, dest, "once")


def test_credentials_are_refused_as_flow_parameters(tmp_path) -> None:
    with pytest.raises(ValueError, match="look like credentials.*environment"):
        finalize_run(
            str(tmp_path / "x"),
            str(tmp_path),
            str(tmp_path),
            "r",
            storage_options={"key": "AKIA", "secret": "planted-secret"},
        )


def test_dispatch_clear_deletes_exactly_the_given_rollouts(locations) -> None:
    options = locations["options"]
    store = TokenCaptureStore(locations["store"], options)
    make_batch(store, 4)
    given = [
        {"_ng_task_index": 7, "_ng_rollout_index": 1},
        {"_ng_rollout_id": "7-3"},
        {"reward": 1.0},
    ]
    summary = dispatch_clear(given, locations["store"], options)
    assert (summary.cleared, summary.without_id, summary.malformed) == (2, 1, 0)
    assert [bool(captured_keys(store.byte_store, f"7-{i}")) for i in range(4)] == [
        True,
        False,
        True,
        False,
    ]
    write_rollouts(
        locations["rollouts"],
        [{"_ng_rollout_id": "7-0"}],
        options,
        extra_lines=[b'{"_ng_rollout_id": "../x"}\n'],
    )
    with pytest.raises(ValueError, match="1 rollout record\\(s\\) have malformed ids"):
        dispatch_clear(locations["rollouts"], locations["store"], options)
    assert not captured_keys(store.byte_store, "7-0"), "valid ids are still cleared"


def test_retire_uploaded_retires_exactly_what_receipts_allow(tmp_path) -> None:
    store_root, dest = str(tmp_path / "store"), str(tmp_path / "dest")
    records = make_batch(TokenCaptureStore(store_root), 4, masked={3})
    rollouts = write_rollouts(str(tmp_path / "in.jsonl"), records)
    with pytest.raises(RunFailedError, match="retirements failed, captures kept"):
        finalize_run(
            rollouts,
            FAILING_DROP_SOURCE,
            dest,
            "later",
            batch_size=2,
            source_kwargs={"root": store_root},
        )
    first = read_ledger(open_byte_store(dest), "later")
    assert [(line.handed_off, line.retired) for line in first] == [(True, False)] * 4
    assert all("retirement failed" in (line.error or "") for line in first[:3])
    counts = retire_uploaded(dest, "later", store_root)
    assert counts == {"receipts": 2, "retired": 3, "retired_earlier": 0, "kept": 1, "waiting": 0}, (
        "masked 7-3 is kept as evidence"
    )
    store = TokenCaptureStore(store_root)
    assert [bool(store.read_entries(f"7-{i}")) for i in range(4)] == [False, False, False, True]
    ledger = read_ledger(open_byte_store(dest), "later")
    assert [line.retired for line in ledger] == [True, True, True, False]


def test_memory_store_and_dest_in_process(tmp_path) -> None:
    root = f"memory://tokcap-{uuid.uuid4().hex[:8]}"
    records = make_batch(TokenCaptureStore(root + "/store"), 3)
    rollouts = write_rollouts(str(tmp_path / "in.jsonl"), records)
    summary = finalize_run(rollouts, root + "/store", root + "/dest", "mem", batch_size=2)
    assert summary.handed_off == 3 and summary.retired == 3
    assert orjson.loads(orjson.dumps(dest_records(root + "/dest", "mem")))[0]["reward"] == 0.0
