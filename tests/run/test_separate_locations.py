"""The capture store, the destination and the inbox must be separate locations.

With `--dest` equal to `--store`, a dispatch-time clear of a rollout whose id equals a run id
would delete that run's parts, receipts, manifest and ledger. Every command and every flow
refuses overlapping locations before it touches anything, in one line naming both.
"""

from __future__ import annotations

import os

import pytest

from capture_core.errors import OverlappingLocationsError
from capture_core.storage import locations_overlap
from capture_core.store import TokenCaptureStore
from tests.support.pipeline_helpers import (
    finalize_args,
    make_batch,
    receipt_args,
    run_cli,
    with_storage_options,
    write_rollouts,
)
from tests.support.reliability_figures import record_case
from tokcap.flows.finalize import finalize_run, retire_uploaded
from tokcap.flows.inbox import FileSettings, finalize_inbox
from tokcap.flows.retrigger import retrigger_failed

pytestmark = pytest.mark.integrity


def test_spellings_of_one_place_overlap(tmp_path) -> None:
    root = str(tmp_path / "data")
    os.makedirs(f"{root}/store")
    os.symlink(f"{root}/store", str(tmp_path / "link"))
    same = [
        f"file://{root}/store",
        f"local://{root}/store/",
        f"{root}/other/../store",
        str(tmp_path / "link"),
        f"{root}/store/dest",
        root,
    ]
    assert [locations_overlap(f"{root}/store", other) for other in same] == [True] * len(same)
    apart = [f"{root}/store2", f"{root}/dest", "s3://b/store", "memory://x/store"]
    assert [locations_overlap(f"{root}/store", other) for other in apart] == [False] * 4
    s3_same = ["s3a://b/p/", "s3://b/p/q", "s3://b", "s3://b/x/../p"]
    assert [locations_overlap("s3://b/p", other) for other in s3_same] == [True] * 4
    s3_apart = ["s3://b/p2", "s3://c/p", "memory://b/p"]
    assert [locations_overlap("s3://b/p", other) for other in s3_apart] == [False] * 3


@pytest.fixture()
def captured(locations: dict) -> dict:
    """A store with two captured rollouts and their rollout file, at the fixture's places."""
    options = locations["options"]
    records = make_batch(TokenCaptureStore(locations["store"], options), 2)
    write_rollouts(locations["rollouts"], records, options)
    return locations


def dest_keys(url: str, options: dict | None) -> list[str]:
    from capture_core.storage import open_byte_store

    return open_byte_store(url, options).list_prefix("run")


@pytest.mark.usefixtures("prefect_api")
def test_every_command_refuses_overlapping_locations(captured: dict, prefect_api: str) -> None:
    record_case("store and destination are the same location")
    store, options = captured["store"], captured["options"]
    inside = f"{store.rstrip('/')}/runs"
    if "://" not in store:
        os.makedirs(inside)  # so retire's check that its --dest exists passes
    spelled = store + "/" if "://" in store else f"file://{store}/"
    commands = [
        finalize_args(captured["rollouts"], store, spelled, "run"),
        finalize_args(captured["rollouts"], store, inside, "run"),
        receipt_args("retire", inside, "run", store),
        receipt_args("retrigger", store, "run", store),
        ["serve", "--inbox", captured["inbox"], "--store", store, "--dest", inside],
        ["serve", "--inbox", captured["dest"], "--store", store, "--dest", captured["dest"]],
    ]
    for args in commands:
        serve = args[0] == "serve"  # serve takes no storage options
        done = run_cli(args if serve else with_storage_options(args, options), prefect_api)
        assert done.returncode == 2, (args, done.stdout, done.stderr[-1500:])
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, (args, lines)
        assert "are the same location or one lies inside the other" in lines[0]
        flags = [flag for flag in ("--store", "--dest", "--inbox") if flag in lines[0]]
        assert len(flags) == 2, lines[0]
    assert dest_keys(store, options) == [], "no run was written into the store"
    assert dest_keys(inside, options) == []


@pytest.mark.usefixtures("prefect_api")
def test_every_flow_refuses_overlapping_locations(captured: dict) -> None:
    record_case("a deployment run with overlapping store and destination")
    store, options = captured["store"], captured["options"]
    inside = f"{store.rstrip('/')}/runs"
    runs = [
        lambda: finalize_run(captured["rollouts"], store, inside, "run", storage_options=options),
        lambda: retire_uploaded(inside, "run", store, options),
        lambda: retrigger_failed(store, "run", store, options),
        lambda: finalize_inbox(
            FileSettings(
                inbox=captured["inbox"],
                store=store,
                dest=captured["inbox"],
                storage_options=options,
            )
        ),
    ]
    for run in runs:
        with pytest.raises(OverlappingLocationsError, match="one lies inside the other"):
            run()
    assert dest_keys(store, options) == []
    assert dest_keys(inside, options) == []
    assert dest_keys(captured["inbox"], options) == []


@pytest.mark.usefixtures("prefect_api")
def test_a_chained_url_names_the_place_it_reads(captured: dict) -> None:
    """`simplecache::s3://b/dest` reads `s3://b/dest`: the outer protocols cache, not move it."""
    record_case("an inbox spelled as a chained URL of the destination")
    dest, options = captured["dest"], captured["options"]
    for outer in ("simplecache::", "blockcache::", "filecache::simplecache::"):
        assert locations_overlap(f"{outer}{dest}", dest)
        assert locations_overlap(f"{outer}{dest}/inbox", dest)
        assert not locations_overlap(f"{outer}{dest}", captured["store"])
    with pytest.raises(OverlappingLocationsError, match="one lies inside the other"):
        finalize_inbox(
            FileSettings(
                inbox=f"simplecache::{dest}",
                store=captured["store"],
                dest=dest,
                storage_options=options,
            )
        )
