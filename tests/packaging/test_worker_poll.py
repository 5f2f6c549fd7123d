"""The shipped worker poll: every way tokcap tells a user to start a worker asks for runs
every `WORKER_QUERY_SECONDS`, not Prefect's default 10 s.

A submitted file's run waits on average half the poll for a free worker, so a worker started
as documented (the command in the READMEs, the image of deployments/Dockerfile, `tokcap
serve`) must carry the shipped value, and Prefect must read it as that many seconds.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.pipeline_helpers import REPO
from tokcap.flows.serve import WORKER_QUERY_SECONDS, runner_query_seconds

ROOT = Path(REPO)
SETTING = f"PREFECT_WORKER_QUERY_SECONDS={WORKER_QUERY_SECONDS}"
GUIDES = [ROOT / "README.md", ROOT / "deployments" / "README.md"]


def test_the_shipped_poll_is_shorter_than_prefects_default() -> None:
    from prefect.settings import Settings

    assert 0 < WORKER_QUERY_SECONDS < 10
    assert Settings().worker.query_seconds == 10  # the default the shipped value replaces


def test_the_worker_image_polls_at_the_shipped_interval() -> None:
    text = (ROOT / "deployments" / "Dockerfile").read_text(encoding="utf-8")
    env_lines = [line for line in text.splitlines() if line.startswith("ENV ")]
    assert any(SETTING in line.split() for line in env_lines), env_lines
    assert 'exec prefect worker start --pool \\"$TOKCAP_POOL\\"' in text


@pytest.mark.parametrize("guide", GUIDES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_documented_worker_command_sets_the_poll(guide: Path) -> None:
    text = guide.read_text(encoding="utf-8")
    commands = re.findall(r"(\S*)\s*prefect worker start --pool tokcap-process", text)
    assert commands, f"{guide} documents no worker command"
    assert all(prefix.lstrip("`") == SETTING for prefix in commands), commands


def test_prefect_reads_the_shipped_value_as_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    from prefect.settings import Settings

    name, value = SETTING.split("=")
    monkeypatch.setenv(name, value)
    assert Settings().worker.query_seconds == WORKER_QUERY_SECONDS


def test_tokcap_serve_polls_at_the_shipped_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PREFECT_RUNNER_POLL_FREQUENCY", raising=False)
    assert runner_query_seconds() == WORKER_QUERY_SECONDS
    monkeypatch.setenv("PREFECT_RUNNER_POLL_FREQUENCY", "7")
    assert runner_query_seconds() is None  # an operator's own setting wins
