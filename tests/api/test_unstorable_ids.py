"""Attack: a rollout id NeMo Gym accepts but tokcap's stores cannot hold.

The identity functions return NeMo Gym's id; the store refuses it where it is stored, with
a reason that masks the rollout. Nothing raises out of a seed function. Runs on local disk,
memory and S3 (moto), and on NeMo Gym's own file store.
"""

from __future__ import annotations

import asyncio

import pytest

from capture_core.builder.build_result import TOKEN_CAPTURE_KEY
from capture_core.consumer import clear_token_captures_for_rollouts, trajectories_for_rollout
from capture_core.delivery import finalize_rollout_token_capture
from capture_core.ids import maybe_rollout_id_from_run_body
from capture_core.store.nemo_gym_store import NemoGymFileStore
from capture_core.testing.synthetic import RolloutShape, rollout_record, synthetic_rollout
from tests.support.reliability_figures import record_case

pytestmark = pytest.mark.integrity

LONG_ID = "job-" + "7" * 246


def _long_id_record() -> dict:
    record = rollout_record(3, 4)
    record["_ng_rollout_id"] = LONG_ID
    return record


def test_a_too_long_id_masks_the_rollout_with_the_store_s_reason(store) -> None:
    record = _long_id_record()
    assert maybe_rollout_id_from_run_body(record) == LONG_ID
    with pytest.raises(ValueError, match="at most 200 characters"):
        store.put_now(synthetic_rollout(LONG_ID, RolloutShape(turns=1))[0])
    built = asyncio.run(finalize_rollout_token_capture(record, store))
    assert built is not None and built["mask_sample"] is True
    assert built["rebuilt_response"] is None
    assert "at most 200 characters" in built["error"]
    assert record["mask_sample"] is True
    assert "at most 200 characters" in record[TOKEN_CAPTURE_KEY]["error"]
    record_case("rollout id too long for the store")


def test_a_too_long_id_in_nemo_gyms_file_store_masks(tmp_path) -> None:
    store = NemoGymFileStore(tmp_path)
    with pytest.raises(ValueError, match="at most 200 characters"):
        store.put_now(synthetic_rollout(LONG_ID, RolloutShape(turns=1))[0])
    record = _long_id_record()
    built = asyncio.run(finalize_rollout_token_capture(record, store))
    assert built is not None and built["mask_sample"] is True
    assert "at most 200 characters" in built["error"]
    assert not any(tmp_path.iterdir()), "nothing was written for the refused id"


def test_a_too_long_id_is_a_failed_build_and_a_named_clear_error(tmp_path) -> None:
    root = tmp_path / "store"
    built = trajectories_for_rollout(LONG_ID, [root])
    assert built is not None and built["mask_sample"] is True
    assert built["rebuilt_response"] is None and "at most 200 characters" in built["error"]
    with pytest.raises(ValueError, match="record 0: .*at most 200 characters"):
        clear_token_captures_for_rollouts([_long_id_record()], [root])
