"""handoff without a Prefect server: create-only parts, part verification, retirement."""

from __future__ import annotations

import asyncio
import hashlib
import random
import re

import orjson
import pytest

from capture_core.errors import HandoffConflictError, PartMismatchError
from capture_core.rows.trainer_rows import batch_rows, read_rows
from capture_core.run.batch_finalize import FinalizedBatch
from capture_core.run.part_upload import handoff_batch, upload_part
from capture_core.run.receipt import HandoffReceipt, RolloutOutcome
from capture_core.run.retire_verdict import retirable
from capture_core.run.retirement import retire_receipt
from capture_core.run.verified_read import DIGEST_BESIDE_BYTES, verified_decode, verify_part
from capture_core.storage import open_byte_store
from capture_core.store import TokenCaptureStore
from tests.store.test_torn_puts import turns


@pytest.fixture
def dest(tmp_path):
    return open_byte_store(str(tmp_path / "dest"))


def frozen(store: TokenCaptureStore, rollout_id: str, line: int) -> RolloutOutcome:
    for entry in turns(rollout_id, 2):
        store.put_now(entry)
    snap = store.freeze_now(rollout_id)
    return RolloutOutcome(
        line=line,
        rollout_id=rollout_id,
        can_retire=True,
        snapshot_id=snap.snapshot_id,
        version=snap.version,
    )


def part_record(outcome: RolloutOutcome) -> dict:
    """A finalized record of `outcome`: its id, one token-carrying item, and its mask."""
    item = {"prompt_token_ids": [1], "generation_token_ids": [2], "generation_log_probs": [-0.1]}
    record: dict = {"_ng_rollout_id": outcome.rollout_id, "response": {"output": [item]}}
    if outcome.masked:
        record["mask_sample"] = True
    return record


def handed_off(dest, outcomes: list[RolloutOutcome], part: bytes | None = None) -> HandoffReceipt:
    """Hand `outcomes` off; the part holds their records unless `part` is given."""
    if part is None:
        part = b"".join(orjson.dumps(part_record(o)) + b"\n" for o in outcomes if o.emitted)
    finalized = FinalizedBatch(
        index=0, receipt_key="batch-00000-k", part_key="run/records/p.jsonl",
        part=part, outcomes=outcomes,
    )  # fmt: skip
    return handoff_batch("run", finalized, dest)


def test_an_identical_part_is_accepted_again(dest) -> None:
    assert upload_part(dest, "run/records/p", b"a\n") == upload_part(dest, "run/records/p", b"a\n")


def test_a_different_existing_part_is_never_overwritten(dest) -> None:
    upload_part(dest, "run/records/p", b"a\n")
    with pytest.raises(HandoffConflictError, match="never overwritten"):
        upload_part(dest, "run/records/p", b"b\n")
    assert dest.get("run/records/p") == b"a\n"


def test_the_receipt_counts_only_emitted_records(dest) -> None:
    outcomes = [RolloutOutcome(line=1), RolloutOutcome(line=2, error="bad")]
    receipt = handed_off(dest, outcomes, b"{}\n")
    assert receipt.records == 1 and receipt.bytes == 3


def test_an_edited_part_fails_verification_naming_it(dest) -> None:
    receipt = handed_off(dest, [RolloutOutcome(line=1)])
    dest.replace(receipt.part_key, b"[]\n")
    with pytest.raises(PartMismatchError, match="run/records/p.jsonl"):
        verify_part(dest, receipt)


def certified(dest, data: bytes) -> tuple[HandoffReceipt, str, int, str]:
    """`data` handed off as a batch's part: its receipt, key, size and sha256."""
    receipt = handed_off(dest, [RolloutOutcome(line=1)], data)
    return receipt, receipt.part_key, receipt.bytes, receipt.sha256


def not_parquet(data: bytes) -> bytes:
    """A decode that refuses whatever it is given."""
    raise ValueError("not parquet")


def test_decoding_a_certified_part_returns_what_decode_made(dest) -> None:
    receipt, key, size, sha = certified(dest, b"certified\n")
    assert verified_decode(dest, receipt, key, size, sha, bytes.upper) == b"CERTIFIED\n"


def test_a_decode_error_of_certified_bytes_is_the_error_raised(dest) -> None:
    receipt, key, size, sha = certified(dest, b"certified\n")

    with pytest.raises(ValueError, match="not parquet"):
        verified_decode(dest, receipt, key, size, sha, not_parquet)


@pytest.mark.parametrize("size", [10, DIGEST_BESIDE_BYTES + 10])
def test_other_bytes_are_the_mismatch_whatever_decode_made_of_them(dest, size: int) -> None:
    """An edit of the same size of a large part decodes while its digest is computed: the
    result, or the decode error, is discarded and the mismatch is raised. A small part is
    hashed first, so its edit is never decoded at all."""
    pad = b"x" * (size - 10)
    receipt, key, size, sha = certified(dest, pad + b"certified\n")
    dest.replace(key, pad + b"CERTIFIED\n")
    decoded: list[bytes] = []

    for decode in (decoded.append, not_parquet):
        with pytest.raises(PartMismatchError, match=f"certifies {size} bytes") as refused:
            verified_decode(dest, receipt, key, size, sha, decode)
        error = refused.value  # the decode error is not reported, not even as context
        assert error.__cause__ is None and (error.__context__ is None or error.__suppress_context__)
    large = size >= DIGEST_BESIDE_BYTES
    assert decoded == ([pad + b"CERTIFIED\n"] if large else [])  # never returned


def test_a_part_of_another_size_is_never_decoded(dest) -> None:
    receipt, key, size, sha = certified(dest, b"certified\n")
    decoded: list[bytes] = []
    for stored in (b"certified\n+", None):
        dest.delete([key])
        if stored is not None:
            dest.create(key, stored)
        with pytest.raises(PartMismatchError, match="is missing" if stored is None else "has 11"):
            verified_decode(dest, receipt, key, size, sha, decoded.append)
    assert decoded == []


def peak_rss_kib() -> int:
    """The process's peak resident memory since the last `reset_peak_rss` (Linux)."""
    with open("/proc/self/status") as status:
        return int(re.search(r"VmHWM:\s+(\d+)", status.read()).group(1))  # type: ignore[union-attr]


def reset_peak_rss() -> None:
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # resets VmHWM to the current resident size


@pytest.mark.integrity
def test_randomly_edited_rows_parts_are_refused_as_the_mismatch_without_a_large_allocation(
    dest,
) -> None:
    """Edited bytes reach pyarrow's decoder while their digest is computed: whatever an
    edit does to the decode, the outcome is the mismatch, and decoding them never takes
    hundreds of megabytes (the process's peak memory, reset before the edits). Half of the
    edits fall in the footer, the part's metadata."""
    rng = random.Random(7)
    records = [
        (n, part_record(RolloutOutcome(line=n, rollout_id=f"r{n}")), False) for n in range(1, 9)
    ]
    for _, record, _ in records:
        item = record["response"]["output"][0]
        item["prompt_token_ids"] = [rng.randrange(150_000) for _ in range(1500)]
        item["generation_token_ids"] = [rng.randrange(150_000) for _ in range(500)]
        item["generation_log_probs"] = [-rng.random() for _ in range(500)]
    data = batch_rows(records)
    footer = int.from_bytes(data[-8:-4], "little") + 8  # metadata, its length and "PAR1"
    receipt, key, size, sha = certified(dest, data)
    reset_peak_rss()
    before = peak_rss_kib()
    for n in range(400):
        edited = bytearray(data)
        low = len(data) - footer if n % 2 else 0
        for _ in range(rng.choice((1, 1, 2, 8))):
            edited[rng.randrange(low, len(data))] = rng.randrange(256)
        if edited == data:
            continue
        dest.replace(key, bytes(edited))
        with pytest.raises(PartMismatchError):
            verified_decode(dest, receipt, key, size, sha, read_rows)
    assert peak_rss_kib() - before < 256 * 1024
    dest.replace(key, data)
    assert verified_decode(dest, receipt, key, size, sha, read_rows).num_rows == 8


def test_an_interrupt_while_decoding_is_raised_as_it_is(dest) -> None:
    """Ctrl-C during a decode of other bytes stays a `KeyboardInterrupt`, never the mismatch
    (a trainer that handles mismatches and goes on would swallow it). A part large enough
    to be decoded beside its digest, since a small one is never decoded unverified."""
    pad = b"x" * DIGEST_BESIDE_BYTES
    receipt, key, size, sha = certified(dest, pad + b"certified\n")
    dest.replace(key, pad + b"CERTIFIED\n")

    def interrupted(data: bytes) -> bytes:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        verified_decode(dest, receipt, key, size, sha, interrupted)


def test_a_finalized_batch_repr_leaves_its_parts_out() -> None:
    """Python 3.11's `asyncio.run` formats its result's repr twice; a part's bytes would
    make that seconds for a large batch."""
    batch = FinalizedBatch(
        index=0, receipt_key="batch-00000-k", part_key="p", part=b"x" * 10_000,
        outcomes=[], rows_key="r", rows=b"y" * 10_000,
    )  # fmt: skip
    assert "xxx" not in repr(batch) and "yyy" not in repr(batch) and len(repr(batch)) < 200


def test_only_retirable_rollouts_at_a_known_snapshot_are_retired(dest) -> None:
    unknown = RolloutOutcome(line=1, rollout_id="a", can_retire=True)
    masked = RolloutOutcome(line=2, rollout_id="b", masked=True, snapshot_id="s", version=1)
    ready = RolloutOutcome(line=3, rollout_id="c", can_retire=True, snapshot_id="s", version=1)
    receipt = handed_off(dest, [unknown, masked, ready])
    assert retirable(receipt, verify_part(dest, receipt)) == ([ready], {})


def test_retire_drops_the_frozen_capture(tmp_path, dest) -> None:
    store = TokenCaptureStore(str(tmp_path / "store"))
    receipt = handed_off(dest, [frozen(store, "r1", 1)])
    outcome = asyncio.run(retire_receipt(receipt, store, dest))
    assert outcome.retired == ["r1"] and not store.read_entries("r1")


def test_retire_keeps_a_capture_that_changed_since_it_was_frozen(tmp_path, dest) -> None:
    store = TokenCaptureStore(str(tmp_path / "store"))
    receipt = handed_off(dest, [frozen(store, "r1", 1)])
    store.delete("r1")
    for entry in turns("r1", 3):
        store.put_now(entry)
    outcome = asyncio.run(retire_receipt(receipt, store, dest))
    assert outcome.retired == [] and "kept" in outcome.kept["r1"]
    assert len(store.read_entries("r1")) == 3


def test_retire_drops_nothing_when_the_part_is_missing(tmp_path, dest) -> None:
    store = TokenCaptureStore(str(tmp_path / "store"))
    receipt = handed_off(dest, [frozen(store, "r1", 1)])
    dest.delete([receipt.part_key])
    with pytest.raises(PartMismatchError):
        asyncio.run(retire_receipt(receipt, store, dest))
    assert store.read_entries("r1")


@pytest.fixture(params=["local", "s3"])
def any_dest(request: pytest.FixtureRequest, tmp_path):
    if request.param == "local":
        return open_byte_store(str(tmp_path / "dest"))
    return open_byte_store(request.getfixturevalue("s3_url"), request.getfixturevalue("s3_options"))


def with_rows() -> FinalizedBatch:
    """A batch of one record, with its records part and its rows part."""
    outcome = RolloutOutcome(line=1, rollout_id="r-0")
    record = part_record(outcome)
    return FinalizedBatch(
        index=0, receipt_key="batch-00000-k", part_key="run/records/p.jsonl",
        part=orjson.dumps(record) + b"\n", outcomes=[outcome],
        rows_key="run/rows/p.parquet", rows=batch_rows([(1, record, False)]),
    )  # fmt: skip


def test_the_receipt_pins_both_parts_as_written(any_dest) -> None:
    batch = with_rows()
    receipt = handoff_batch("run", batch, any_dest)
    assert receipt.rows is not None and receipt.rows.rows == 1
    assert receipt.rows.sha256 == hashlib.sha256(batch.rows or b"").hexdigest()
    assert any_dest.get("run/rows/p.parquet") == batch.rows
    assert any_dest.get("run/records/p.jsonl") == batch.part


@pytest.mark.parametrize("conflicting", ["run/records/p.jsonl", "run/rows/p.parquet"])
def test_a_conflict_on_either_part_raises_once_both_uploads_ended(any_dest, conflicting) -> None:
    """The two parts upload concurrently: an error on one is raised only after the other
    finished (no write of the handoff goes on after it returned), and no receipt is made."""
    batch = with_rows()
    any_dest.create(conflicting, b"other\n")
    with pytest.raises(HandoffConflictError, match=conflicting):
        handoff_batch("run", batch, any_dest)
    assert any_dest.get(conflicting) == b"other\n"
    other = {"run/records/p.jsonl": batch.part, "run/rows/p.parquet": batch.rows}
    (key,) = set(other) - {conflicting}
    assert any_dest.get(key) == other[key]
