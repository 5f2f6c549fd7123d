"""The byte-store contract, once per backend: local disk, `memory://` and S3 (moto server).

Each behaviour of `capture_core.storage.ByteStore` is its own test (see
`capture_core.testing.contracts.ByteStoreContract`), so one failure never hides another.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from capture_core.storage import ByteStore, FsspecStore, LocalStore, check_key, open_byte_store
from capture_core.testing.contracts import ByteStoreContract
from tests.support.backends import OnBackend


@given(st.text(alphabet="a./", max_size=8))
def test_check_key_accepts_exactly_keys_of_non_empty_undotted_segments(key: str) -> None:
    """The fast path of `check_key` decides as the segment-by-segment rule does."""
    valid = all(part and not part.startswith(".") for part in key.split("/"))
    if valid:
        assert check_key(key) == key
    else:
        with pytest.raises(ValueError):
            check_key(key)


class BackendByteStoreContract(OnBackend, ByteStoreContract):
    def make_store(self) -> ByteStore:
        return open_byte_store(self.root, self.options)


class TestLocalByteStore(BackendByteStoreContract):
    backend = "local"

    def make_store(self) -> ByteStore:
        store = super().make_store()
        assert isinstance(store, LocalStore)
        return store

    def plant_reserved(self, store: ByteStore, key: str, data: bytes) -> None:
        path = os.path.join(self.root, key)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)


class FsspecByteStoreContract(BackendByteStoreContract):
    def make_store(self) -> ByteStore:
        store = super().make_store()
        assert isinstance(store, FsspecStore)
        return store

    def plant_reserved(self, store: ByteStore, key: str, data: bytes) -> None:
        assert isinstance(store, FsspecStore)
        root = store.url.split("://", 1)[1]
        store.fs.pipe_file(f"{root}/{key}", data)
        found = [path.lstrip("/") for path in store.fs.find(root)]
        assert f"{root}/{key}" in found, "the planted object is where the store lists"


class TestMemoryByteStore(FsspecByteStoreContract):
    backend = "memory"


class TestS3ByteStore(FsspecByteStoreContract):
    backend = "s3"
