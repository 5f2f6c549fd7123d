"""Attack: calls with one token sequence next to a child that extends them all.

The child's parent is ambiguous, so it is quarantined. Split two ways between prompt and
generation beside a clean chain, NeMo Gym delivers the other split's chain unmasked, without
the child; tokcap refuses the build (no rebuilt response, an error naming the call) and keeps
the capture. Two identical calls (an ambiguous retry) leave no chain: an unusable build with
no rebuilt response. Runs on local disk, memory and S3 (moto).
"""

from __future__ import annotations

import asyncio

import pytest

from capture_core.builder.build_result import TOKEN_CAPTURE_KEY
from capture_core.consumer import trajectories_for_rollout, trajectories_from_source
from capture_core.delivery import capture_build_can_retire, finalize_rollout_token_capture
from capture_core.store import TokenCaptureStore
from capture_core.store.nemo_gym_store import NemoGymFileStore
from capture_core.testing.synthetic import rollout_record
from tests.support.build_result_cases import call as _call
from tests.support.reliability_figures import record_case

pytestmark = pytest.mark.integrity

SPLIT_BESIDE_A_CLEAN_CHAIN = [
    _call("call-r", [1, 2], [3], 0.5),
    _call("call-a", [1, 2, 3, 9], [4, 5], 1.0),
    _call("call-b", [1, 2, 3, 9, 4], [5], 2.0),
    _call("call-c", [1, 2, 3, 9, 4, 5, 6], [7], 3.0),
]


def test_an_ambiguous_call_is_never_dropped_from_a_delivered_chain(store) -> None:
    for entry in SPLIT_BESIDE_A_CLEAN_CHAIN:
        store.put_now(entry)
    record = rollout_record(3, 4)
    built = asyncio.run(finalize_rollout_token_capture(record, store))
    assert built is not None and built["mask_sample"] is True
    assert built["rebuilt_response"] is None
    assert "call-c" in built["error"] and "ambiguous" in built["error"]
    assert record["mask_sample"] is True and "call-c" in record[TOKEN_CAPTURE_KEY]["error"]
    assert not capture_build_can_retire(built), "the capture is kept as evidence"
    assert len(store.freeze_now("3-4").entries) == 4
    record_case("ambiguous parent beside an otherwise clean chain")


AMBIGUOUS_RETRY = [
    _call("call-a", [1, 2, 3], [4, 5], 1.0),
    _call("call-b", [1, 2, 3], [4, 5], 1.5),
    _call("call-c", [1, 2, 3, 4, 5, 6], [7], 3.0),
]


def test_an_ambiguous_retry_is_an_unusable_build_without_a_response(store, tmp_path) -> None:
    """The seed: an unusable build has no rebuilt response (here NeMo Gym's own error)."""
    for entry in AMBIGUOUS_RETRY:
        store.put_now(entry)
    built = asyncio.run(trajectories_from_source("3-4", store))
    assert built["mask_sample"] is True and built["rebuilt_response"] is None
    assert built["error"] == "ValueError: capture produced no safe trainable chain"
    for name, local in (("tokcap", TokenCaptureStore), ("gym", NemoGymFileStore)):
        (tmp_path / name).mkdir()
        for entry in AMBIGUOUS_RETRY:
            local(tmp_path / name).put_now(entry)
        again = trajectories_for_rollout("3-4", [tmp_path / name])
        assert again["rebuilt_response"] is None and again["error"] == built["error"]
    record_case("ambiguous retry next to a child")
