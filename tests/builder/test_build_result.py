"""The typed build result: the seed functions return exactly the dicts they returned before it.

`tests/support/build_result_golden.json` was recorded from the seed functions while the build
result was still an untyped dict (see `tests.support.build_result_cases`); the same cases must
give the same bytes (values and key order: a record's metrics go into part files as they are
ordered).
"""

from __future__ import annotations

import orjson
import pytest

from capture_core.builder.build_result import (
    BuildMetrics,
    BuildResult,
    ChainCounts,
    SnapshotIdentity,
)
from capture_core.delivery import capture_build_can_retire, mask_reason
from tests.support.build_result_cases import CASES, GOLDEN

GOLDEN_CASES: dict[str, dict] = orjson.loads(GOLDEN.read_bytes())


def test_every_case_has_a_recorded_dict() -> None:
    assert set(GOLDEN_CASES) == set(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_seed_functions_return_the_recorded_dicts(name: str) -> None:
    produced = orjson.loads(orjson.dumps(CASES[name]()))
    assert produced == GOLDEN_CASES[name]
    assert orjson.dumps(produced) == orjson.dumps(GOLDEN_CASES[name]), "same key order"


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_seed_dict_reads_back_to_the_same_dict(name: str) -> None:
    built = GOLDEN_CASES[name]["built"]
    if built is None:
        return
    typed = BuildResult.from_dict(built)
    assert typed.to_dict() == built
    assert BuildResult.from_dict(typed.to_dict()) == typed
    assert typed.can_retire is capture_build_can_retire(built)
    assert typed.mask_reason() == mask_reason(built)
    record = GOLDEN_CASES[name].get("record")
    if record is not None and "metrics" in built:
        assert typed.record_metrics() == record["_ng_token_capture"], "what the record carries"


def test_the_cases_cover_every_kind_and_outcome() -> None:
    kinds = {
        name: BuildResult.from_dict(case["built"])
        for name, case in GOLDEN_CASES.items()
        if case["built"]
    }
    assert kinds["ok"].can_retire and not kinds["ok"].mask_sample
    assert kinds["masked_two_roots"].mask_reason() == "2 roots and 2 chains (need one of each)"
    assert kinds["masked_unresolved_retry"].mask_reason().startswith("unresolved retries [")
    assert kinds["incomplete"].metrics.capture_incomplete and kinds["incomplete"].error is None
    assert kinds["error_empty"].metrics.counts is None and kinds["error_empty"].snapshot
    assert kinds["terminal_delivered"].metrics.terminal.chain == "delivered"
    assert kinds["terminal_broken"].error.startswith("terminal chain broken")
    assert kinds["redundant"].redundant_capture and kinds["redundant"].can_retire
    assert kinds["unusable_no_key"].rollout_id is None and kinds["unusable_no_key"].builder is None
    assert GOLDEN_CASES["redundant_unfrozen"]["built"] is None


def test_to_dict_key_sets_follow_the_kind() -> None:
    snapshot = SnapshotIdentity("s", 2)
    failed = BuildResult.failed("3-4", "prefix_merging", "boom")
    assert list(failed.to_dict()) == [
        "rollout_id",
        "builder",
        "rebuilt_response",
        "mask_sample",
        "error",
        "metrics",
    ]
    assert list(failed.of_snapshot(snapshot, incomplete=True).to_dict()["metrics"]) == [
        "n_calls",
        "terminal_attribution",
        "capture_incomplete",
    ]
    assert BuildResult.redundant(snapshot).to_dict() == {
        "rebuilt_response": None,
        "mask_sample": False,
        "_redundant_capture": True,
        "_capture_snapshot": {"snapshot_id": "s", "version": 2},
    }
    unusable = BuildResult.unusable("no capture key")
    assert (
        unusable.to_dict()["metrics"]
        == unusable.record_metrics()
        == {
            "n_calls": 0,
            "error": "no capture key",
        }
    )


def test_an_incomplete_snapshot_masks_and_keeps_the_snapshot() -> None:
    counts = ChainCounts(1, 1, 0, 0.0, 1.0, 3, 3, 0)
    ok = BuildResult(
        {"output": []}, False, "3-4", "prefix_merging", None, (), False, BuildMetrics(2, counts, {})
    )
    snapshot = SnapshotIdentity("s", 2)
    assert ok.of_snapshot(snapshot, incomplete=False).can_retire
    incomplete = ok.of_snapshot(snapshot, incomplete=True)
    assert incomplete.mask_sample and not incomplete.can_retire
    assert incomplete.mask_reason().startswith("capture incomplete")
    assert ok.mask_sample is False, "frozen: the original is unchanged"


def test_dicts_from_elsewhere_read_leniently() -> None:
    assert not capture_build_can_retire({})
    assert not capture_build_can_retire({"mask_sample": False, "_capture_snapshot": {}})
    assert mask_reason({"mask_sample": True}) == "None roots and None chains (need one of each)"
    assert mask_reason({"mask_sample": False, "error": "x"}) is None
