"""The one dispatch-time clear, on NeMo Gym's file store: exactly the given ids go.

A clear that took a sibling id (a prefix, a retry suffix) would delete a capture before
its handoff; one that missed an id would mix two attempts under one rollout id.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from capture_core.run.capture_source import clear_captures
from capture_core.store.nemo_gym_store import NemoGymFileStore
from tests.store.test_torn_puts import turns
from tests.support.reliability_figures import record_case

pytestmark = pytest.mark.integrity


def test_clear_on_the_file_store_removes_exactly_the_given_rollouts(tmp_path: Path) -> None:
    store = NemoGymFileStore(tmp_path)
    ids = ("3-4", "3-4-1", "3-40")
    for rollout_id in ids:
        for entry in turns(rollout_id, 2):
            store.put_now(entry)
    assert clear_captures(store, ["3-4"]) == 1
    left = {rid: len(store.read_entries(rid)) for rid in ids}
    record_case("dispatch clear on the NeMo Gym file store", records_lost=4 - sum(left.values()))
    assert left == {"3-4": 0, "3-4-1": 2, "3-40": 2}
    for entry in turns("3-4", 1):
        store.put_now(entry)
    assert len(store.read_entries("3-4")) == 1, "a cleared id takes a fresh attempt"
