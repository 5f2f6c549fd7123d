"""The automation's retrigger chain ends: the `max_retriggers`-th retrigger that still fails
ends as `NeedsAttention` (a Failed state the automation does not expect), with its reason;
earlier ones fail as `Failed`, which the automation retriggers. The automation itself, on a
real server and workers, is tests/test_events.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.finalize import NEEDS_ATTENTION, retrigger_failed

pytestmark = pytest.mark.usefixtures("prefect_api")


def retrigger(tmp_path: Path, number: int):
    for folder in ("store", "dest"):
        (tmp_path / folder).mkdir(exist_ok=True)
    return retrigger_failed(
        str(tmp_path / "dest"),
        "never-started",
        str(tmp_path / "store"),
        rollouts=str(tmp_path / "missing.jsonl"),
        retrigger=number,
        max_retriggers=2,
        return_state=True,
    )


def test_the_last_retrigger_that_fails_is_left_for_a_person_with_its_reason(tmp_path) -> None:
    earlier = retrigger(tmp_path, 1)
    assert earlier.is_failed() and earlier.name == "Failed", "the automation retriggers it"
    last = retrigger(tmp_path, 2)
    assert last.is_failed() and last.name == NEEDS_ATTENTION
    assert "missing.jsonl" in last.message and "after 2 automatic retriggers" in last.message
