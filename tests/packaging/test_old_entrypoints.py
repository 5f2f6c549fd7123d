"""A deployment made with the entrypoints from before `tokcap.flows` fails in one line.

From a checkout, the old top-level `flows` and `tasks` would be found as folders and load a
second copy of every flow; they refuse instead, saying to redeploy. (From an installed wheel no
top-level `flows` exists at all: tests/packaging/test_wheel.py.)
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support.pipeline_helpers import REPO


@pytest.mark.parametrize(
    ("old", "says"),
    [
        ("import flows.inbox", "redeploy with the shipped prefect.yaml"),
        ("import tasks.receipts", "tokcap.tasks.<module>"),
    ],
)
def test_the_old_top_level_names_refuse_in_one_line(old: str, says: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", old], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: tokcap's ") and says in last, done.stderr[-2000:]


def test_prefect_loading_an_old_entrypoint_names_the_fix() -> None:
    code = (
        "from prefect.flows import load_flow_from_entrypoint\n"
        "load_flow_from_entrypoint('flows.finalize:finalize_run')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert done.returncode != 0
    assert "redeploy with the shipped prefect.yaml" in done.stderr, done.stderr[-2000:]


@pytest.mark.usefixtures("prefect_api")
def test_tokcap_deployments_check_names_each_old_deployment_and_the_fix(prefect_api: str) -> None:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        flow_id = client.create_flow_from_name("finalize-run")
        old = client.create_deployment(
            flow_id=flow_id,
            name="made-before",
            entrypoint="flows.finalize:finalize_run",
        )
        new = client.create_deployment(
            flow_id=flow_id, name="made-now", entrypoint="tokcap.flows.finalize:finalize_run"
        )
    try:
        done = subprocess.run(
            [sys.executable, "-m", "tokcap.flows.cli", "deployments", "--check"],
            env={**os.environ, "PREFECT_API_URL": prefect_api},
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        with get_client(sync_client=True) as client:
            client.delete_deployment(old)
            client.delete_deployment(new)
    assert done.returncode == 1, done.stdout + done.stderr
    (line,) = [x for x in done.stdout.splitlines() if "made-" in x]
    assert line.startswith("deployment finalize-run/made-before runs the old ")
    assert "redeploy: TOKCAP_INBOX=... " in line and "made-now" not in done.stdout
