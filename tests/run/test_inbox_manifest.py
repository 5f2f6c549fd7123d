"""Attack on the inbox with one run's manifest torn or edited: that file is refused by name,
and the pass still finalizes every other file.

The inbox reads each run's manifest to tell a replaced file from the one its run recorded,
so an unreadable manifest must be a refusal of its own file, never a failure of the scan.
Flows run against the session's real Prefect server; S3 is a real moto server.
"""

from __future__ import annotations

import pytest

from capture_core.run.inbox import run_id_for_file
from capture_core.run.run_layout import RunLayout
from capture_core.storage import open_byte_store
from capture_core.store import TokenCaptureStore
from tests.run.test_inbox_replaced import publish
from tests.support.pipeline_helpers import dest_records, make_batch, rollout_ids
from tests.support.reliability_figures import record_case
from tokcap.flows.inbox import FileSettings, InboxFailedError, finalize_inbox

pytestmark = [pytest.mark.integrity, pytest.mark.usefixtures("prefect_api")]


def test_a_torn_manifest_refuses_its_file_and_the_pass_goes_on(locations) -> None:
    options, inbox, dest_url = locations["options"], locations["inbox"], locations["dest"]
    store = TokenCaptureStore(locations["store"], options)
    first = publish(f"{inbox}/a.jsonl", make_batch(store, 2), options)

    def inbox_pass():
        return finalize_inbox(
            FileSettings(
                inbox=inbox, store=locations["store"], dest=dest_url, storage_options=options
            )
        )

    assert inbox_pass().finalized == [first]
    layout = RunLayout(open_byte_store(dest_url, options), run_id_for_file(first))
    torn = layout.dest.get(layout.manifest_key)
    assert torn is not None
    layout.dest.replace(layout.manifest_key, torn[: len(torn) // 2])  # edited, or torn
    second = publish(f"{inbox}/b.jsonl", make_batch(store, 2, task=8), options)

    with pytest.raises(InboxFailedError) as failed:
        inbox_pass()
    report = failed.value.summary
    assert report.finalized == [second], "the other file is finalized"
    assert list(report.failed) == [first], report.failed
    reason = report.failed[first]
    assert layout.manifest_key in reason and "restore it" in reason, reason
    assert sorted(rollout_ids(dest_records(dest_url, run_id_for_file(second), options))) == [
        "8-0",
        "8-1",
    ]
    record_case("a torn run manifest stops every inbox pass", records_lost=0)
