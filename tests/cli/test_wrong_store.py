"""A `--store` that holds no capture of any input rollout is refused before the run starts.

A new user's likely mistake: `--store` naming the folder that holds the rollout files. The
run must refuse, naming the store and what it looked for, before anything is frozen,
written or claimed, through the CLI, a flow run and an inbox run alike; the run id stays
free for the right store. A re-run of a claimed run id whose tombstones were swept stays
safe: it is not checked again.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from capture_core.run.run_layout import read_manifest
from capture_core.storage import open_byte_store
from capture_core.store import TokenCaptureStore
from tests.conftest import make_bucket
from tests.support.pipeline_helpers import finalize_args, make_batch, run_cli, write_rollouts
from tests.support.prefect_api_reads import flow_runs_named
from tests.support.reliability_figures import record_case
from tokcap.flows.finalize import finalize_run
from tokcap.flows.inbox import FileSettings, InboxFailedError, finalize_inbox

pytestmark = pytest.mark.usefixtures("prefect_api")


def tree(folder: Path) -> list[str]:
    """Every path below `folder`, so a test can show nothing was written there."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def rollouts_beside_their_captures(tmp_path: Path) -> tuple[Path, str, str]:
    """A capture store with 4 rollouts, and their rollout file in a folder of its own."""
    records = make_batch(TokenCaptureStore(str(tmp_path / "store")), 4)
    data = tmp_path / "data"
    rollouts = write_rollouts(str(data / "rollouts.jsonl"), records)
    return data, rollouts, str(tmp_path / "store")


@pytest.mark.integrity
def test_finalize_with_the_rollouts_folder_as_store_is_refused_and_keeps_the_run_id(
    tmp_path: Path, prefect_api: str
) -> None:
    data, rollouts, store = rollouts_beside_their_captures(tmp_path)
    dest = str(tmp_path / "dest")
    before = tree(data)
    result = run_cli(finalize_args(rollouts, str(data), dest, "first-run"), prefect_api)
    assert result.returncode == 2, (result.stdout, result.stderr[-2000:])
    assert f"store {data} holds no capture of any of the 4 rollouts" in result.stderr
    assert "7-0/" in result.stderr and "FROZEN" in result.stderr, "it says what it looked for"
    assert "complete" not in result.stdout
    assert tree(data) == before, "nothing was written into the rollouts folder"
    assert not os.path.exists(dest) or read_manifest(open_byte_store(dest), "first-run") is None
    assert flow_runs_named(f"finalize first-run from {rollouts}") == [], "no run was started"
    fixed = run_cli(finalize_args(rollouts, store, dest, "first-run"), prefect_api)
    assert fixed.returncode == 0, fixed.stderr[-2000:]
    assert "complete: 4 of 4 rollouts handed off" in fixed.stdout, "the run id was still free"
    record_case("a store that holds no capture of the input is refused before the run")


@pytest.mark.integrity
@pytest.mark.parametrize("backend", ["local", "s3"])
def test_a_flow_run_against_a_store_without_captures_fails_before_it_freezes(
    tmp_path: Path, request: pytest.FixtureRequest, backend: str
) -> None:
    data, rollouts, _store = rollouts_beside_their_captures(tmp_path)
    options = None
    wrong = str(data)
    if backend == "s3":
        options = request.getfixturevalue("s3_options")
        wrong = f"s3://{make_bucket(options)}/captures"
        open_byte_store(wrong, options).create("unrelated/object", b"not a capture")
        options = {"endpoint_url": options["endpoint_url"]}
    before = tree(data)
    dest = str(tmp_path / "dest")
    state = finalize_run(
        rollouts, wrong, dest, "flow-run", storage_options=options, return_state=True
    )
    assert state.is_failed(), state
    assert f"store {wrong} holds no capture of any of the 4 rollouts" in state.message
    assert tree(data) == before
    if backend == "s3":
        assert open_byte_store(wrong, options).list_children("") == ["unrelated"]
    assert not os.path.exists(dest) or read_manifest(open_byte_store(dest), "flow-run") is None


@pytest.mark.integrity
def test_an_inbox_run_against_a_store_without_captures_fails_naming_the_store(
    tmp_path: Path,
) -> None:
    records = make_batch(TokenCaptureStore(str(tmp_path / "store")), 3)
    inbox = tmp_path / "inbox"
    write_rollouts(str(inbox / "batch-1.jsonl"), records)
    wrong = tmp_path / "empty-store"
    wrong.mkdir()
    settings = FileSettings(inbox=str(inbox), store=str(wrong), dest=str(tmp_path / "dest"))
    with pytest.raises(InboxFailedError) as failed:
        finalize_inbox(settings)
    assert f"store {wrong} holds no capture of any of the 3 rollouts" in str(failed.value)
    assert tree(wrong) == [], "tokcap wrote nothing into a folder that is no capture store"


def test_a_rerun_after_the_tombstones_were_swept_is_not_refused(
    tmp_path: Path, prefect_api: str
) -> None:
    """A claimed run id was checked when it was claimed: re-running it after every capture
    was retired and swept reports the handed-off batches again, and is not refused."""
    _data, rollouts, store = rollouts_beside_their_captures(tmp_path)
    dest = str(tmp_path / "dest")
    args = finalize_args(rollouts, store, dest, "swept")
    assert run_cli(args, prefect_api).returncode == 0
    for folder in Path(store).iterdir():
        shutil.rmtree(folder)  # what sweep_retired leaves once the tombstones are old
    again = run_cli(args, prefect_api)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "already handed off (earlier run)  4" in again.stdout


@pytest.mark.integrity
def test_finalize_after_a_clear_of_its_rollouts_says_they_were_cleared(
    tmp_path: Path, prefect_api: str
) -> None:
    """`tokcap clear` run after the rollouts finished (a newcomer's wrong order) deletes their
    captures and leaves the attempt markers: finalize says the store was cleared for them,
    not that it is another store, and that the clear belongs before dispatch."""
    _data, rollouts, store = rollouts_beside_their_captures(tmp_path)
    cleared = run_cli(["clear", "--rollouts", rollouts, "--store", store], prefect_api)
    assert cleared.returncode == 0, cleared.stderr[-2000:]
    dest = str(tmp_path / "dest")
    result = run_cli(finalize_args(rollouts, store, dest, "after-clear"), prefect_api)
    assert result.returncode == 2, (result.stdout, result.stderr[-2000:])
    assert "It is not the capture store" not in result.stderr
    assert "was cleared for all 4 of them" in result.stderr, result.stderr[-2000:]
    assert "before the rollouts are dispatched" in result.stderr
    assert "dispatch the rollouts again" in result.stderr
    assert not os.path.exists(dest) or read_manifest(open_byte_store(dest), "after-clear") is None
