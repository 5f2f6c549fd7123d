"""Attack: one token sequence split two ways between prompt and generation, beside a clean chain.

A later call extends both splits, so its parent is ambiguous and it is quarantined. NeMo Gym
then delivers the other split's chain unmasked, without that later call; tokcap refuses the
build (no rebuilt response, an error naming the call) and keeps the capture. Runs on local
disk, memory and S3 (moto) through `finalize_rollout_token_capture`.
"""

from __future__ import annotations

import asyncio

from capture_core.delivery import (
    TOKEN_CAPTURE_KEY,
    capture_build_can_retire,
    finalize_rollout_token_capture,
)
from capture_core.records import TokenEntry
from capture_core.testing.synthetic import rollout_record
from tests.reliability_figures import record_case


def _call(call_id: str, prompt: list[int], generation: list[int], created_at: float) -> TokenEntry:
    return TokenEntry(
        rollout_id="3-4",
        model_call_id=call_id,
        prompt_token_ids=prompt,
        generation_token_ids=generation,
        generation_log_probs=[-0.5] * len(generation),
        created_at=created_at,
    )


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
