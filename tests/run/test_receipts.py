"""Receipts are whole or absent: a full disk, an empty or torn receipt, and the re-run after.

A receipt is written create-only and durably through the destination's byte store, so a
write that fails leaves no object. A receipt that is provably empty or unparseable (one an
older writer left) means the handoff was not recorded: when its batch retired nothing, the
old part is set aside as evidence and the batch is handed off again; otherwise the run stops.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from capture_core.run.crash_points import CRASH_ENV
from capture_core.run.receipt import receipt_key
from capture_core.run.rollout_io import plan_rollout_file
from capture_core.run.run_layout import RunLayout
from capture_core.storage import filesystem_for, open_byte_store
from capture_core.store import TokenCaptureStore
from tests.support.pipeline_helpers import (
    dest_records,
    finalize_args,
    make_batch,
    receipt_args,
    run_cli,
    with_storage_options,
    write_rollouts,
)
from tests.support.reliability_figures import record_case
from tokcap.tasks.receipts import read_receipt

pytestmark = [pytest.mark.integrity, pytest.mark.usefixtures("prefect_api")]

COUNT = 4
MASKED = {1}
PAGE = 4096


def captured_inputs(base: str, options: dict | None = None) -> tuple[str, str]:
    """A store at `base/store` with the test's rollouts, and their rollout file."""
    store = f"{base}/store"
    records = make_batch(TokenCaptureStore(store, options), COUNT, masked=MASKED)
    return store, write_rollouts(f"{base}/in.jsonl", records, options)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, prefect_api: str) -> dict:
    """An uninterrupted run over the same captures: its records and the sizes it wrote."""
    base = str(tmp_path_factory.mktemp("reference"))
    store, rollouts = captured_inputs(base)
    dest = f"{base}/dest"
    done = run_cli(finalize_args(rollouts, store, dest, "ref"), prefect_api)
    assert done.returncode == 0, done.stderr[-2000:]
    layout = RunLayout(open_byte_store(dest), "ref")
    parts = layout.dest.list_prefix("ref/records")
    assert len(parts) == 1
    return {
        "records": dest_records(dest, "ref"),
        "part_bytes": len(layout.dest.get(parts[0]) or b""),
        "manifest_bytes": len(layout.dest.get(layout.manifest_key) or b""),
    }


def pages(size: int) -> int:
    return -(-size // PAGE) * PAGE


@pytest.fixture()
def small_disk(tmp_path):
    """A 2 MiB tmpfs mounted for the test (needs root), unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs to fill needs root; run the test as root")
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield str(mount)
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill_leaving(mount: str, free: int) -> str:
    """Fill the disk so that exactly `free` bytes remain; return the filler's path."""
    stat = os.statvfs(mount)
    available = stat.f_bavail * stat.f_frsize
    filler = os.path.join(mount, "filler")
    with open(filler, "wb") as f:
        f.write(b"\0" * (available - free))
    stat = os.statvfs(mount)
    assert stat.f_bavail * stat.f_frsize == free
    return filler


def only_batch_receipt(rollouts: str, options: dict | None = None) -> str:
    (batch,) = plan_rollout_file(rollouts, 500, options).batches
    return receipt_key(batch)


def retired(store: str, options: dict | None = None) -> set[int]:
    byte_store = TokenCaptureStore(store, options).byte_store
    return {i for i in range(COUNT) if f"7-{i}/RETIRED" in byte_store.list_prefix(f"7-{i}")}


def test_a_full_disk_leaves_no_receipt_and_the_rerun_completes(
    tmp_path, small_disk: str, prefect_api: str, reference: dict
) -> None:
    record_case("receipt write hits a full disk after the part was written")
    store, rollouts = captured_inputs(str(tmp_path))
    dest, run_id = f"{small_disk}/dest", "full"
    args = finalize_args(rollouts, store, dest, run_id)
    filler = fill_leaving(
        small_disk, pages(reference["manifest_bytes"]) + pages(reference["part_bytes"])
    )

    failed = run_cli(args, prefect_api)
    assert failed.returncode == 1, failed.stderr[-2000:]
    layout = RunLayout(open_byte_store(dest), run_id)
    assert len(layout.dest.list_prefix(f"{run_id}/records")) == 1, "the part was written"
    receipt = layout.receipt_key(only_batch_receipt(rollouts))
    assert not os.path.lexists(f"{dest}/{receipt}"), "a failed receipt write leaves no object"
    assert retired(store) == set(), "nothing retired without a receipt"

    os.unlink(filler)
    rerun = run_cli(args, prefect_api)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert dest_records(dest, run_id) == reference["records"]
    assert read_receipt(dest, run_id, only_batch_receipt(rollouts), None) is not None
    assert retired(store) == set(range(COUNT)) - MASKED


def plant(dest: str, key: str, data: bytes, options: dict | None) -> None:
    """Leave `data` at a destination key the way a plain, non-atomic writer would."""
    fs, root = filesystem_for(dest, options)
    path = f"{root.rstrip('/')}/{key}"
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    fs.pipe_file(path, data)


def captured_run(locations: dict, run_id: str) -> tuple[str, str, list[str]]:
    """Fresh captures beside the fixture's places: the store, rollout file and finalize args."""
    base = locations["store"].rsplit("/", 1)[0]
    store, rollouts = captured_inputs(base, locations["options"])
    args = finalize_args(rollouts, store, locations["dest"], run_id)
    return store, rollouts, with_storage_options(args, locations["options"])


@pytest.mark.parametrize("left", [b"", b'{"metadata": {"storage_key": "bat'])
def test_an_unrecorded_receipt_whose_batch_retired_nothing_is_handed_off_again(
    locations: dict, prefect_api: str, reference: dict, left: bytes
) -> None:
    record_case(f"{'empty' if not left else 'torn'} receipt left before any retirement")
    options, dest, run_id = locations["options"], locations["dest"], "unrecorded"
    store, rollouts, args = captured_run(locations, run_id)
    crashed = run_cli(args, prefect_api, env={CRASH_ENV: "after-upload"})
    assert crashed.returncode == -9, crashed.stderr[-1500:]
    layout = RunLayout(open_byte_store(dest, options), run_id)
    (part,) = layout.dest.list_prefix(f"{run_id}/records")
    old_part = layout.dest.get(part)
    name = only_batch_receipt(rollouts, options)
    plant(dest, layout.receipt_key(name), left, options)

    rerun = run_cli(args, prefect_api)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert dest_records(dest, run_id, options) == reference["records"]
    assert read_receipt(dest, run_id, name, options) is not None
    aside = layout.dest.list_prefix(layout.set_aside_prefix(name))
    assert any(key.endswith(part.rsplit("/", 1)[-1]) for key in aside), aside
    assert [layout.dest.get(k) for k in aside if k.endswith(".jsonl")] == [old_part]
    assert retired(store, options) == set(range(COUNT)) - MASKED


@pytest.mark.parametrize("forget_retirement", [False, True])
def test_an_unrecorded_receipt_of_a_retired_batch_stops_the_run(
    locations: dict, prefect_api: str, reference: dict, forget_retirement: bool
) -> None:
    """The guard on the re-handoff: a batch that may be retired is never finalized again."""
    record_case(
        "empty receipt left after its batch was retired"
        + (" and its retirement record lost" if forget_retirement else "")
    )
    options, dest, run_id = locations["options"], locations["dest"], "lost"
    store, rollouts, args = captured_run(locations, run_id)
    done = run_cli(args, prefect_api)
    assert done.returncode == 0, done.stderr[-2000:]
    layout = RunLayout(open_byte_store(dest, options), run_id)
    name = only_batch_receipt(rollouts, options)
    plant(dest, layout.receipt_key(name), b"", options)
    if forget_retirement:
        (recorded,) = [
            k for k in layout.dest.list_prefix(layout.receipts_prefix) if "-retired-" in k
        ]
        layout.dest.delete([recorded])
    parts_before = {k: layout.dest.get(k) for k in layout.dest.list_prefix(f"{run_id}/records")}
    ledger_before = layout.dest.get(layout.ledger_key)

    retrigger = with_storage_options(receipt_args("retrigger", dest, run_id, store), options)
    for command in (args, retrigger):
        again = run_cli(command, prefect_api)
        assert again.returncode == 1, again.stderr[-2000:]
        assert "restore it" in again.stderr.lower(), again.stderr[-2000:]
    parts_after = {k: layout.dest.get(k) for k in layout.dest.list_prefix(f"{run_id}/records")}
    assert parts_after == parts_before, "the handed-off part is never replaced"
    assert layout.dest.get(layout.ledger_key) == ledger_before, "the ledger still agrees"
    assert dest_records(dest, run_id, options) == reference["records"]
    assert layout.dest.list_prefix(layout.set_aside_prefix(name)) == []
