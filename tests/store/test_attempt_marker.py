"""The dispatch-time clear's attempt marker: written once per clear, read by presence, no event.

On every backend (local disk, memory, S3 on moto): a freeze reports the marker, it leaves
versions and retirement as they were, and a drop removes it with the payloads. A directory
in neither layout that the clear marked is still NeMo Gym's once NeMo Gym writes there.
"""

from __future__ import annotations

import asyncio
import copy
import os

import pytest

from capture_core.builder.trace_envelope import ENVELOPE_KEY
from capture_core.consumer import clear_token_captures_for_rollouts
from capture_core.delivery import finalize_rollout_token_capture
from capture_core.run.capture_source import clear_captures
from capture_core.store import open_capture_store
from capture_core.store.nemo_gym_store import NemoGymFileStore
from capture_core.testing.synthetic import rollout_record
from capture_core.testing.trace_shapes import episode
from tests.support.attempts import write_mixed_attempts
from tests.support.reliability_figures import record_case
from tests.support.token_calls import token_call


def _call(rollout_id: str, call_id: str = "a") -> object:
    return token_call(call_id, [1, 2, 3], [4, 5], rollout_id=rollout_id)


def test_a_freeze_reports_the_marker_of_the_clear_and_only_then(store) -> None:
    store.put_now(_call("unmarked"))
    assert store.freeze_now("unmarked").attempt_marked is False
    assert clear_captures(store, ["marked"]) == 1
    store.put_now(_call("marked"))
    snapshot = store.freeze_now("marked")
    assert snapshot.attempt_marked is True
    assert (len(snapshot.entries), snapshot.version) == (1, 1), "the marker is no event"
    assert store.freeze_now("marked") == snapshot, "a repeated freeze is the same snapshot"


def test_the_marker_is_one_object_a_repeated_clear_keeps_and_a_drop_removes(store) -> None:
    clear_captures(store, ["r1", "r1"])
    assert store.byte_store.list_prefix("r1") == ["r1/ATTEMPT"]
    assert store.freeze_now("r1").entries == (), "a marked rollout without calls is empty"
    clear_captures(store, ["r1"])
    store.put_now(_call("r1"))
    snapshot = store.freeze_now("r1")
    assert store.drop_now("r1", snapshot.snapshot_id, snapshot.version)
    assert store.byte_store.list_prefix("r1") == ["r1/FROZEN", "r1/RETIRED"]
    store.delete("r1")
    assert store.byte_store.list_prefix("r1") == [], "a plain delete writes no marker"


@pytest.mark.integrity
def test_a_clear_before_nemo_gym_writes_leaves_the_directory_nemo_gyms(tmp_path) -> None:
    """The clear of an empty directory cannot know which layout will be written there: it
    marks the attempt. NeMo Gym's writer then takes the directory; it opens as NeMo Gym's
    file store (no mixed layouts), which keeps no marker, and its clear removes tokcap's."""
    root = str(tmp_path / "gym")
    os.mkdir(root)
    clear_token_captures_for_rollouts([{"_ng_rollout_id": "8-0"}], [root])
    assert os.listdir(root) == ["8-0"], "only the marker's folder, no .tmp"
    NemoGymFileStore(root).put_now(_call("8-0"))
    store = open_capture_store(root)
    assert isinstance(store, NemoGymFileStore)
    assert store.freeze_now("8-0").attempt_marked is False
    store.delete("8-0")
    assert not os.path.exists(os.path.join(root, "8-0"))
    record_case("a clear of an empty directory later used by NeMo Gym stays NeMo Gym's")


@pytest.mark.integrity
def test_mixed_attempts_in_nemo_gyms_file_store_mask_under_all_traces(tmp_path) -> None:
    """NeMo Gym's file store keeps no attempt marker: several traces there mask, one trains."""
    store = NemoGymFileStore(tmp_path)
    write_mixed_attempts(store, "8-1", shared_first_prompt=False)
    record = rollout_record(8, 1)
    built = asyncio.run(finalize_rollout_token_capture(record, store, delivery="all_traces"))
    assert built is not None and built["mask_sample"] is True and ENVELOPE_KEY not in record
    assert "dispatch-time clear" in built["error"] and "NeMo Gym" in built["error"]
    ep = episode(3, "plain", seed=5)
    clear_captures(store, [ep.rollout_id])
    for entry in ep.entries:
        store.put_now(entry)
    plain = copy.deepcopy(ep.record)
    built = asyncio.run(finalize_rollout_token_capture(plain, store, delivery="all_traces"))
    assert built is not None and built["mask_sample"] is False
    assert len(plain[ENVELOPE_KEY]["traces"]) == 1
    record_case("all_traces: mixed attempts in NeMo Gym's file store mask")


def test_a_clear_marks_exactly_its_ids(store) -> None:
    """A sibling id (a prefix of the cleared one) keeps its capture and gets no marker."""
    store.put_now(_call("3-4"))
    clear_captures(store, ["3-40"])
    assert store.byte_store.list_prefix("3-40") == ["3-40/ATTEMPT"]
    snapshot = store.freeze_now("3-4")
    assert snapshot.attempt_marked is False and len(snapshot.entries) == 1
