"""Receipt storage: one saved block per destination and settings, which every run there reads.

A run writes no block of its own: at a run's start a block save is the write a busy server
answers 503 (and the client retries seconds later), so runs load the destination's block and
save it only when it is missing or was edited. Each upload's persisted receipt stays
readable from its task run's state in the API, through that block; so do the receipts of
runs that saved a block of their own (their states name bare keys).
"""

from __future__ import annotations

import hashlib

import orjson
from prefect import get_client
from prefect.client.schemas.actions import BlockDocumentUpdate

from capture_core.run.receipt import HandoffReceipt
from capture_core.store import TokenCaptureStore
from tests.support.pipeline_helpers import make_batch, write_rollouts
from tests.support.prefect_api_reads import eventually, task_runs_of
from tokcap.flows.finalize import finalize_run
from tokcap.tasks.receipts import ReceiptStorage, receipt_storage


def blocks_for(dest: str) -> list:
    """The saved receipt-storage block documents that name `dest`."""
    with get_client(sync_client=True) as client:
        documents = client.read_block_documents()
    slug = ReceiptStorage.get_block_type_slug()
    return [d for d in documents if d.block_type.slug == slug and d.data.get("dest") == dest]


def test_runs_at_one_destination_share_one_block_and_states_read_their_receipts(
    tmp_path, prefect_api
) -> None:
    store, dest = TokenCaptureStore(str(tmp_path / "store")), str(tmp_path / "dest")
    states = []
    for run_id, task in (("shared-1", 3), ("shared-2", 4)):
        rollouts = write_rollouts(
            str(tmp_path / f"{run_id}.jsonl"), make_batch(store, 2, task=task)
        )
        state = finalize_run(rollouts, store.root, dest, run_id, batch_size=2, return_state=True)
        assert state.is_completed(), state.message
        states.append((run_id, state))
    assert len(blocks_for(dest)) == 1, "one block for the destination, not one per run"
    for run_id, state in states:
        uploads = eventually(
            lambda s=state: [
                r
                for r in task_runs_of(s.state_details.flow_run_id)
                if r.name.startswith("upload batch")
            ],
            lambda found: len(found) == 1 and found[0].state.is_completed(),
            f"the upload task run of {run_id}",
        )
        receipt = uploads[0].state.result()  # resolved through the block the API names
        assert isinstance(receipt, HandoffReceipt) and receipt.run_id == run_id


def set_block_data(block: ReceiptStorage, data: dict) -> None:
    with get_client(sync_client=True) as client:
        client.update_block_document(block._block_document_id, BlockDocumentUpdate(data=data))


def test_a_block_edited_since_it_was_saved_is_saved_again(tmp_path, prefect_api) -> None:
    dest = str(tmp_path / "dest")
    first = receipt_storage.fn(dest)
    digest = hashlib.sha256(orjson.dumps([dest, {}], option=orjson.OPT_SORT_KEYS)).hexdigest()
    name = f"tokcap-receipts-{digest[:20]}"
    for edited in ({"dest": str(tmp_path / "elsewhere"), "settings": {}}, {"dest": 5}):
        set_block_data(first, edited)  # pointed elsewhere; then no longer valid at all
        again = receipt_storage.fn(dest)
        assert again.dest == dest and ReceiptStorage.load(name).dest == dest
        assert first._block_document_id == again._block_document_id
    assert receipt_storage.fn(dest, {"anon": True})._block_document_id != first._block_document_id


def test_bare_result_keys_resolve_under_the_run_of_the_block(tmp_path, prefect_api) -> None:
    """A run's bound block keeps Prefect's own keys (a failed task's exception) under the
    run; a block an older run saved for itself reads that run's receipts by bare key."""
    dest = str(tmp_path / "dest")
    bound = receipt_storage.fn(dest).for_run("failing")
    assert bound.write_path("1de9b06a7c", b"exception") == "failing/receipts/1de9b06a7c"
    assert (tmp_path / "dest" / "failing" / "receipts" / "1de9b06a7c").read_bytes() == b"exception"
    older = ReceiptStorage(dest=dest)
    older.save("tokcap-receipts-older-run", overwrite=True)
    set_block_data(older, {"dest": dest, "run_id": "older", "settings": {}})
    key = "batch-00000-0123456789abcdef"
    (tmp_path / "dest" / "older" / "receipts").mkdir(parents=True)
    (tmp_path / "dest" / "older" / "receipts" / key).write_bytes(b"receipt")
    assert ReceiptStorage.load("tokcap-receipts-older-run").read_path(key) == b"receipt"
