"""The storage backends tests run on, in one place: local disk, `memory://` and S3 (moto).

`ALL_BACKENDS` is every backend; `PROCESS_SHARED_BACKENDS` leaves out `memory://`, which
lives inside one process, for tests whose clients are other processes (workers, the CLI,
Prefect task runs).
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

ALL_BACKENDS = ("local", "memory", "s3")
PROCESS_SHARED_BACKENDS = ("local", "s3")


def store_location(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> tuple[str, dict[str, object]]:
    """(root URL, storage options) for a fresh, empty store on `backend`."""
    if backend == "local":
        return str(tmp_path / "store"), {}
    if backend == "memory":
        return f"memory://tokcap-{uuid.uuid4().hex[:12]}", {}
    if backend == "s3":
        from tests.conftest import make_bucket

        options = request.getfixturevalue("s3_options")
        return f"s3://{make_bucket(options)}/captures", dict(options)
    raise ValueError(f"unknown backend {backend!r}; the backends are {ALL_BACKENDS}")


class OnBackend:
    """A test-class mixin: `self.root` and `self.options` locate a fresh store on `backend`."""

    backend: str
    root: str
    options: dict[str, object]

    @pytest.fixture(autouse=True)
    def _fresh_location(self, request: pytest.FixtureRequest, tmp_path: Path) -> None:
        self.root, self.options = store_location(self.backend, request, tmp_path)
