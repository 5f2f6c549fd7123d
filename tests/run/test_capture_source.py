"""The capture source a run reads: the one dispatch-time clear, and the store's identity."""

from __future__ import annotations

import pytest

from capture_core.run.capture_source import SourceSpec, clear_captures, store_identity
from capture_core.store import TokenCaptureStore
from tests.store.test_torn_puts import turns


def test_clear_deletes_exactly_the_given_rollouts(tmp_path) -> None:
    store = TokenCaptureStore(str(tmp_path))
    for rollout_id in ("a", "b"):
        for entry in turns(rollout_id, 2):
            store.put_now(entry)
    assert clear_captures(store, ["a"]) == 1
    assert not store.read_entries("a") and len(store.read_entries("b")) == 2


def test_clear_refuses_a_source_that_cannot_delete() -> None:
    with pytest.raises(ValueError, match="pkg.mod:Source has no delete"):
        clear_captures(object(), ["a"], "pkg.mod:Source")


def test_spellings_of_one_location_are_one_store(tmp_path) -> None:
    root = str(tmp_path / "store")
    assert store_identity(root + "/") == store_identity(f"file://{root}") == store_identity(root)
    assert store_identity(root) != store_identity(str(tmp_path / "other"))


@pytest.mark.parametrize(
    ("spec", "digest"),
    [
        (
            SourceSpec(store="/data/store/", storage_options={"endpoint_url": "http://minio:9000"}),
            "1d45259be2195a76",
        ),
        (SourceSpec(store="pkg.mod:Source", source_kwargs={"root": "/r"}), "138141917daaf060"),
    ],
)
def test_a_retirement_is_keyed_as_earlier_runs_persisted_it(spec: SourceSpec, digest: str) -> None:
    """The retire task's result object, which earlier runs wrote retirements as, is stable:
    the digests are those of the code that took store, options and arguments one by one, and
    the key is that object's path under the run's receipts."""
    from tokcap.tasks.batches import _retired_key

    fields = {"receipt_key": "batch-00000-0123456789abcdef", "run_id": "r1"}
    receipt = type("Receipt", (), fields)()
    key = _retired_key(None, {"receipt": receipt, "source": spec})
    assert key == f"r1/receipts/batch-00000-0123456789abcdef-retired-{digest}"
