"""A batch retires in two phases: every tombstone durable first, then the deletions.

Killed between the phases or during the second, the retirement leaves tombstones above
payloads: late writers are fenced, nothing can be finalized again, and a re-run deletes
what is left. A source without `drop_many` is retired one `drop` per rollout.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import subprocess
import sys
import time

import orjson
import pytest

from capture_core.errors import CaptureFencedError, CaptureRetiredError
from capture_core.protocols import DECIDED, DELETED, DropRequest
from capture_core.run.crash_points import CRASH_ENV
from capture_core.run.receipt import HandoffReceipt
from capture_core.run.retirement import retire_receipt
from capture_core.storage import ByteStore, open_byte_store
from capture_core.storage.local.temporaries import TMP_DIR, wait_removed
from capture_core.store import TokenCaptureStore, retirement
from capture_core.store.nemo_gym_store import NemoGymFileStore
from tests.run.test_batch_concurrency import finalized_part, receipt_for
from tests.store.test_torn_puts import turns
from tests.support.reliability_figures import record_case

COUNT = 6


def handed_off_to(dest: ByteStore, store: TokenCaptureStore, receipt: HandoffReceipt) -> None:
    """Write the batch's real part at the destination and pin it in the receipt."""
    part = finalized_part(store, COUNT)
    dest.create(receipt.part_key, part)
    receipt.sha256, receipt.bytes = hashlib.sha256(part).hexdigest(), len(part)


def requests(receipt: HandoffReceipt) -> list[DropRequest]:
    """The receipt's rollouts as drop requests, each at the snapshot it consumed."""
    return [
        DropRequest(r.rollout_id or "", r.snapshot_id or "", r.version or 0)
        for r in receipt.rollouts
    ]


def payloads(store: TokenCaptureStore, rollout_id: str) -> list[str]:
    keep = {f"{rollout_id}/FROZEN", f"{rollout_id}/RETIRED"}
    return [key for key in store.byte_store.list_prefix(rollout_id) if key not in keep]


def retire_killed_at(locations: dict, receipt: HandoffReceipt, point: str) -> int:
    """Run `retire_receipt` in a subprocess killed at `point`; return its exit code."""
    arguments = orjson.dumps(
        {
            "store": locations["store"],
            "dest": locations["dest"],
            "options": locations["options"],
            "receipt": receipt.model_dump(),
        }
    ).decode()
    code = f"from tests.support.workers import retire_batch; retire_batch({arguments!r})"
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, CRASH_ENV: point},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == -9, f"expected SIGKILL at {point}: {done.stderr[-1500:]}"
    return done.returncode


@pytest.mark.integrity
@pytest.mark.parametrize("point", ["after-retire-decisions", "mid-retire"])
def test_a_retirement_killed_in_either_phase_fences_late_writers_and_its_rerun_completes_it(
    locations: dict, point: str
) -> None:
    record_case(f"batch retirement killed {point.replace('-', ' ')}")
    options = locations["options"]
    store = TokenCaptureStore(locations["store"], options)
    receipt = receipt_for(store, COUNT)
    dest = open_byte_store(locations["dest"], options)
    handed_off_to(dest, store, receipt)
    before = {f"r{i}": payloads(store, f"r{i}") for i in range(COUNT)}

    retire_killed_at(locations, receipt, point)

    left = {f"r{i}": payloads(store, f"r{i}") for i in range(COUNT)}
    for rollout in receipt.rollouts:
        decision = retirement.read_decision(store.byte_store, rollout.rollout_id) or {}
        assert (decision.get("snapshot_id"), decision.get("version")) == (
            rollout.snapshot_id,
            rollout.version,
        ), f"{rollout.rollout_id}: every decision of the batch is durable before a deletion"
    if point == "after-retire-decisions":
        assert left == before, "nothing is deleted before every decision is durable"
    else:
        assert any(not keys for keys in left.values()), "killed after a rollout's deletion"
    late = next((name for name, keys in left.items() if keys), "r0")  # leftovers, if any
    with pytest.raises(CaptureFencedError):
        store.put_now(turns(late, 3)[2])
    with pytest.raises(CaptureRetiredError):
        store.freeze_now(late)

    rerun = asyncio.run(
        retire_receipt(receipt, TokenCaptureStore(locations["store"], options), dest)
    )
    assert sorted(rerun.retired) == sorted(before) and not rerun.failed, rerun
    assert all(not payloads(store, name) for name in before), "the re-run deletes the rest"


def test_no_capture_is_deleted_before_every_decision_of_the_batch_is_durable(store) -> None:
    receipt = receipt_for(store, COUNT)
    drops = requests(receipt)
    seen: list[tuple[str, int, int]] = []

    def checkpoint(moment: str) -> None:
        names = [d.rollout_id for d in drops]
        decided = sum(store.byte_store.exists(f"{n}/RETIRED") for n in names)
        intact = sum(bool(payloads(store, n)) for n in names)
        seen.append((moment, decided, intact))

    results = asyncio.run(store.drop_many(drops, concurrency=3, checkpoint=checkpoint))
    assert results == [True] * COUNT
    assert seen[0] == (DECIDED, COUNT, COUNT)
    assert [moment for moment, _, _ in seen[1:]] == [DELETED] * COUNT
    # Deleting threads report concurrently, so the last report appended need not be the last
    # deletion's; the report of the deletion that finished last sees none intact.
    assert all(decided == COUNT for _, decided, _ in seen[1:])
    assert min(intact for _, _, intact in seen[1:]) == 0
    assert not any(payloads(store, d.rollout_id) for d in drops)


def test_each_rollout_of_a_batch_gets_its_own_result_and_only_retired_ones_lose_payloads(
    store,
) -> None:
    receipt = receipt_for(store, 4)

    def request(r, version: int | None = None) -> DropRequest:
        return DropRequest(r.rollout_id, r.snapshot_id, r.version if version is None else version)

    first, changed, refused, retired_before = receipt.rollouts
    store.mark_incomplete_now(refused.rollout_id or "", "turn-9")
    earlier = request(retired_before)
    assert store.drop_now(earlier.rollout_id, earlier.snapshot_id, earlier.version)

    drops = [
        request(first),
        request(changed, version=(changed.version or 0) + 1),
        request(refused),
        DropRequest("not a rollout id!", "s", 1),
        earlier,
    ]
    results = asyncio.run(store.drop_many(drops, concurrency=2))
    assert results[0] is True and results[1] is False and results[2] is False
    assert isinstance(results[3], ValueError), results[3]
    assert results[4] is True, "a repeated drop of a retired snapshot still says retired"
    assert not payloads(store, first.rollout_id or "")
    assert payloads(store, changed.rollout_id or ""), "a changed capture is kept whole"
    assert payloads(store, refused.rollout_id or ""), "a refused capture is kept whole"


def test_nemo_gym_store_retires_a_batch_one_drop_per_rollout(tmp_path) -> None:
    store = NemoGymFileStore(str(tmp_path))
    receipt = receipt_for(store, 3)  # type: ignore[arg-type]
    drops = requests(receipt)
    moments: list[str] = []
    results = asyncio.run(store.drop_many(drops, concurrency=2, checkpoint=moments.append))
    assert results == [True, True, True]
    assert moments == [DELETED, DELETED, DELETED, DECIDED]
    assert not any(store.read_entries(d.rollout_id) for d in drops)


class RefusingStore(TokenCaptureStore):
    """A subclass whose own `drop_now` refuses every drop."""

    def drop_now(self, rollout_id: str, snapshot_id: str, version: int) -> bool:
        return False


def test_a_subclass_with_its_own_drop_is_retired_through_it(tmp_path) -> None:
    store = RefusingStore(str(tmp_path))
    receipt = receipt_for(store, 2)
    drops = requests(receipt)
    assert asyncio.run(store.drop_many(drops, concurrency=2)) == [False, False]
    assert all(payloads(store, d.rollout_id) for d in drops), "its refusal keeps the captures"
    assert not any(store.byte_store.exists(f"{d.rollout_id}/RETIRED") for d in drops)


@pytest.mark.integrity
def test_a_rollout_cleared_and_captured_again_while_its_batch_decides_keeps_the_new_capture(
    store,
) -> None:
    """The retiring process pauses after its decisions; meanwhile the dispatch-time clear
    removes one rollout, tombstone included, and its id is captured again. The late second
    phase deletes the other rollouts' payloads and leaves the new capture whole."""
    record_case("late second phase of a batch retirement after a clear and a new capture")
    drops = requests(receipt_for(store, COUNT))
    reused = drops[0].rollout_id

    def checkpoint(moment: str) -> None:
        if moment == DECIDED:
            store.delete(reused)
            for item in turns(reused, 3):
                store.put_now(item)

    results = asyncio.run(store.drop_many(drops, concurrency=3, checkpoint=checkpoint))
    assert results == [False] + [True] * (COUNT - 1), "the cleared rollout is not retired here"
    assert len(store.read_entries(reused)) == 3, "the new capture is whole"
    assert store.freeze_now(reused).version == 3
    assert all(not payloads(store, d.rollout_id) for d in drops[1:])


@pytest.mark.integrity
def test_a_retirement_killed_after_moving_folders_aside_leaves_them_to_the_sweep_unread(
    tmp_path,
) -> None:
    """Killed at `mid-retire` on local disk, after the first rollout's event folders were
    renamed into the temporaries and before anything removed them: no rollout reads them
    as its capture, the id dispatched again captures afresh, the re-run finishes the batch,
    and the temporaries' sweep removes the moved folders."""
    record_case("batch retirement killed between moving folders aside and removing them")
    locations = {"store": str(tmp_path / "store"), "dest": str(tmp_path / "dest"), "options": None}
    store = TokenCaptureStore(locations["store"])
    receipt = receipt_for(store, COUNT)
    dest = open_byte_store(locations["dest"])
    handed_off_to(dest, store, receipt)
    temporaries = tmp_path / "store" / TMP_DIR

    retire_killed_at(locations, receipt, "mid-retire")

    moved = [p for p in temporaries.iterdir() if p.name.startswith("set-aside-")]
    assert moved and all(p.is_dir() for p in moved), "a rollout's folders were moved aside"
    assert sorted(store.byte_store.list_children("")) == [f"r{i}" for i in range(COUNT)]
    emptied = [f"r{i}" for i in range(COUNT) if not payloads(store, f"r{i}")]
    assert emptied, "killed after a rollout's deletion"
    reused = emptied[0]
    store.clear_for_dispatch(reused)  # the id dispatched again, a new attempt
    assert store.read_entries(reused) == []
    for item in turns(reused, 2):
        store.put_now(item)
    assert [e.model_call_id for e in store.read_entries(reused)] == ["turn-0", "turn-1"]
    assert store.freeze_now(reused).version == 2, "only the new attempt's calls count"

    rerun = asyncio.run(retire_receipt(receipt, TokenCaptureStore(locations["store"]), dest))
    assert not rerun.failed, rerun
    assert reused in rerun.kept and sorted(rerun.retired) == sorted(
        f"r{i}" for i in range(COUNT) if f"r{i}" != reused
    ), "the re-dispatched rollout's new capture is no longer the receipt's snapshot"
    assert all(not payloads(store, f"r{i}") for i in range(COUNT) if f"r{i}" != reused)
    assert wait_removed(120)
    assert all(p.exists() for p in moved), "the killed process's moved folders await the sweep"
    store.byte_store.remove_stale_temporaries(3600, time.time() + 7200)  # an hour on
    assert not [p for p in temporaries.iterdir() if p.name.startswith("set-aside-")]
    assert len(store.read_entries(reused)) == 2, "the new attempt's capture is untouched"
