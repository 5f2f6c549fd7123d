"""A retrigger finalizes with the settings of the run it retries, under its file's claim.

An inbox file's run fails before it records its manifest (the capture store is briefly
unreachable: its local root moved away, or every S3 request dropped by a fault proxy). The
retrigger is then started with exactly the parameters the shipped trigger passes for that
failed run (`tests.support.shipped_triggers`), as the automation would.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from capture_core.run.inbox import read_claim, run_id_for_file
from capture_core.run.run_layout import RunLayout, read_ledger
from capture_core.storage import open_byte_store
from capture_core.store import TokenCaptureStore
from capture_core.store.capture_layout import retired_key
from tests.conftest import make_bucket
from tests.support.fault_proxy import FaultPlan, fault_proxy
from tests.support.pipeline_helpers import dest_records, make_batch, write_rollouts
from tests.support.prefect_api_reads import flow_run
from tests.support.reliability_figures import record_case
from tests.support.shipped_triggers import triggered_parameters
from tokcap.flows.inbox import FileSettings, finalize_inbox_file
from tokcap.flows.retrigger import retrigger_failed

pytestmark = pytest.mark.usefixtures("prefect_api")


@contextmanager
def local_store(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A local capture store whose root can be moved away (unreachable) and back."""
    root = tmp_path / "store"

    @contextmanager
    def unreachable() -> Iterator[None]:
        os.rename(root, tmp_path / "store-away")
        try:
            yield
        finally:
            os.rename(tmp_path / "store-away", root)

    yield {"store": str(root), "options": None, "unreachable": unreachable}


@contextmanager
def s3_store(s3_endpoint: str, s3_options: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """An S3 capture store behind a fault proxy that can drop every request."""
    plan = FaultPlan(rate=0.0, kinds=("drop-before",))
    with fault_proxy(s3_endpoint, plan) as proxy:

        @contextmanager
        def unreachable() -> Iterator[None]:
            plan.rate = 1.0
            try:
                yield
            finally:
                plan.rate = 0.0

        store = f"s3://{make_bucket(s3_options)}/captures"
        yield {"store": store, "options": {"endpoint_url": proxy}, "unreachable": unreachable}


@pytest.fixture(params=["local", "s3"])
def capture_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, Any]]:
    if request.param == "local":
        (tmp_path / "store").mkdir()
        with local_store(tmp_path) as store:
            yield store
    else:
        endpoint = request.getfixturevalue("s3_endpoint")
        with s3_store(endpoint, request.getfixturevalue("s3_options")) as store:
            yield store


@pytest.mark.integrity
def test_a_retrigger_of_an_inbox_run_that_failed_before_its_manifest_keeps_its_settings(
    tmp_path: Path, capture_store: dict[str, Any]
) -> None:
    store, options = capture_store["store"], capture_store["options"]
    inbox, dest = tmp_path / "inbox", str(tmp_path / "dest")
    records = make_batch(TokenCaptureStore(store, options), 2, task=41)
    url = write_rollouts(str(inbox / "gated.jsonl"), records)
    run_id = run_id_for_file(url)
    settings = FileSettings(
        inbox=str(inbox),
        store=store,
        dest=dest,
        storage_options=options,
        rows="parquet",
        delivery="all_traces",
        retire_after_consumer="trainer",
        group_by="task",
        max_group_size=2,
    )
    with capture_store["unreachable"]():
        failed = finalize_inbox_file(url, run_id, settings, return_state=True)
    assert failed.is_failed(), failed
    layout = RunLayout(open_byte_store(dest), run_id)
    assert layout.read_manifest() is None, "the run failed before it recorded its manifest"

    env = {"TOKCAP_INBOX": str(inbox), "TOKCAP_STORE": store, "TOKCAP_DEST": dest}
    failed_run = flow_run(failed.state_details.flow_run_id)
    parameters = triggered_parameters("retrigger-failed", failed_run, env)
    if options:  # the deployment's storage options, as a user deploys it for this endpoint
        parameters["storage_options"] = options
    state = retrigger_failed(**parameters, return_state=True)
    assert state.is_completed(), state

    manifest = layout.read_manifest()
    assert manifest is not None
    assert (manifest.rows, manifest.delivery, manifest.retire_after_consumer) == (
        "parquet",
        "all_traces",
        "trainer",
    ), "the retrigger finalized with the failed run's own settings"
    assert (manifest.group_by, manifest.max_group_size) == ("task", 2)
    delivered = dest_records(dest, run_id)
    assert len(delivered) == 2 and all("training_traces" in r for r in delivered)
    assert open_byte_store(dest).list_prefix(f"{run_id}/rows"), "trainer rows beside the part"
    ledger = read_ledger(open_byte_store(dest), run_id)
    assert ledger is not None and all(line.handed_off for line in ledger)
    assert not any(line.retired for line in ledger), "no consumer acknowledged: none retired"
    captures = open_byte_store(store, options)
    for rollout in ("41-0", "41-1"):
        assert not captures.exists(retired_key(rollout)), f"{rollout}'s capture is kept"
        assert captures.list_prefix(f"{rollout}/e"), f"{rollout}'s entries are kept"
    first, second = read_claim(layout.dest, run_id, 0), read_claim(layout.dest, run_id, 1)
    assert first is not None and second is not None, "the retrigger took the file's claim"
    assert str(state.state_details.flow_run_id) in second.owner
    record_case("a retrigger of a failed inbox run keeps its settings and takes its claim")
