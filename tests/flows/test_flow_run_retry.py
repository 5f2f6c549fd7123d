"""`prefect flow-run retry` of a run that failed in one batch re-executes only that batch."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from capture_core.run.rollout_io import plan_rollout_file
from capture_core.run.run_layout import read_ledger
from capture_core.storage import open_byte_store
from capture_core.store import TokenCaptureStore
from tests.support.pipeline_helpers import REPO, make_batch, write_rollouts
from tokcap.flows.finalize import finalize_run


class FreezeLoggingStore(TokenCaptureStore):
    """A capture store that appends every frozen rollout id to a log file."""

    def __init__(self, root: str, log: str) -> None:
        super().__init__(root)
        self.log = log

    def __reduce__(self):  # type: ignore[override]
        return (FreezeLoggingStore, (self.root, self.log))

    def freeze_now(self, rollout_id: str):  # type: ignore[override]
        with open(self.log, "a") as f:
            f.write(rollout_id + "\n")
        return super().freeze_now(rollout_id)


def frozen(log: str) -> list[str]:
    with open(log) as f:
        return f.read().split()


def test_flow_run_retry_reexecutes_only_the_failed_batch(tmp_path, prefect_api: str) -> None:
    store, dest, log = str(tmp_path / "store"), str(tmp_path / "dest"), str(tmp_path / "freezes")
    rollouts = write_rollouts(str(tmp_path / "in.jsonl"), make_batch(TokenCaptureStore(store), 6))
    batch = plan_rollout_file(rollouts, 2).batches[1]
    blocker = f"retry/records/part-00001-{batch.sha256[:16]}.jsonl"
    open_byte_store(dest).create(blocker, b"stale\n")
    state = finalize_run(
        rollouts,
        "tests.flows.test_flow_run_retry:FreezeLoggingStore",
        dest,
        "retry",
        batch_size=2,
        source_kwargs={"root": store, "log": log},
        return_state=True,
    )
    assert state.is_failed()
    assert sorted(frozen(log)) == [f"7-{i}" for i in range(6)]
    os.remove(os.path.join(dest, blocker))
    os.remove(log)
    retried = subprocess.run(
        [
            sys.executable,
            "-m",
            "prefect",
            "flow-run",
            "retry",
            str(state.state_details.flow_run_id),
            "--entrypoint",
            "tokcap.flows.finalize:finalize_run",
        ],
        cwd=REPO,
        env={**os.environ, "PREFECT_API_URL": prefect_api},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert retried.returncode == 0, retried.stdout[-1500:] + retried.stderr[-1500:]
    assert sorted(frozen(log)) == ["7-2", "7-3"], "only the failed batch was finalized again"
    ledger = read_ledger(open_byte_store(dest), "retry")
    assert all(line.handed_off and line.retired for line in ledger)


pytestmark = pytest.mark.usefixtures("prefect_api")
