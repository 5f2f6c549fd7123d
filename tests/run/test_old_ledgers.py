"""Ledgers written before the typed `kept` state, read and retired by today's code.

The old code kept a line's error on a later retirement exactly when the text held "kept";
an old ledger must keep every such reason, and clear only the others, as it did then.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from capture_core.run.retirement import KEPT_CHANGED
from capture_core.run.run_layout import RunLayout
from capture_core.storage import open_byte_store
from tests.support.reliability_figures import record_case

pytestmark = pytest.mark.integrity

OLD_ERRORS = [
    None,
    KEPT_CHANGED,
    "retirement failed: TransientStoreError: timed out",
    "capture incomplete; the rollout is masked and its capture kept as evidence",
]


def old_mark_retired_error(error: str | None) -> str | None:
    """The rule the code before the restructuring applied to a retired line's error."""
    return error if error and "kept" in error else None


@pytest.mark.parametrize("error", OLD_ERRORS)
def test_an_old_ledger_line_retired_now_keeps_exactly_what_it_kept_then(
    tmp_path: Path, error: str | None
) -> None:
    layout = RunLayout(open_byte_store(str(tmp_path)), "run-1")
    old_line = {
        "rollout_id": "1-2",
        "line": 0,
        "finalized": True,
        "handed_off": True,
        "masked": False,
        "mask_reason": None,
        "retired": False,
        "error": error,
        "delivered_fraction": 1.0,
        "terminal_method": None,
        "terminal_abstentions": [],
    }
    layout.dest.replace(layout.ledger_key, orjson.dumps(old_line) + b"\n")
    assert layout.mark_retired(["1-2"]) == 1
    (line,) = layout.read_ledger() or []
    record_case("legacy ledger retired by the typed kept state")
    assert line.retired
    assert line.error == old_mark_retired_error(error)
    assert line.kept == (error is not None and "kept" in error)
