"""The capture-store contract on local disk, memory and S3 (moto server), plus bad input.

`Test*CaptureStore` run the contract suite once per backend, one test per behaviour;
`test_conformance_on_every_backend` runs the same checks as one `run_conformance` call,
the way a user checks a store in one line.
"""

from __future__ import annotations

import os
import pickle
import socket
import threading

import orjson
import pytest

from capture_core.errors import (
    CaptureConflictError,
    CaptureFencedError,
    CaptureRetiredError,
    StoreUnavailableError,
    UnreadableCaptureError,
)
from capture_core.records import TokenEntry
from capture_core.store import TokenCaptureStore, compact
from capture_core.store.capture_layout import call_key
from capture_core.testing.conformance import CHECKS, ConformanceError, run_conformance
from capture_core.testing.contracts import CaptureStoreContract
from tests.support.backends import OnBackend
from tests.support.servers import free_port
from tests.support.token_calls import token_call

ALL_CHECKS = set(CHECKS)


def make_entry(rollout_id: str, call: str, prompt: list[int], gen: list[int]) -> TokenEntry:
    return token_call(call, prompt, gen, rollout_id=rollout_id, log_prob=-0.25)


class TokcapStoreContract(OnBackend, CaptureStoreContract):
    def make_sink(self) -> TokenCaptureStore:
        return TokenCaptureStore(self.root, self.options)


class TestLocalCaptureStore(TokcapStoreContract):
    backend = "local"


class TestMemoryCaptureStore(TokcapStoreContract):
    backend = "memory"


class TestS3CaptureStore(TokcapStoreContract):
    backend = "s3"


def test_conformance_on_every_backend(store_location) -> None:
    root, options = store_location
    passed = run_conformance(
        lambda: TokenCaptureStore(root, options), lambda: TokenCaptureStore(root, options)
    )
    assert set(passed) == ALL_CHECKS


def test_conformance_catches_a_store_that_ignores_the_fence(tmp_path) -> None:
    class Leaky(TokenCaptureStore):
        def _fence(self, rollout_id: str) -> bool:
            return False

        def drop_now(self, rollout_id: str, snapshot_id: str, version: int) -> bool:
            self.delete(rollout_id)
            return True

    root = str(tmp_path)
    with pytest.raises(ConformanceError, match="mark_incomplete|write_after_freeze|tombstone"):
        run_conformance(lambda: Leaky(root), lambda: Leaky(root))


def test_store_pickles_and_compares_equal(store_location) -> None:
    root, options = store_location
    store = TokenCaptureStore(root, options)
    store.put_now(make_entry("r1", "a", [1], [2]))
    clone = pickle.loads(pickle.dumps(store))
    assert clone == store and hash(clone) == hash(store)
    assert [e.model_call_id for e in clone.freeze_now("r1").entries] == ["a"]


def test_repr_never_shows_storage_options(s3_url: str, s3_options) -> None:
    store = TokenCaptureStore(s3_url, {**s3_options, "secret": "planted-secret-123"})
    assert "planted-secret-123" not in repr(store)


@pytest.mark.parametrize("bad", ["..", "a/b", ".hidden", "", "ünï"])
def test_unsafe_rollout_ids_fail_before_any_io(tmp_path, bad: str) -> None:
    root = tmp_path / "never-created"
    store = TokenCaptureStore(str(root))
    for operation in (
        lambda: store.put_now(make_entry(bad, "a", [1], [2])),
        lambda: store.freeze_now(bad),
        lambda: store.mark_incomplete_now(bad, "a"),
        lambda: store.drop_now(bad, "s", 1),
        lambda: store.delete(bad),
    ):
        with pytest.raises(ValueError, match="malformed rollout id"):
            operation()
    assert not root.exists()


CALL_IDS = ["a/b", "..", "", "ünï 😀", "x" * 500, "\n\t", "CASE", "case", "%2F", "."]


def test_call_ids_with_any_characters_round_trip_exactly(store_location) -> None:
    root, options = store_location
    store = TokenCaptureStore(root, options)
    for i, call in enumerate(CALL_IDS):
        store.put_now(make_entry("r1", call, [i], [i + 1]))
    snapshot = TokenCaptureStore(root, options).freeze_now("r1")
    assert sorted(e.model_call_id for e in snapshot.entries) == sorted(CALL_IDS)
    assert not snapshot.incomplete and snapshot.version == len(CALL_IDS)


def test_newer_schema_in_store_fails_the_read_loudly(store_location) -> None:
    root, options = store_location
    store = TokenCaptureStore(root, options)
    store.put_now(make_entry("r1", "ok", [1], [2]))
    newer = {**make_entry("r1", "new", [1], [2]).model_dump(), "schema_version": 99}
    key = f"r1/e/{call_key('new')}"
    store.byte_store.create(key, orjson.dumps(newer))
    with pytest.raises(UnreadableCaptureError, match=f"rollout r1: object {key}.*newer"):
        store.freeze_now("r1")


def test_garbage_object_names_rollout_and_object(store_location) -> None:
    root, options = store_location
    store = TokenCaptureStore(root, options)
    store.put_now(make_entry("r1", "ok", [1], [2]))
    key = f"r1/e/{call_key('junk')}"
    store.byte_store.create(key, b"\x00not json")
    with pytest.raises(UnreadableCaptureError, match=f"rollout r1: object {key}"):
        store.freeze_now("r1")
    store.byte_store.create("r2/stray.txt", b"hello")
    with pytest.raises(UnreadableCaptureError, match="r2/stray.txt does not belong"):
        store.freeze_now("r2")


def test_misplaced_entry_is_refused(store_location) -> None:
    root, options = store_location
    store = TokenCaptureStore(root, options)
    moved = compact.encode(make_entry("other", "a", [1], [2]), call_key("a"))
    store.byte_store.create(f"r1/e/{call_key('a')}", moved.data)
    with pytest.raises(UnreadableCaptureError, match="copied into the wrong place"):
        store.freeze_now("r1")


def test_conflict_fence_and_retired_errors_say_what_happened(store_location) -> None:
    root, options = store_location
    store = TokenCaptureStore(root, options)
    store.put_now(make_entry("r1", "a", [1], [2]))
    with pytest.raises(CaptureConflictError, match="different payloads.*fresh model_call_id"):
        store.put_now(make_entry("r1", "a", [1], [3]))
    snapshot = store.freeze_now("r1")
    assert snapshot.incomplete and "different payloads" in snapshot.incomplete_reasons[0]
    store.put_now(make_entry("r1", "a", [1], [2]))  # identical repeat after freeze: no-op
    with pytest.raises(CaptureFencedError, match="arrived too late"):
        store.put_now(make_entry("r1", "b", [1], [2]))
    with pytest.raises(CaptureFencedError):
        store.begin_call_now("r1", "c")
    fresh = store.freeze_now("r1")
    assert store.drop_now("r1", fresh.snapshot_id, fresh.version)
    assert store.drop_now("r1", fresh.snapshot_id, fresh.version), "retiring twice is safe"
    with pytest.raises(CaptureRetiredError, match="cannot be finalized again"):
        store.freeze_now("r1")
    with pytest.raises(CaptureRetiredError, match="missing that call"):
        store.mark_incomplete_now("r1", "late")


def test_drop_keeps_only_a_tombstone_and_sweep_removes_it(store_location) -> None:
    root, options = store_location
    store = TokenCaptureStore(root, options)
    store.put_now(make_entry("r1", "a", [1], [2]))
    store.put_now(make_entry("r2", "a", [1], [2]))
    snapshot = store.freeze_now("r1")
    assert store.drop_now("r1", snapshot.snapshot_id, snapshot.version)
    assert store.byte_store.list_prefix("r1") == ["r1/FROZEN", "r1/RETIRED"]
    assert store.sweep_retired(3600) == 0
    assert store.sweep_retired(0) == 1
    assert store.byte_store.list_prefix("r1") == []
    assert len(store.byte_store.list_prefix("r2")) == 1, "unretired captures are never swept"


def test_drop_lists_the_capture_twice_and_reads_no_payload(store_location) -> None:
    """A drop deletes what its deciding listing saw and lists once more to verify, nothing else.

    One listing per drop is a round trip per rollout on S3 and a folder walk locally; the
    payloads' contents are never needed to retire them (the snapshot names them by version).
    """
    root, options = store_location
    store = TokenCaptureStore(root, options)
    for call in ("a", "b", "c"):
        store.put_now(make_entry("r1", call, [1], [2]))
    snapshot = store.freeze_now("r1")
    byte_store = store.byte_store
    listed: list[str] = []
    read: list[str] = []
    list_prefix, get = byte_store.list_prefix, byte_store.get
    byte_store.list_prefix = lambda prefix: listed.append(prefix) or list_prefix(prefix)
    byte_store.get = lambda key: read.append(key) or get(key)
    assert store.drop_now("r1", snapshot.snapshot_id, snapshot.version)
    # The tombstone is read again, and the capture listed again, through the rollout's folder
    # pinned: on local disk that is the folder's descriptor, not the store's own calls.
    pinned_is_store = byte_store.round_trips
    assert listed == (["r1", "r1"] if pinned_is_store else ["r1"])
    assert read == ["r1/RETIRED", "r1/FROZEN"] + (["r1/RETIRED"] if pinned_is_store else [])
    assert list_prefix("r1") == ["r1/FROZEN", "r1/RETIRED"]


def test_empty_freeze_fences_and_delete_clears_everything(store_location) -> None:
    root, options = store_location
    store = TokenCaptureStore(root, options)
    empty = store.freeze_now("fresh")
    assert (empty.entries, empty.incomplete, empty.version) == ((), False, 0)
    with pytest.raises(CaptureFencedError):
        store.put_now(make_entry("fresh", "a", [1], [2]))
    store.delete("fresh")
    assert store.byte_store.list_prefix("fresh") == []
    store.put_now(make_entry("fresh", "a", [1], [2]))


def test_unreachable_s3_endpoint_fails_with_a_clear_error() -> None:
    store = TokenCaptureStore("s3://bucket/x", {"endpoint_url": f"http://127.0.0.1:{free_port()}"})
    with pytest.raises(StoreUnavailableError, match=r"storage at s3://bucket/x is unreachable"):
        store.freeze_now("r1")


def test_s3_endpoint_that_drops_connections_is_retried_a_bounded_number_of_times() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    accepted = []

    def accept_and_drop() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            accepted.append(1)
            conn.close()

    threading.Thread(target=accept_and_drop, daemon=True).start()
    port = listener.getsockname()[1]
    store = TokenCaptureStore("s3://bucket/x", {"endpoint_url": f"http://127.0.0.1:{port}"})
    try:
        with pytest.raises(StoreUnavailableError, match="unreachable"):
            store.freeze_now("r1")
    finally:
        listener.close()
    assert 1 <= len(accepted) <= 12, f"{len(accepted)} connection attempts for one read"


def test_relative_local_root_is_refused() -> None:
    with pytest.raises(ValueError, match="absolute path"):
        TokenCaptureStore("relative/store")


def test_local_store_writes_no_temporaries_beside_objects(tmp_path) -> None:
    store = TokenCaptureStore(str(tmp_path))
    store.put_now(make_entry("r1", "a", [1], [2]))
    assert os.listdir(tmp_path / "r1" / "e") == [call_key("a")]
    assert not (tmp_path / ".tmp").exists() or os.listdir(tmp_path / ".tmp") == []
