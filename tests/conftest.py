"""Session fixtures: real S3 (a moto server subprocess), stores on every backend, run locations."""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Iterator

import pytest

from capture_core.store import TokenCaptureStore
from tests.support import backends, reliability_figures
from tests.support.servers import FAKE_AWS_ENV, moto_server

_PREFECT_HOME = tempfile.mkdtemp(prefix="tokcap-prefect-home-")
for _name, _value in {
    **FAKE_AWS_ENV,
    "PREFECT_HOME": _PREFECT_HOME,
    "PREFECT_LOGGING_LEVEL": "WARNING",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90",
    # Transient failures are still retried three times, each one real, but without the
    # shipped 15 s of waits (1, 4, 10): the fault tests' outages outlast every retry anyway.
    # tests/flows/test_retry_delays.py pins the shipped waits. Subprocesses inherit it.
    "TOKCAP_RETRY_DELAYS": "0.2,0.5,1",
}.items():
    os.environ[_name] = _value


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """Send each test file to one pytest-xdist worker as a unit, so its module fixtures
    (workers, servers) start once, and every `test_real_engine*` file to the same worker,
    so one vLLM engine (about 3 GiB, a minute to start) serves them all."""
    if config.getvalue("dist") != "load":  # the default under `-n`; another `--dist` wins
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByFile(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "real-engine" if os.path.basename(path).startswith("test_real_engine") else path

    return ByFile(config, log)


@pytest.fixture(autouse=True)
def _integrity_marker(request: pytest.FixtureRequest) -> Iterator[None]:
    """Let `record_case` refuse an attack case recorded by a test without the integrity mark."""
    reliability_figures.running_test_is_marked = (
        request.node.get_closest_marker("integrity") is not None
    )
    yield
    reliability_figures.running_test_is_marked = False


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    with moto_server() as endpoint:
        yield endpoint


@pytest.fixture(scope="session")
def s3_options(s3_endpoint: str) -> dict[str, object]:
    return {"endpoint_url": s3_endpoint, "key": "testing", "secret": "testing"}


def make_bucket(s3_options: dict[str, object]) -> str:
    import s3fs

    bucket = f"tokcap-{uuid.uuid4().hex[:12]}"
    s3fs.S3FileSystem(**s3_options).mkdir(bucket)
    return bucket


@pytest.fixture()
def s3_url(s3_options: dict[str, object]) -> str:
    return f"s3://{make_bucket(s3_options)}/captures"


@pytest.fixture(params=backends.ALL_BACKENDS)
def store_location(request: pytest.FixtureRequest, tmp_path) -> tuple[str, dict[str, object]]:
    """(root URL, storage options) for a fresh store on each backend."""
    return backends.store_location(request.param, request, tmp_path)


@pytest.fixture()
def store(store_location: tuple[str, dict[str, object]]) -> TokenCaptureStore:
    """A fresh, empty capture store on each backend."""
    root, options = store_location
    return TokenCaptureStore(root, options)


@pytest.fixture(params=backends.PROCESS_SHARED_BACKENDS)
def shared_store_location(
    request: pytest.FixtureRequest, tmp_path
) -> tuple[str, dict[str, object]]:
    """(root URL, storage options) for a fresh store that other processes can open."""
    return backends.store_location(request.param, request, tmp_path)


@pytest.fixture(params=backends.PROCESS_SHARED_BACKENDS)
def locations(request: pytest.FixtureRequest, tmp_path) -> dict:
    """Store, destination, rollout-file and inbox locations that other processes can open.

    Their `options` carry no credentials: on S3 those come from the AWS environment, as they
    would for a user, so the CLI and Prefect task runs see the same locations.
    """
    names = {"store": "store", "dest": "dest", "rollouts": "in/rollouts.jsonl", "inbox": "inbox"}
    if request.param == "local":
        return {**{key: str(tmp_path / name) for key, name in names.items()}, "options": None}
    bucket = make_bucket(request.getfixturevalue("s3_options"))
    return {
        **{key: f"s3://{bucket}/{name}" for key, name in names.items()},
        "options": {"endpoint_url": request.getfixturevalue("s3_endpoint")},
    }


@pytest.fixture()
def run_inputs(tmp_path) -> dict[str, str]:
    """A local store with 4 captured rollouts (one masked), their rollout file, a dest path."""
    from tests.support.pipeline_helpers import (  # imports Prefect: not at load
        make_batch,
        write_rollouts,
    )

    store = str(tmp_path / "store")
    records = make_batch(TokenCaptureStore(store), 4, masked={1})
    rollouts = write_rollouts(str(tmp_path / "in.jsonl"), records)
    return {"store": store, "dest": str(tmp_path / "dest"), "rollouts": rollouts}


@pytest.fixture(scope="session")
def prefect_api() -> Iterator[str]:
    """One Prefect test server per session; yields its API URL for subprocesses."""
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield str(PREFECT_API_URL.value())
