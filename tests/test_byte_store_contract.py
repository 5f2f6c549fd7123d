"""The byte-store contract, once per backend: local disk, `memory://` and S3 (moto server).

Each behaviour of `capture_core.storage.ByteStore` is its own test (see
`capture_core.testing.contracts.ByteStoreContract`), so one failure never hides another.
"""

from __future__ import annotations

import os

from capture_core.storage import ByteStore, FsspecStore, LocalStore, open_byte_store
from capture_core.testing.contracts import ByteStoreContract
from tests.backends import OnBackend


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
