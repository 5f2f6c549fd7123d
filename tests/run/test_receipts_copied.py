"""Attack: another run's receipts copied into a run (a run folder copied to "rename" it).

A receipt's key names the batch and its input digest, not the run, so run X's receipt fits
run Y's batch of the same input. Taken as Y's own, it made Y count the batch as handed off
while Y's records hold no part of it: a success that did not happen. A receipt of another
run is refused by name, like one of another batch. Flows run against the session's real
Prefect server; S3 is a real moto server.
"""

from __future__ import annotations

import pytest

from capture_core.errors import UnreadableReceiptError
from capture_core.run.receipt import RECEIPT_KEY
from capture_core.run.run_layout import RunLayout
from capture_core.storage import open_byte_store
from tests.flows.test_pipeline_attacks import finalized
from tests.support.pipeline_helpers import dest_records, finalize_locations
from tests.support.reliability_figures import record_case

pytestmark = [pytest.mark.integrity, pytest.mark.usefixtures("prefect_api")]


def test_a_receipt_of_another_run_is_refused(locations) -> None:
    finalized(locations, "first", 4)
    dest = open_byte_store(locations["dest"], locations["options"])
    first, second = RunLayout(dest, "first"), RunLayout(dest, "second")
    copied = []
    for key in dest.list_prefix(first.receipts_prefix):
        name = key.rsplit("/", 1)[-1]
        if RECEIPT_KEY.fullmatch(name):
            assert dest.create(second.receipt_key(name), dest.get(key) or b"")
            copied.append(second.receipt_key(name))
    assert len(copied) == 2

    with pytest.raises(UnreadableReceiptError, match="holds the receipt of run first") as refused:
        finalize_locations(locations, "second", batch_size=2)
    assert copied[0] in str(refused.value)
    assert dest_records(locations["dest"], "second", locations["options"]) == []
    assert second.read_ledger() is None, "nothing reads as handed off in the second run"
    record_case("another run's receipts copied into a run count as its handoff")
