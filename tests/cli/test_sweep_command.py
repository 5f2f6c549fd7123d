"""`tokcap sweep` as a real subprocess and the sweep flow on the session's Prefect API."""

from __future__ import annotations

import re

import pytest

from capture_core.store import TokenCaptureStore
from tests.store.test_sweep import DAY, age_tombstone, retire
from tests.support.pipeline_helpers import run_cli
from tests.support.prefect_api_reads import artifacts_of, eventually, flow_runs_named, logs_of
from tests.support.servers import free_port
from tokcap.flows.sweep import sweep_retired_captures

pytestmark = pytest.mark.usefixtures("prefect_api")


def store_args(locations: dict) -> list[str]:
    """`--store` and, on S3, the endpoint option of a `locations` fixture."""
    options = locations["options"] or {}
    return ["--store", locations["store"]] + [
        arg for key, value in options.items() for arg in ("--storage-option", f"{key}={value}")
    ]


@pytest.mark.parametrize(
    ("age", "message"),
    [
        ("3x", r"argument --older-than: '3x' is not a duration; use a whole number and a unit"),
        ("2 days", r"'2 days' is not a duration"),
        ("10m", r"10m is below the 1h minimum: a writer of a recently retired attempt"),
        ("0s", r"0s is below the 1h minimum"),
    ],
)
def test_a_malformed_or_unsafe_age_is_refused_in_one_line_before_any_server(
    tmp_path, age: str, message: str
) -> None:
    store = tmp_path / "store"
    store.mkdir()
    unreachable = f"http://127.0.0.1:{free_port()}/api"
    result = run_cli(["sweep", "--store", str(store), "--older-than", age], unreachable)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert re.search(message, lines[0]), lines[0]


def test_a_missing_store_is_refused_before_any_server(tmp_path) -> None:
    unreachable = f"http://127.0.0.1:{free_port()}/api"
    result = run_cli(["sweep", "--store", str(tmp_path / "none")], unreachable)
    assert result.returncode == 2
    assert f"--store {tmp_path / 'none'} is not a directory" in result.stderr


def test_sweep_prints_the_count_and_reports_it_in_the_ui(locations, prefect_api: str) -> None:
    store = TokenCaptureStore(locations["store"], locations["options"])
    for rollout_id in ("a-1", "a-2", "fresh"):
        retire(store, rollout_id)
    for rollout_id in ("a-1", "a-2"):
        age_tombstone(store, rollout_id, 2 * DAY)
    args = ["sweep", *store_args(locations), "--older-than", "36h"]
    result = run_cli(args, prefect_api, env={"PREFECT_LOGGING_LEVEL": "INFO"})
    assert result.returncode == 0, result.stderr[-2000:]
    assert (
        f"swept 2 retired rollouts' tombstones older than 36h from {locations['store']}"
        in result.stdout
    )
    assert store.byte_store.list_children("") == ["fresh"]

    name = f"sweep tombstones older than 36h in {locations['store']}"
    (run,) = flow_runs_named(name)
    assert run.state.is_completed()
    table = eventually(
        lambda: artifacts_of(flow_run_id=run.id),
        lambda found: any(a.key == "tokcap-sweep" for a in found),
        "the sweep's table artifact",
    )
    assert '"tombstones swept": 2' in str(next(a.data for a in table if a.key == "tokcap-sweep"))
    logs = eventually(
        lambda: logs_of(run.id),
        lambda found: any("2 retired rollouts' tombstones" in log.message for log in found),
        "the sweep count in the flow-run log",
    )
    assert logs

    again = run_cli(["sweep", *store_args(locations)], prefect_api)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "swept 0 retired rollouts' tombstones older than 2d" in again.stdout
    assert store.byte_store.list_children("") == ["fresh"], "the default age keeps a fresh one"


def test_the_flow_refuses_an_unsafe_age_and_sweeps_nothing(tmp_path) -> None:
    store = TokenCaptureStore(str(tmp_path / "store"))
    retire(store, "old")
    age_tombstone(store, "old", 2 * DAY)
    with pytest.raises(ValueError, match=r"10m is below the 1h minimum"):
        sweep_retired_captures(store.root, "10m")
    assert store.byte_store.list_prefix("old") == ["old/FROZEN", "old/RETIRED"]
