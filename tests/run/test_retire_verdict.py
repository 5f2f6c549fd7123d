"""Attack: a receipt's `can_retire` is flipped on a rollout its verified part records as masked.

The receipt only pins the part's bytes; what may be retired is decided from the part's
records (there at the rollout's place, not masked, carrying token ids). A receipt that claims
more keeps those captures, and the disagreement is reported (the retire run fails naming
it). Library path on local disk, memory and S3 (moto); the `tokcap retire` flow and CLI
against a real Prefect server, on local disk and S3.
"""

from __future__ import annotations

import asyncio

import orjson
import pytest
from prefect.results import ResultRecord

from capture_core.delivery import rollout_carries_token_ids
from capture_core.run.batch_finalize import finalize_batch
from capture_core.run.finalize import plain_rollout_id
from capture_core.run.part_upload import handoff_batch
from capture_core.run.receipt import RECEIPT_KEY, HandoffReceipt
from capture_core.run.retire_verdict import _line_spans, skimmed_record
from capture_core.run.retirement import retire_receipt
from capture_core.run.rollout_io import BatchPlan, ParsedLine
from capture_core.storage import open_byte_store
from capture_core.store import TokenCaptureStore
from capture_core.testing.synthetic import RolloutShape, rollout_record, synthetic_rollout
from tests.support.reliability_figures import record_case

pytestmark = pytest.mark.integrity

MASKED = "7-1"


def _capture(store: TokenCaptureStore, count: int = 3) -> list[dict]:
    """Capture rollouts `7-i`; `7-1` gets an auxiliary call (two roots), so it masks."""
    records = []
    for i in range(count):
        shape = RolloutShape(turns=2, prompt_tokens=8, auxiliary_call=f"7-{i}" == MASKED)
        for entry in synthetic_rollout(f"7-{i}", shape):
            store.put_now(entry)
        records.append(rollout_record(7, i))
    return records


def _flipped(receipt: HandoffReceipt, rollout_id: str = MASKED) -> HandoffReceipt:
    """The receipt with `can_retire` (and nothing else) set on `rollout_id`."""
    rollouts = [
        r.model_copy(update={"can_retire": True}) if r.rollout_id == rollout_id else r
        for r in receipt.rollouts
    ]
    return receipt.model_copy(update={"rollouts": rollouts})


def _dest_root(store_location: tuple[str, dict]) -> str:
    root = store_location[0]
    return root.rsplit("/", 1)[0] + "/dest"


def _handed_off(store: TokenCaptureStore, dest_root: str, options: dict) -> HandoffReceipt:
    records = _capture(store)
    lines = [ParsedLine(line=i + 1, record=r) for i, r in enumerate(records)]
    plan = BatchPlan(index=0, start=0, end=1, first_line=1, lines=len(lines), sha256="0" * 64)
    finalized = asyncio.run(finalize_batch("run", plan, lines, store))
    return handoff_batch("run", finalized, open_byte_store(dest_root, options))


def test_a_flipped_can_retire_keeps_the_masked_capture(store_location) -> None:
    root, options = store_location
    store = TokenCaptureStore(root, options)
    dest_root = _dest_root(store_location)
    receipt = _handed_off(store, dest_root, options)
    masked = next(r for r in receipt.rollouts if r.rollout_id == MASKED)
    assert masked.masked and not masked.can_retire and masked.snapshot_id is not None
    dest = open_byte_store(dest_root, options)
    outcome = asyncio.run(retire_receipt(_flipped(receipt), store, dest))
    kept = bool(store.read_entries(MASKED))
    assert kept, "the masked rollout's capture survives"
    assert sorted(outcome.retired) == ["7-0", "7-2"], "what the part permits is retired"
    assert "mask_sample: true" in outcome.disagreed[MASKED]
    record_case(
        "receipt can_retire flipped on a masked rollout (library)", records_lost=int(not kept)
    )


@pytest.mark.parametrize("edit", ["masked", "without tokens", "another rollout"])
def test_a_part_record_that_does_not_permit_it_keeps_the_capture(tmp_path, edit: str) -> None:
    store = TokenCaptureStore(str(tmp_path / "store"))
    records = _capture(store, count=1)
    plan = BatchPlan(index=0, start=0, end=1, first_line=1, lines=1, sha256="0" * 64)
    finalized = asyncio.run(
        finalize_batch("run", plan, [ParsedLine(line=1, record=records[0])], store)
    )
    assert finalized.outcomes[0].can_retire
    record = orjson.loads(finalized.part)
    if edit == "masked":
        record["mask_sample"] = True
    elif edit == "without tokens":
        record["response"]["output"] = [{"type": "message", "content": []}]
    else:
        record["_ng_rollout_index"] = 9
    finalized = finalized.model_copy(update={"part": orjson.dumps(record) + b"\n"})
    dest = open_byte_store(str(tmp_path / "dest"))
    receipt = handoff_batch("run", finalized, dest)
    outcome = asyncio.run(retire_receipt(receipt, store, dest))
    assert outcome.retired == [] and "7-0" in outcome.disagreed
    assert store.read_entries("7-0"), "kept"


# -- the `tokcap retire` path -------------------------------------------------------------------


def _write_flipped_receipts(locations: dict, run_id: str) -> None:
    """Flip `can_retire` of the masked rollout in the persisted receipts, behind tokcap's back."""
    dest = open_byte_store(locations["dest"], locations["options"])
    for key in dest.list_prefix(f"{run_id}/receipts"):
        if RECEIPT_KEY.fullmatch(key.rsplit("/", 1)[-1]):
            stored = ResultRecord.deserialize(dest.get(key) or b"")
            stored.result = _flipped(stored.result)
            dest.replace(key, stored.serialize())


def test_tokcap_retire_keeps_a_capture_a_flipped_receipt_would_retire(
    locations: dict, prefect_api: str
) -> None:
    from tests.flows.test_pipeline_attacks import handed_off_not_retired
    from tests.support.pipeline_helpers import receipt_args, run_cli
    from tokcap.flows.finalize import RunFailedError, retire_uploaded

    options = locations["options"]
    store = TokenCaptureStore(locations["store"], options)
    handed_off_not_retired(locations, "flip", 3, masked={1})
    _write_flipped_receipts(locations, "flip")
    with pytest.raises(RunFailedError, match=f"{MASKED}: .*verified part records it masked"):
        retire_uploaded(locations["dest"], "flip", locations["store"], options)
    assert not store.read_entries("7-0") and not store.read_entries("7-2"), "the others retire"
    args = receipt_args("retire", locations["dest"], "flip", locations["store"])
    for key, value in (options or {}).items():
        args += ["--storage-option", f"{key}={value}"]
    again = run_cli(args, prefect_api)
    assert again.returncode == 1, again.stdout + again.stderr[-2000:]
    assert "disagrees with the part it certifies" in again.stdout + again.stderr
    kept = bool(store.read_entries(MASKED))
    assert kept, "the masked rollout's capture survives"
    record_case(
        "receipt can_retire flipped on a masked rollout (tokcap retire)", records_lost=int(not kept)
    )


def _verdict(record: object) -> tuple:
    assert isinstance(record, dict)
    return (plain_rollout_id(record), record.get("mask_sample"), rollout_carries_token_ids(record))


ITEMS = [
    {"prompt_token_ids": [1, 2], "generation_token_ids": [3], "generation_log_probs": [-1.5]},
    {"prompt_token_ids": [1], "generation_token_ids": [], "generation_log_probs": []},
    {"generation_token_ids": [[3], [4]], "generation_log_probs": [-0.1]},
    {"generation_token_ids": [None, -5], "routed_experts": [[1, 2], [3]]},
    {"content": 'say "prompt_token_ids":[1] and "generation_token_ids":[] please'},
    {"content": [{"generation_token_ids": [7]}], "generation_token_ids": [8]},
]


def _line(item: dict, masked: bool = False) -> bytes:
    record: dict = {"_ng_task_index": 7, "_ng_rollout_index": 0, "response": {"output": [item]}}
    if masked:
        record["mask_sample"] = True
    return orjson.dumps(record)


@pytest.mark.parametrize("item", ITEMS)
@pytest.mark.parametrize("masked", [False, True])
def test_a_skimmed_part_line_decides_like_the_whole_record(item: dict, masked: bool) -> None:
    line = _line(item, masked)
    assert _verdict(skimmed_record(line)) == _verdict(orjson.loads(line))
    assert skimmed_record(b"not json") is None


@pytest.mark.parametrize("ending", [b"\n", b""])
def test_each_line_of_a_part_is_skimmed_in_place_like_the_line_alone(ending: bytes) -> None:
    blank = b'{"_ng_task_index":7,"_ng_rollout_index":1,"response":{"output":[{"prompt_token_ids":[ ],"generation_token_ids":[\t]}]}}'  # noqa: E501 - a hand-edited line
    lines = [_line(item, masked=n % 2 == 1) for n, item in enumerate(ITEMS)]
    part = b"\n".join([lines[0], b"", blank, *lines[1:], b"not json"]) + ending
    expected = part.split(b"\n")
    if expected[-1] == b"":
        expected.pop()
    spans = _line_spans(part)
    assert [part[start:end] for start, end in spans] == expected
    for (start, end), line in zip(spans, expected, strict=True):
        assert skimmed_record(part, start, end) == skimmed_record(line)
    assert _verdict(skimmed_record(blank)) == ("7-1", None, False)  # `[ ]` carries no ids
