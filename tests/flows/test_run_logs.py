"""What a run's flow-run logs (the Prefect UI) say, read back from the real Prefect API.

One warning per masked rollout, with its line and the ledger's reason; no per-task
"Finished in state Completed()" line; a re-run counts the rollouts an earlier run handed off,
as `tokcap status` does.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import orjson
import pytest

from capture_core.run.run_layout import read_ledger
from capture_core.storage import open_byte_store
from capture_core.store import TokenCaptureStore
from tests.support.pipeline_helpers import make_batch, write_rollouts
from tests.support.prefect_api_reads import eventually, logs_of
from tokcap.flows.cli.checks import known_run
from tokcap.flows.finalize import finalize_run

pytestmark = pytest.mark.usefixtures("prefect_api")
RUN_LOGGERS = ("prefect.flow_runs", "prefect.task_runs")


@pytest.fixture
def info_run_logs() -> Iterator[None]:
    """Run loggers at INFO, as a user's are (the test session logs only warnings)."""
    loggers = [logging.getLogger(name) for name in RUN_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.INFO)
    yield
    for logger, level in zip(loggers, levels, strict=True):
        logger.setLevel(level)


@pytest.mark.usefixtures("info_run_logs")
def test_the_ui_logs_name_each_masked_rollout_once_and_no_completed_task(tmp_path) -> None:
    store_root, dest = str(tmp_path / "store"), str(tmp_path / "dest")
    records = make_batch(TokenCaptureStore(store_root), 5, masked={1, 3})
    records.append({"reward": 1.0, "response": {"output": []}})  # line 6: no rollout id
    rollouts = write_rollouts(str(tmp_path / "in.jsonl"), records)
    state = finalize_run(rollouts, store_root, dest, "logs-1", batch_size=2, return_state=True)
    assert state.is_completed(), state.message
    ledger = read_ledger(open_byte_store(dest), "logs-1") or []
    masked = [line for line in ledger if line.masked]
    assert [line.line for line in masked] == [2, 4, 6]
    expected = [
        f"line {line.line}"
        + (f" (rollout {line.rollout_id})" if line.rollout_id else "")
        + f" masked: {line.mask_reason}"
        for line in masked
    ]
    logs = eventually(
        lambda: logs_of(state.state_details.flow_run_id),
        lambda found: (
            any(flow_finished(log) for log in found)
            and sum(" masked: " in log.message for log in found) >= len(expected)
        ),
        "the masked rollouts in the flow-run logs",
    )
    warnings = [log.message for log in logs if log.level >= logging.WARNING]
    for text in expected:
        assert sum(text in message for message in warnings) == 1, (text, warnings)
    assert sum(" masked: " in message for message in warnings) == len(expected), warnings
    completed = [log for log in logs if log.task_run_id and finished(log)]
    assert not completed, "no task run logs its Completed state"


def finished(log: object) -> bool:
    return str(getattr(log, "message", "")).startswith("Finished in state")


def flow_finished(log: object) -> bool:
    """The flow run's own final-state line (still logged), the last one of the run."""
    return getattr(log, "task_run_id", None) is None and finished(log)


def test_a_rerun_counts_the_rollouts_an_earlier_run_handed_off_as_status_does(tmp_path) -> None:
    store_root, dest = str(tmp_path / "store"), str(tmp_path / "dest")
    records = make_batch(TokenCaptureStore(store_root), 7)
    rollouts = write_rollouts(str(tmp_path / "in.jsonl"), records)
    first = finalize_run(rollouts, store_root, dest, "again-7", batch_size=2)
    assert first.already_handed_off == 0
    again = finalize_run(rollouts, store_root, dest, "again-7", batch_size=2)
    assert (again.already_handed_off, again.handed_off, again.rollouts) == (7, 7, 7)
    _manifest, status = known_run(dest, "again-7", {})
    assert status is not None and status.already_handed_off == again.already_handed_off
    ledger = (tmp_path / "dest" / "again-7" / "ledger.jsonl").read_bytes().splitlines()
    assert all(orjson.loads(line)["earlier"] is True for line in ledger)
