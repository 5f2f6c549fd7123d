"""NeMo Gym's own file store, finalized, retired, cleared and swept in place.

The files are written by `tests.support.gym_file_writer`, an independent writer built from the
format's facts; nothing here writes them through `capture_core`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle

import orjson
import pytest

from capture_core.consumer import (
    clear_token_captures_for_rollouts,
    token_id_capture_dirs_from_config,
    trajectories_for_rollout,
)
from capture_core.delivery import (
    capture_build_can_retire,
    finalize_rollout_token_capture,
    retire_rollout_token_capture,
)
from capture_core.errors import (
    CaptureFencedError,
    CaptureRetiredError,
    InvalidRecordError,
    MixedLayoutError,
)
from capture_core.records import TokenEntry
from capture_core.rows.trainer_rows import record_rows
from capture_core.store import TokenCaptureStore
from capture_core.store.nemo_gym_store import NemoGymFileStore
from capture_core.testing.conformance import CHECKS, run_conformance
from capture_core.testing.contracts import CaptureStoreContract
from capture_core.testing.synthetic import rollout_record
from tests.support.gym_file_writer import GymWriter, GymWriterRefused, entry_payload
from tests.support.pipeline_helpers import (
    dest_records,
    finalize_args,
    receipt_args,
    run_cli,
    write_rollouts,
)
from tests.support.reliability_figures import record_case


def write_rollout(writer: GymWriter, rollout_id: str, calls: int = 3) -> list[dict]:
    payloads = [entry_payload(rollout_id, call) for call in range(calls)]
    for payload in payloads:
        writer.begin_call(rollout_id, payload["model_call_id"])
        writer.put(payload)
    return payloads


def tokcap_objects(root: str) -> list[str]:
    """Anything of tokcap's own layout: folders (rollout folders, `.tmp/`)."""
    return sorted(name for name in os.listdir(root) if os.path.isdir(os.path.join(root, name)))


@pytest.fixture()
def gym_dir(tmp_path) -> str:
    root = str(tmp_path / "gym-captures")
    write_rollout(GymWriter(root), "seed-0", calls=1)
    return root


def test_a_nemo_gym_directory_opens_as_its_file_store_with_a_log_line(gym_dir, caplog) -> None:
    with caplog.at_level(logging.INFO, logger="capture_core"):
        store = TokenCaptureStore(gym_dir)
    assert isinstance(store, NemoGymFileStore) and store.root == gym_dir
    assert "is NeMo Gym's file store" in caplog.text and gym_dir in caplog.text
    for form in (f"file://{gym_dir}", f"local://{gym_dir}"):
        assert isinstance(TokenCaptureStore(form), NemoGymFileStore)
    assert pickle.loads(pickle.dumps(store)) == store
    assert isinstance(TokenCaptureStore(os.path.dirname(gym_dir)), TokenCaptureStore)


def test_a_directory_with_both_layouts_is_refused(gym_dir, tmp_path) -> None:
    os.makedirs(os.path.join(gym_dir, "7-1", "e"))
    with pytest.raises(MixedLayoutError, match=r"both NeMo Gym's file-store files.*'7-1/'"):
        TokenCaptureStore(gym_dir)
    built = trajectories_for_rollout("seed-0", [gym_dir])
    assert built["mask_sample"] and "MixedLayoutError" in built["error"]
    ours = str(tmp_path / "tokcap")
    TokenCaptureStore(ours).begin_call_now("1-1", "c")
    GymWriter(ours).begin_call("1-2", "c")
    with pytest.raises(MixedLayoutError):
        TokenCaptureStore(ours)


def test_seed_api_finalizes_and_retires_in_place(gym_dir) -> None:
    writer = GymWriter(gym_dir)
    payloads = write_rollout(writer, "3-4")
    record = rollout_record(3, 4)
    built = asyncio.run(finalize_rollout_token_capture(record, TokenCaptureStore(gym_dir)))
    assert built["mask_sample"] is False and capture_build_can_retire(built)
    generated = [i["generation_token_ids"] for i in record["response"]["output"]]
    assert generated == [p["generation_token_ids"] for p in payloads]
    state = writer.state("3-4")
    assert state["frozen"] and state["snapshot_id"] == built["_capture_snapshot"]["snapshot_id"]
    with pytest.raises(GymWriterRefused):
        writer.put(entry_payload("3-4", 9))
    assert asyncio.run(retire_rollout_token_capture("3-4", TokenCaptureStore(gym_dir), built))
    left = sorted(n for n in os.listdir(gym_dir) if n.startswith("3-4."))
    assert left == ["3-4.tokens.lock", "3-4.tokens.state.json"], "the tombstone stays"
    assert writer.state("3-4")["retired"] is True
    with pytest.raises(GymWriterRefused):
        writer.put(entry_payload("3-4", 9))
    assert tokcap_objects(gym_dir) == [], "no object of tokcap's own layout"


def test_trajectories_for_rollout_reads_a_configured_gym_dir(gym_dir) -> None:
    write_rollout(GymWriter(gym_dir), "5-5", calls=2)
    config = {"token_id_capture": {"enabled": True, "dir": gym_dir}}
    built = trajectories_for_rollout("5-5", token_id_capture_dirs_from_config(config))
    assert built["mask_sample"] is False and built["metrics"]["n_calls"] == 2
    again = trajectories_for_rollout("5-5", [gym_dir])
    assert again["_capture_snapshot"] == built["_capture_snapshot"], "freeze is idempotent"
    assert tokcap_objects(gym_dir) == []


def test_lost_and_unfinished_calls_mask(gym_dir) -> None:
    writer = GymWriter(gym_dir)
    write_rollout(writer, "1-1")
    writer.mark_incomplete("1-1", "c0009")
    write_rollout(writer, "1-2")
    writer.begin_call("1-2", "never-finished")
    for rollout_id, reason in (("1-1", "'c0009' was lost"), ("1-2", "never captured")):
        snapshot = TokenCaptureStore(gym_dir).freeze_now(rollout_id)
        assert snapshot.incomplete and reason in snapshot.incomplete_reasons[0]
        built = trajectories_for_rollout(rollout_id, [gym_dir])
        assert built["mask_sample"] and built["metrics"]["capture_incomplete"] is True


def test_a_late_loss_changes_the_version_so_retirement_fails(gym_dir) -> None:
    write_rollout(GymWriter(gym_dir), "2-2")
    store = TokenCaptureStore(gym_dir)
    snapshot = store.freeze_now("2-2")
    GymWriter(gym_dir).mark_incomplete("2-2", "late")
    assert not store.drop_now("2-2", snapshot.snapshot_id, snapshot.version)
    assert len(store.read_entries("2-2")) == 3, "nothing deleted"
    assert store.freeze_now("2-2").incomplete


def test_clear_deletes_everything_but_the_lock_and_sweep_removes_tombstones(gym_dir) -> None:
    writer = GymWriter(gym_dir)
    write_rollout(writer, "8-0")
    writer.mark_incomplete("8-0", "x")
    write_rollout(writer, "8-1")
    clear_token_captures_for_rollouts([{"_ng_rollout_id": "8-0"}], [gym_dir])
    assert sorted(n for n in os.listdir(gym_dir) if n.startswith("8-0.")) == ["8-0.tokens.lock"]
    assert writer.state("8-0")["version"] == 0, "the id can be reused"
    store = TokenCaptureStore(gym_dir)
    snapshot = store.freeze_now("8-1")
    assert store.drop_now("8-1", snapshot.snapshot_id, snapshot.version)
    assert store.sweep_retired(3600) == 0
    assert store.sweep_retired(0) == 1
    assert not [n for n in os.listdir(gym_dir) if n.startswith("8-1.")]
    assert tokcap_objects(gym_dir) == []


def test_tokcap_writes_produce_nemo_gym_files_nemo_gym_reads(gym_dir) -> None:
    store = TokenCaptureStore(gym_dir)
    store.begin_call_now("6-6", "c0000")
    store.put_now(entry_payload("6-6", 0))
    store.put_now(entry_payload("6-6", 0))
    writer = GymWriter(gym_dir)
    writer.put(entry_payload("6-6", 1))
    with open(writer.path("6-6", "jsonl"), "rb") as f:
        lines = [orjson.loads(line) for line in f.read().splitlines()]
    assert [line["model_call_id"] for line in lines] == ["c0000", "c0001"]
    assert writer.state("6-6")["version"] == 2
    snapshot = store.freeze_now("6-6")
    assert not snapshot.incomplete and len(snapshot.entries) == 2
    with pytest.raises(CaptureFencedError):
        store.put_now(entry_payload("6-6", 2))
    assert store.drop_now("6-6", snapshot.snapshot_id, snapshot.version)
    with pytest.raises(CaptureRetiredError):
        store.mark_incomplete_now("6-6", "late")
    assert tokcap_objects(gym_dir) == []


def test_cli_clear_finalize_and_retire_on_a_gym_dir(gym_dir, tmp_path, prefect_api: str) -> None:
    writer = GymWriter(gym_dir)
    write_rollout(writer, "7-0", calls=5)
    records = [rollout_record(7, i) for i in range(4)]
    rollouts = write_rollouts(str(tmp_path / "in.jsonl"), records)
    cleared = run_cli(["clear", "--rollouts", rollouts, "--store", gym_dir], prefect_api)
    assert cleared.returncode == 0, cleared.stderr[-2000:]
    assert writer.state("7-0")["version"] == 0, "the stale attempt was cleared"
    payloads = {f"7-{i}": write_rollout(writer, f"7-{i}", calls=2 + i) for i in range(4)}
    writer.mark_incomplete("7-3", "c0009")
    dest = str(tmp_path / "dest")
    done = run_cli(finalize_args(rollouts, gym_dir, dest, "gym-1"), prefect_api)
    assert done.returncode == 0, done.stderr[-2000:]
    delivered = {
        f"7-{r['_ng_rollout_index']}": r
        for r in dest_records(dest, "gym-1")
        if not r.get("mask_sample")
    }
    assert sorted(delivered) == ["7-0", "7-1", "7-2"]
    for rollout_id, record in delivered.items():
        ids = [i["generation_token_ids"] for i in record["response"]["output"]]
        assert ids == [p["generation_token_ids"] for p in payloads[rollout_id]]
        assert writer.state(rollout_id)["retired"] is True
    assert writer.state("7-3")["retired"] is False and os.path.exists(writer.path("7-3", "jsonl"))
    again = run_cli(receipt_args("retire", dest, "gym-1", gym_dir), prefect_api)
    assert again.returncode == 0, again.stderr[-2000:]
    assert tokcap_objects(gym_dir) == [], "no object of tokcap's own layout"


def test_a_recognised_directory_that_gains_tokcap_folders_is_refused(gym_dir) -> None:
    assert isinstance(TokenCaptureStore(gym_dir), NemoGymFileStore)
    os.makedirs(os.path.join(gym_dir, "3-3", "x"))
    with pytest.raises(MixedLayoutError):
        TokenCaptureStore(gym_dir)


def test_the_nemo_gym_file_store_passes_the_capture_contract(gym_dir) -> None:
    passed = run_conformance(lambda: TokenCaptureStore(gym_dir), lambda: NemoGymFileStore(gym_dir))
    assert set(passed) == set(CHECKS)
    assert tokcap_objects(gym_dir) == []


class TestNemoGymFileStoreContract(CaptureStoreContract):
    """Each behaviour on its own: written through the tokcap sink, read by the Gym store."""

    @pytest.fixture(autouse=True)
    def _gym_dir(self, gym_dir: str):
        self.gym_dir = gym_dir
        yield
        assert tokcap_objects(gym_dir) == [], "no object of tokcap's own layout"

    def make_sink(self) -> TokenCaptureStore:
        return TokenCaptureStore(self.gym_dir)

    def make_source(self) -> NemoGymFileStore:
        return NemoGymFileStore(self.gym_dir)


def test_schema_zero_records_in_a_gym_dir_are_read(gym_dir) -> None:
    writer = GymWriter(gym_dir)
    for call in range(2):
        writer.put({**entry_payload("0-0", call), "schema_version": 0})
    snapshot = TokenCaptureStore(gym_dir).freeze_now("0-0")
    assert [e.schema_version for e in snapshot.entries] == [0, 0]
    built = trajectories_for_rollout("0-0", [gym_dir])
    assert built["mask_sample"] is False


@pytest.mark.integrity
@pytest.mark.parametrize("beyond", [-1e39, 1e39, -3.5e38])
def test_a_log_prob_beyond_float32_that_nemo_gym_stored_masks_the_rollout(
    gym_dir, beyond: float
) -> None:
    """NeMo Gym's writer accepts any float64; tokcap masks the rollout and keeps the capture."""
    writer = GymWriter(gym_dir)
    for call in range(2):
        payload = entry_payload("6-2", call)
        if call == 1:
            payload["generation_log_probs"] = [-0.5, beyond]
        writer.begin_call("6-2", payload["model_call_id"])
        writer.put(payload)
    record = rollout_record(6, 2)
    built = asyncio.run(finalize_rollout_token_capture(record, TokenCaptureStore(gym_dir)))
    assert record["mask_sample"] is True and not capture_build_can_retire(built)
    error = record["_ng_token_capture"]["error"]
    assert "line 2" in error and "generation_log_probs" in error and "float32" in error, error
    assert not record_rows(record, line=1), "a masked rollout has no trainer rows"
    assert not asyncio.run(retire_rollout_token_capture("6-2", TokenCaptureStore(gym_dir), built))
    assert os.path.exists(writer.path("6-2", "jsonl")), "the evidence is kept"
    record_case(f"NeMo Gym file store holding a log prob of {beyond:g}", wrong_tokens_delivered=0)


@pytest.mark.integrity
def test_a_put_through_nemo_gym_files_refuses_an_entry_changed_after_it_was_built(
    gym_dir,
) -> None:
    store = TokenCaptureStore(gym_dir)
    store.put_now(entry_payload("6-3", 0))
    changed = TokenEntry.model_validate(entry_payload("6-3", 1))
    changed.generation_token_ids.append(-100)
    changed.generation_log_probs.append(-0.5)
    with pytest.raises(InvalidRecordError, match="call 'c0001' was refused at put: generation_"):
        store.put_now(changed)
    writer = GymWriter(gym_dir)
    with open(writer.path("6-3", "jsonl"), "rb") as f:
        assert [orjson.loads(line)["model_call_id"] for line in f] == ["c0000"], "not stored"
    with open(writer.path("6-3", "incomplete"), "rb") as f:
        assert f.read() == b"c0001\n", "reported lost in NeMo Gym's own file"
    built = trajectories_for_rollout("6-3", [gym_dir])
    assert built["mask_sample"] and built["metrics"]["capture_incomplete"] is True
    record_case("entry changed after it was built, put through NeMo Gym's file store")


def test_store_subclasses_keep_their_own_signature(tmp_path) -> None:
    class Logged(TokenCaptureStore):
        def __init__(self, root: str, log: str) -> None:
            super().__init__(root)
            self.log = log

    store = Logged(str(tmp_path / "s"), log="x")
    assert type(store) is Logged and store.log == "x"
    assert isinstance(TokenCaptureStore(root=str(tmp_path / "s")), TokenCaptureStore)
