"""Two passes retiring one snapshot at once: the one that decides second reports it retired.

A pass that reads no decision, then lists the rollout after the other pass's drop decided
and began deleting, sees a listing that no longer has the frozen version. The other pass's
tombstone retires exactly that snapshot, so both report it retired; before, the second
reported the capture kept as changed since its freeze, and its run's ledger disagreed with
the store. A version changed by a late write, with no tombstone, still keeps the capture.
On local disk and S3 (moto).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from capture_core.protocols import DropRequest
from capture_core.storage import ByteStore
from capture_core.store import TokenCaptureStore
from tests.store.test_store_attacks import PausingBytes, two_turns
from tests.support.reliability_figures import record_case

pytestmark = pytest.mark.integrity


class ListPausingBytes(PausingBytes):
    """A byte store that runs `hook()` once, just before its first listing of `prefix`."""

    def __init__(self, inner: ByteStore, prefix: str, hook: Callable[[], None]) -> None:
        super().__init__(inner, lambda _key: False, hook)
        self.prefix = prefix

    def list_prefix(self, prefix: str) -> list[str]:
        if not self.fired and prefix == self.prefix:
            self.fired = True
            self.hook()
        return super().list_prefix(prefix)


def raced(
    url: str, options: dict | None, meanwhile: Callable[[TokenCaptureStore, DropRequest], None]
) -> tuple[TokenCaptureStore, DropRequest]:
    """A frozen rollout `r1`, and a store whose drop lists it only after `meanwhile` ran."""
    first, second = TokenCaptureStore(url, options), TokenCaptureStore(url, options)
    for item in two_turns("r1"):
        first.put_now(item)
    snapshot = first.freeze_now("r1")
    request = DropRequest("r1", snapshot_id=snapshot.snapshot_id, version=snapshot.version)
    first._bytes = ListPausingBytes(first.byte_store, "r1", lambda: meanwhile(second, request))
    return first, request


def other_drop(store: TokenCaptureStore, request: DropRequest) -> None:
    assert store.drop_now(request.rollout_id, request.snapshot_id, request.version)


@pytest.mark.parametrize("batch", [False, True], ids=["drop", "drop_many"])
def test_a_drop_that_lists_after_another_decided_reports_the_snapshot_retired(
    shared_store_location, batch: bool
) -> None:
    url, options = shared_store_location
    store, request = raced(url, options, other_drop)
    if batch:
        (retired,) = asyncio.run(store.drop_many([request], concurrency=2))
    else:
        retired = store.drop_now(request.rollout_id, request.snapshot_id, request.version)
    assert retired is True
    assert TokenCaptureStore(url, options).read_entries("r1") == [], "the other drop deleted"
    record_case("two passes retire one snapshot at once; both report it retired")


def test_a_late_write_during_the_drop_still_keeps_the_capture(shared_store_location) -> None:
    url, options = shared_store_location

    def late_marker(store: TokenCaptureStore, _request: DropRequest) -> None:
        store.mark_incomplete_now("r1", "turn-2")

    store, request = raced(url, options, late_marker)
    assert store.drop_now(request.rollout_id, request.snapshot_id, request.version) is False
    assert len(TokenCaptureStore(url, options).read_entries("r1")) == 2, "nothing deleted"
    record_case("a loss reported while a drop lists keeps the capture")
