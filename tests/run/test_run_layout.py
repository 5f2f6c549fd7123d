"""RunLayout: the run's keys, its manifest claim and its ledger, on a real local store."""

from __future__ import annotations

import orjson
import pytest

from capture_core.errors import RunIdInUseError
from capture_core.run.run_layout import LedgerLine, RunLayout, RunManifest
from capture_core.storage import open_byte_store


def manifest(**changes: object) -> RunManifest:
    fields = {
        "run_id": "r1",
        "rollouts": "/in.jsonl",
        "rollouts_sha256": "a" * 64,
        "store": "/store",
        "builder": "prefix_merging",
        "batch_size": 10,
        "batches": 1,
    }
    return RunManifest.model_validate({**fields, **changes})


@pytest.fixture
def layout(tmp_path) -> RunLayout:
    return RunLayout(open_byte_store(str(tmp_path)), "r1")


def test_every_key_lies_under_the_run(layout: RunLayout) -> None:
    keys = [layout.manifest_key, layout.ledger_key, layout.receipt_key("batch-00000-x")]
    keys.append(layout.attempt_key(3, "claim"))
    assert keys == [
        "r1/run.json",
        "r1/ledger.jsonl",
        "r1/receipts/batch-00000-x",
        "r1/attempts/0003.claim",
    ]


def test_an_invalid_run_id_is_refused(tmp_path) -> None:
    with pytest.raises(ValueError, match="run id"):
        RunLayout(open_byte_store(str(tmp_path)), "../escape")


def test_claiming_twice_with_the_same_input_is_accepted(layout: RunLayout) -> None:
    assert layout.claim(manifest()) is True
    assert layout.claim(manifest()) is False
    assert layout.read_manifest() == manifest()


def test_claiming_with_another_input_names_the_change(layout: RunLayout) -> None:
    layout.claim(manifest())
    with pytest.raises(RunIdInUseError, match="batch size 10 is now 20"):
        layout.claim(manifest(batch_size=20))


def test_the_ledger_round_trips(layout: RunLayout) -> None:
    lines = [LedgerLine(rollout_id="a", line=1, finalized=True, handed_off=True, masked=False)]
    layout.write_ledger(lines)
    assert layout.read_ledger() == lines


def test_mark_retired_clears_a_failure_but_keeps_a_kept_reason(layout: RunLayout) -> None:
    common = {"line": 1, "finalized": True, "handed_off": True, "masked": False}
    layout.write_ledger(
        [
            LedgerLine(rollout_id="failed", error="retirement failed: boom", **common),
            LedgerLine(rollout_id="changed", kept=True, error="not retired: changed", **common),
        ]
    )
    assert layout.mark_retired(["failed", "changed"]) == 2
    failed, changed = layout.read_ledger() or []
    assert (failed.retired, failed.error) == (True, None)
    assert (changed.retired, changed.error) == (True, "not retired: changed")


def test_a_ledger_line_written_before_kept_existed_is_read_as_before(layout: RunLayout) -> None:
    old = {"rollout_id": "a", "line": 1, "finalized": True, "handed_off": True, "masked": False}
    layout.dest.replace(
        layout.ledger_key,
        orjson.dumps({**old, "error": "not retired: ... anything there is kept"})
        + b"\n"
        + orjson.dumps({**old, "line": 2, "error": "retirement failed: x"})
        + b"\n",
    )
    kept, failed = layout.read_ledger() or []
    assert kept.kept is True and failed.kept is False


def test_inbox_markers_are_create_only(layout: RunLayout) -> None:
    assert layout.create_attempt(0, "claim", {"owner": "a"}) is True
    assert layout.create_attempt(0, "claim", {"owner": "b"}) is False
    assert layout.read_attempt(0, "claim") == {"owner": "a"}
    assert layout.attempt_numbers() == [0]
