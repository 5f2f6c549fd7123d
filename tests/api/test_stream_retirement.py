"""Retirement honours acknowledgements made through a two-rank `RowStream`, across runs.

Two inbox files become two runs, finalized by the real inbox flow with trainer rows and
`retire_after_consumer`; two ranks of one stream read disjoint parts and acknowledge some.
The inbox's retire pass and `retire_uploaded` (`tokcap retire`, what
`--retire-after-consumer` waits for) must then retire the captures of exactly the
acknowledged parts, never one of a part no rank acknowledged (local disk and S3).
"""

from __future__ import annotations

import pytest

from capture_core.dataset import RowStream
from capture_core.rows.row_cursor import read_stored_receipt, receipt_key_of_part
from capture_core.run.inbox import run_id_for_file
from capture_core.run.run_layout import RunLayout
from capture_core.storage import open_byte_store
from capture_core.store import TokenCaptureStore
from tests.support.pipeline_helpers import locations_inbox, make_batch, write_rollouts
from tokcap.flows.finalize import retire_uploaded
from tokcap.flows.inbox import finalize_inbox

pytestmark = pytest.mark.usefixtures("prefect_api")

TASKS = (1, 2)
ROLLOUTS = 4


def still_captured(locations: dict) -> set[str]:
    """The rollouts whose captures are still in the store."""
    store = TokenCaptureStore(locations["store"], locations["options"])
    every = [f"{task}-{i}" for task in TASKS for i in range(ROLLOUTS)]
    return {rollout for rollout in every if store.read_entries(rollout)}


def retirable(locations: dict, part: str) -> set[str]:
    """The rollouts the receipt of rows part `part` lets retire."""
    layout = RunLayout(open_byte_store(locations["dest"], locations["options"]), part.split("/")[0])
    receipt = read_stored_receipt(layout, receipt_key_of_part(layout, part))
    return {r.rollout_id for r in receipt.rollouts if r.rollout_id and r.can_retire}


def test_retirement_follows_exactly_the_acknowledgements_of_a_two_rank_stream(locations) -> None:
    options = locations["options"]
    store = TokenCaptureStore(locations["store"], options)
    files = [
        write_rollouts(
            f"{locations['inbox']}/t{task}.jsonl", make_batch(store, ROLLOUTS, task=task), options
        )
        for task in TASKS
    ]
    settings = locations_inbox(
        locations, batch_size=2, rows="parquet", retire_after_consumer="trainer"
    )
    finalize_inbox(settings)
    runs = {run_id_for_file(f) for f in files}
    everything = still_captured(locations)
    assert len(everything) == len(TASKS) * ROLLOUTS, "nothing retired before acknowledgement"

    ranks = [
        RowStream(
            locations["dest"],
            "trainer",
            storage_options=options,
            rank=r,
            world_size=2,
            follow=False,
        )
        for r in (0, 1)
    ]
    read = [[part.key for part in rank] for rank in ranks]
    assert read[0] and len(read[1]) >= 2, f"both ranks get parts: {read}"
    assert {key.split("/")[0] for key in read[0] + read[1]} == runs, "parts of both runs"
    for key in read[0]:  # rank 0 keeps up; rank 1 is slow and acknowledges nothing yet
        ranks[0].ack(key)
    acked = set(read[0])
    expected = set().union(*(retirable(locations, key) for key in acked))
    assert expected, "the acknowledged parts hold retirable captures"

    finalize_inbox(settings)  # the inbox's retire pass
    assert still_captured(locations) == everything - expected, "exactly rank 0's parts retire"

    slow, *rest = read[1]
    ranks[1].ack(slow)
    kept = set().union(*(retirable(locations, key) for key in rest))
    for run in runs:  # `tokcap retire`, run by run
        retire_uploaded(locations["dest"], run, locations["store"], options)
    assert still_captured(locations) == kept, "then exactly rank 1's acknowledged part"
    assert kept, "rank 1's unacknowledged parts keep their captures"

    for key in rest:
        ranks[1].ack(key)
    finalize_inbox(settings)
    assert still_captured(locations) == set(), "every part acknowledged: every capture retired"
