"""SIGKILL the finalize process at every named point, re-run, and compare with a clean run."""

from __future__ import annotations

import pytest

from capture_core.run.crash_points import CRASH_ENV, CRASH_POINTS
from capture_core.run.receipt import receipt_key
from capture_core.run.rollout_io import plan_rollout_file
from capture_core.storage import open_byte_store
from capture_core.store import TokenCaptureStore
from tests.support.attempts import captured_keys
from tests.support.pipeline_helpers import (
    dest_records,
    finalize_args,
    make_batch,
    rollout_ids,
    run_cli,
    write_rollouts,
)
from tests.support.reliability_figures import record_figure
from tokcap.tasks.receipts import read_receipt

pytestmark = [pytest.mark.integrity, pytest.mark.usefixtures("prefect_api")]

MASKED = {4}
COUNT = 6
FINALIZE_POINTS = [point for point in CRASH_POINTS if point != "mid-clear"]


def crash_args(rollouts: str, store: str, dest: str, run_id: str) -> list[str]:
    return finalize_args(rollouts, store, dest, run_id, "--batch-size", "2")


@pytest.fixture(scope="module")
def reference(tmp_path_factory, prefect_api: str) -> list[dict]:
    """The records of an uninterrupted run over the same captures."""
    base = tmp_path_factory.mktemp("reference")
    store, dest = str(base / "store"), str(base / "dest")
    rollouts = write_rollouts(
        str(base / "in.jsonl"), make_batch(TokenCaptureStore(store), COUNT, masked=MASKED)
    )
    done = run_cli(crash_args(rollouts, store, dest, "ref"), prefect_api)
    assert done.returncode == 0, done.stderr[-2000:]
    return dest_records(dest, "ref")


def assert_nothing_retired_without_receipt(
    store: str, dest: str, rollouts: str, run_id: str
) -> None:
    plan = plan_rollout_file(rollouts, 2)
    byte_store = TokenCaptureStore(store).byte_store
    for batch in plan.batches:
        has_receipt = read_receipt(dest, run_id, receipt_key(batch), None) is not None
        for i in range(batch.index * 2, batch.index * 2 + 2):
            if f"7-{i}/RETIRED" in byte_store.list_prefix(f"7-{i}"):
                assert has_receipt, f"7-{i} was retired before its batch had a receipt"


@pytest.mark.parametrize("point", FINALIZE_POINTS)
def test_crash_then_rerun_gives_the_clean_run_output(
    point: str, tmp_path, prefect_api: str, reference: list[dict]
) -> None:
    store, dest = str(tmp_path / "store"), str(tmp_path / "dest")
    rollouts = write_rollouts(
        str(tmp_path / "in.jsonl"), make_batch(TokenCaptureStore(store), COUNT, masked=MASKED)
    )
    args = crash_args(rollouts, store, dest, "crashy")
    crashed = run_cli(args, prefect_api, env={CRASH_ENV: point})
    assert crashed.returncode == -9, f"expected SIGKILL at {point}: {crashed.stderr[-1500:]}"
    assert_nothing_retired_without_receipt(store, dest, rollouts, "crashy")
    rerun = run_cli(args, prefect_api)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    records = dest_records(dest, "crashy")
    assert rollout_ids(records) == [f"7-{i}" for i in range(COUNT)]
    assert records == reference, "the re-run's records equal an uninterrupted run's"
    record_figure("crash_points_survived", 1)
    record_figure("records_lost", len(reference) - len(records))
    byte_store = TokenCaptureStore(store).byte_store
    for i in range(COUNT):
        keys = byte_store.list_prefix(f"7-{i}")
        assert (f"7-{i}/RETIRED" in keys) is (i not in MASKED)
        assert any("/e/" in k for k in keys) is (i in MASKED), "masked evidence kept"


S3_POINTS = [
    "after-upload",
    "mid-retire",
    pytest.param("after-finalize", marks=pytest.mark.slow),
    pytest.param("mid-upload", marks=pytest.mark.slow),
    pytest.param("after-receipt", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("point", S3_POINTS)
def test_crash_on_s3_then_rerun_gives_the_clean_run_output(
    point: str, tmp_path, s3_options, prefect_api: str, reference: list[dict]
) -> None:
    from tests.conftest import make_bucket

    bucket = make_bucket(s3_options)
    endpoint = str(s3_options["endpoint_url"])
    store, dest = f"s3://{bucket}/store", f"s3://{bucket}/dest"
    options = {"endpoint_url": endpoint}
    rollouts = write_rollouts(
        f"s3://{bucket}/in.jsonl",
        make_batch(TokenCaptureStore(store, options), COUNT, masked=MASKED),
        options,
    )
    args = [
        *crash_args(rollouts, store, dest, "crashy"),
        "--storage-option",
        f"endpoint_url={endpoint}",
    ]
    crashed = run_cli(args, prefect_api, env={CRASH_ENV: point})
    assert crashed.returncode == -9, f"expected SIGKILL at {point}: {crashed.stderr[-1500:]}"
    rerun = run_cli(args, prefect_api)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    records = dest_records(dest, "crashy", options)
    assert records == reference
    byte_store = TokenCaptureStore(store, options).byte_store
    for i in range(COUNT):
        assert (f"7-{i}/RETIRED" in byte_store.list_prefix(f"7-{i}")) is (i not in MASKED)
    record_figure("crash_points_survived", 1)
    record_figure("records_lost", len(reference) - len(records))


def test_crash_mid_clear_then_rerun_clears_everything(tmp_path, prefect_api: str) -> None:
    store = str(tmp_path / "store")
    records = make_batch(TokenCaptureStore(store), 4)
    rollouts = write_rollouts(str(tmp_path / "in.jsonl"), records)
    crashed = run_cli(
        ["clear", "--rollouts", rollouts, "--store", store],
        prefect_api,
        env={CRASH_ENV: "mid-clear"},
    )
    assert crashed.returncode == -9
    remaining = [i for i in range(4) if captured_keys(open_byte_store(store), f"7-{i}")]
    assert len(remaining) == 3, "killed after the first deletion"
    again = run_cli(["clear", "--rollouts", rollouts, "--store", store], prefect_api)
    assert again.returncode == 0, again.stderr[-1500:]
    assert "cleared 4 rollouts' captures" in again.stdout
    record_figure("crash_points_survived", 1)
    assert not any(captured_keys(open_byte_store(store), f"7-{i}") for i in range(4))
