"""Contract suites to subclass once per store, one test method per behaviour.

Subclass `CaptureStoreContract` for a capture store (implement `make_sink`, and
`make_source` when the source is another class) and `ByteStoreContract` for a byte store
(implement `make_store`, and `plant_reserved` to check that listings hide reserved names).
Name the subclass `Test...` and pytest runs every behaviour as its own test, so one failure
never hides another. Each factory call must return a new client of the same storage.
Behaviours a store cannot have (an optional method it lacks) are skipped, not passed.
This module imports no test framework: skips raise `unittest.SkipTest`, which pytest honours.
"""

from __future__ import annotations

import asyncio
import time
import unittest
from collections.abc import Callable
from typing import Any

from capture_core.storage import ByteStore
from capture_core.testing.conformance import CHECKS, ConformanceError, applies, run_check


class CaptureStoreContract:
    """The capture-store contract (see `capture_core.testing.conformance.CHECKS`)."""

    def make_sink(self) -> Any:
        """A new client of the store under test, used to write."""
        raise NotImplementedError

    def make_source(self) -> Any:
        """A new client of the same store, used to freeze and retire (default: a sink)."""
        return self.make_sink()

    def check(self, name: str) -> None:
        """Run the check `name`, skipping it when the store lacks its optional method."""
        sink, source = self.make_sink(), self.make_source()
        supported = applies(name, sink, source)
        for client in (sink, source):
            _close(client)
        if not supported:
            raise unittest.SkipTest(f"the store has no method the {name} check needs")
        run_check(name, self.make_sink, self.make_source)


def _close(client: Any) -> None:
    close_now = getattr(client, "close_now", None)
    if close_now is not None:
        close_now()
    else:
        asyncio.run(client.close())


def _contract_test(name: str) -> Callable[[CaptureStoreContract], None]:
    def test(self: CaptureStoreContract) -> None:
        self.check(name)

    test.__name__ = test.__qualname__ = f"test_{name}"
    test.__doc__ = f"The capture-store check {name}."
    return test


for _name in CHECKS:
    setattr(CaptureStoreContract, f"test_{_name}", _contract_test(_name))


class ByteStoreContract:
    """The byte-store contract (`capture_core.storage.ByteStore`), on any backend."""

    def make_store(self) -> ByteStore:
        """A new client of the byte store under test (empty at the start of each test)."""
        raise NotImplementedError

    def plant_reserved(self, store: ByteStore, key: str, data: bytes) -> None:
        """Write `key` (with a reserved dot segment) behind the store's back, as another
        tool would; stores that cannot be written around skip the listing check."""
        raise unittest.SkipTest("this store cannot be written to around its interface")

    def test_missing_key_reads_as_none(self) -> None:
        store = self.make_store()
        assert store.get("r/e/missing") is None
        assert not store.exists("r/e/missing")
        assert store.get_many(["r/e/a", "r/e/b"]) == {"r/e/a": None, "r/e/b": None}

    def test_create_is_durable_and_visible_to_another_client(self) -> None:
        assert self.make_store().create("r/e/a", b"one")
        other = self.make_store()
        assert other.get("r/e/a") == b"one" and other.exists("r/e/a")

    def test_create_never_overwrites(self) -> None:
        store = self.make_store()
        assert store.create("r/e/a", b"one")
        assert not store.create("r/e/a", b"two")
        assert not self.make_store().create("r/e/a", b"three")
        assert store.get("r/e/a") == b"one"

    def test_create_in_place_never_overwrites(self) -> None:
        store = self.make_store()
        assert store.create_in_place("r/e/a", b"one")
        assert not store.create_in_place("r/e/a", b"two")
        assert not store.create("r/e/a", b"three")
        assert store.get("r/e/a") == b"one"

    def test_staged_creates_are_exclusive_per_key_and_leave_no_temporary(self) -> None:
        store = self.make_store()
        assert store.create("r2/RETIRED", b"earlier")
        with store.staged(b"shared") as staged:
            assert store.create_staged("r1/RETIRED", staged)
            assert not store.create_staged("r2/RETIRED", staged), "r2 existed"
            assert store.create_staged("r3/RETIRED", staged)
            assert not store.create_staged("r1/RETIRED", staged), "r1 was just created"
        other = self.make_store()
        read = [other.get(f"r{i}/RETIRED") for i in (1, 2, 3)]
        assert read == [b"shared", b"earlier", b"shared"], read
        assert store.list_children("") == ["r1", "r2", "r3"]
        leftovers = store.remove_stale_temporaries(-1.0, time.time() + 60)
        assert leftovers == 0, "the staged copy is released on exit"

    def test_empty_create_is_refused(self) -> None:
        store = self.make_store()
        for create in (store.create, store.create_in_place):
            try:
                create("r/e/empty", b"")
            except ValueError as exc:
                assert "empty object r/e/empty" in str(exc)
            else:
                raise ConformanceError(f"{create.__name__} accepted an empty object")
        try:
            with store.staged(b""):
                raise ConformanceError("staged accepted an empty object")
        except ValueError as exc:
            assert "empty object" in str(exc)
        assert not store.exists("r/e/empty")

    def test_replace_overwrites(self) -> None:
        store = self.make_store()
        store.replace("run/ledger.jsonl", b"first")
        store.replace("run/ledger.jsonl", b"second, longer")
        assert self.make_store().get("run/ledger.jsonl") == b"second, longer"

    def test_keys_outside_the_root_or_reserved_are_refused(self) -> None:
        store = self.make_store()
        for key in ("../x", "a//b", "a/./b", "/abs", "r/.hidden", ".tmp/x"):
            try:
                store.create(key, b"data")
            except ValueError:
                continue
            raise ConformanceError(f"key {key!r} was accepted")

    def test_list_prefix_is_recursive_sorted_and_bounded(self) -> None:
        store = self.make_store()
        for key in ("r/x/2", "r/e/b", "r/e/a", "r/FROZEN", "rr/e/a", "s/e/a"):
            assert store.create(key, b"data")
        assert self.make_store().list_prefix("r") == ["r/FROZEN", "r/e/a", "r/e/b", "r/x/2"]
        assert store.list_prefix("r/e") == ["r/e/a", "r/e/b"]
        assert store.list_prefix("nothing") == []

    def test_list_children_names_objects_and_folders(self) -> None:
        store = self.make_store()
        for key in ("r1/e/a", "r1/FROZEN", "r2/e/a", "top"):
            assert store.create(key, b"data")
        assert store.list_children("") == ["r1", "r2", "top"]
        assert store.list_children("r1") == ["FROZEN", "e"]
        assert store.list_children("missing") == []

    def test_listings_never_show_reserved_names(self) -> None:
        store = self.make_store()
        assert store.create("r/e/a", b"data")
        self.plant_reserved(store, "r/e/.nfs0001", b"left by another tool")
        self.plant_reserved(store, ".cache/x", b"left by another tool")
        assert store.list_prefix("r") == ["r/e/a"]
        assert store.list_children("r/e") == ["a"]
        assert store.list_children("") == ["r"]

    def test_many_reads_keep_order_and_report_missing(self) -> None:
        store = self.make_store()
        keys = [f"r/e/{i:03d}" for i in range(70)]
        for key in keys[::2]:
            assert store.create(key, key.encode())
        expected = [(k, k.encode() if i % 2 == 0 else None) for i, k in enumerate(keys)]
        assert list(store.iter_many(keys, chunk=16)) == expected
        assert store.get_many(keys[:4]) == dict(expected[:4])

    def test_delete_removes_objects_and_tolerates_missing_ones(self) -> None:
        store = self.make_store()
        for key in ("r/e/a", "r/e/b", "r/FROZEN"):
            assert store.create(key, b"data")
        store.delete(["r/e/a", "r/e/missing"])
        store.delete([])
        assert self.make_store().list_prefix("r") == ["r/FROZEN", "r/e/b"]
        store.delete(["r/e/b", "r/FROZEN"], durable=False)
        assert store.list_prefix("r") == [] and store.get("r/e/b") is None
        assert store.create("r/e/b", b"again"), "a deleted key can be created again"

    def test_batch_delete_of_more_keys_than_one_request_takes(self) -> None:
        store = self.make_store()
        keys = [f"r/e/{i:04d}" for i in range(1010)]
        for key in keys:
            assert store.create(key, b"x")
        store.delete(keys)
        assert store.list_prefix("r") == []

    def test_delete_prefix_keeps_what_it_is_told_to(self) -> None:
        store = self.make_store()
        for key in ("r/e/a", "r/x/m", "r/FROZEN", "r/RETIRED", "other/e/a"):
            assert store.create(key, b"data")
        assert store.delete_prefix("r", keep=("r/FROZEN", "r/RETIRED"), durable=False)
        assert store.list_prefix("r") == ["r/FROZEN", "r/RETIRED"]
        assert store.delete_prefix("r") and store.list_prefix("r") == []
        assert store.list_prefix("other") == ["other/e/a"]

    def test_delete_folder_deletes_the_prefix_and_a_pinned_view_never_reaches_past_it(
        self,
    ) -> None:
        store = self.make_store()
        for key in ("r/e/a", "r/FROZEN", "other/e/a"):
            assert store.create(key, b"old")
        with store.pinned("r") as view:
            assert view.list_prefix("r") == ["r/FROZEN", "r/e/a"]
            assert store.delete_folder("r") and store.list_prefix("r") == []
            assert store.create("r/e/a", b"new")
            if view is not store:  # a store with folders: the view holds the old one
                assert view.list_prefix("r") == [] and view.delete_each(["r/e/a"]) == {}
                assert store.get("r/e/a") == b"new"
        assert store.list_prefix("other") == ["other/e/a"]

    def test_probe_accepts_a_usable_store_and_close_repeats(self) -> None:
        store = self.make_store()
        store.probe(must_exist=False)
        assert store.create("r/e/a", b"data")
        store.probe(must_exist=True)
        assert store.remove_stale_temporaries(0.0, 0.0) == 0, "nothing crashed mid-write"
        store.close()
        store.close()
