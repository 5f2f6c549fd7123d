"""Attack: the record names its kept call explicitly, and that call is not in the capture.

The harness said which call was scored (`_ng_terminal_model_call_id`) and the capture lost it
before any intent was recorded. Delivering what is left (the strict chain, or the call the
content names) would credit the reward to a trajectory without the scored call: the rollout
masks with that reason and keeps its capture. Runs on local disk, memory and S3 (moto).
"""

from __future__ import annotations

import asyncio

import pytest

from capture_core.builder.build_result import TOKEN_CAPTURE_KEY
from capture_core.builder.terminal import TERMINAL_CALL_KEY, TerminalInputs
from capture_core.builder.terminal_witnesses import attribute_terminal
from capture_core.delivery import (
    capture_build_can_retire,
    finalize_rollout_token_capture,
    mask_reason,
    retire_rollout_token_capture,
)
from capture_core.store import TokenCaptureStore
from capture_core.testing.synthetic import RolloutShape, rollout_record, synthetic_rollout
from tests.support.reliability_figures import record_case

pytestmark = pytest.mark.integrity


def _record_naming_a_lost_call(with_content: bool) -> dict:
    """A record whose terminal is call-00002; with content, its response is call-00001's text."""
    record = rollout_record(3, 4)
    record[TERMINAL_CALL_KEY] = "call-00002"
    if with_content:
        record["response"]["output"][0]["content"][0]["text"] = "turn 1"
    return record


@pytest.mark.parametrize("with_content", [False, True], ids=["no-content", "content"])
def test_an_explicit_terminal_missing_from_the_capture_masks_and_keeps_it(
    store: TokenCaptureStore, with_content: bool
) -> None:
    for entry in synthetic_rollout("3-4", RolloutShape(turns=2)):
        store.put_now(entry)
    record = _record_naming_a_lost_call(with_content)
    built = asyncio.run(finalize_rollout_token_capture(record, store))
    assert built is not None
    delivered = not record.get("mask_sample")
    assert record.get("mask_sample") is True and built["mask_sample"] is True
    attribution = record[TOKEN_CAPTURE_KEY]["terminal_attribution"]
    assert attribution["call_id"] is None
    assert "explicit:explicit_terminal_not_captured" in attribution["reason"]
    assert "explicit_terminal_not_captured" in (mask_reason(built) or "")
    assert not capture_build_can_retire(built)
    assert not asyncio.run(retire_rollout_token_capture("3-4", store, built))
    kept = store.freeze_now("3-4")
    assert [e.model_call_id for e in kept.entries] == ["call-00000", "call-00001"]
    form = "with content" if with_content else "without content"
    record_case(
        f"explicit terminal not in the capture ({form}): masked, capture kept",
        wrong_tokens_delivered=int(delivered),
    )


def test_the_explicit_witness_stops_attribution_like_the_declared_one() -> None:
    entries = synthetic_rollout("3-4", RolloutShape(turns=2))
    verdict = attribute_terminal(entries, TerminalInputs(explicit_call_id="call-00002"))
    assert verdict.call_id is None and verdict.must_mask
    present = attribute_terminal(entries, TerminalInputs(explicit_call_id="call-00001"))
    assert (present.call_id, present.must_mask) == ("call-00001", False)
