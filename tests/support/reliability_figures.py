"""Figures the reliability tests report (crash points, faults, bad inputs, records lost).

When `TOKCAP_RELIABILITY_FIGURES` names a file, each figure is appended to it as a JSON line;
`bench/reliability_report.py` runs the tests with it set and prints the totals.
An attack case closed by a test is recorded by name with `record_case`, only from a test marked
`@pytest.mark.integrity`: the report selects its tests by that marker, so an unmarked case
would silently drop out of it (tests/conftest.py tells this module whether the running test
is marked).
"""

from __future__ import annotations

import os

import orjson

FIGURES_ENV = "TOKCAP_RELIABILITY_FIGURES"
running_test_is_marked = False


def record_figure(name: str, value: int) -> None:
    path = os.environ.get(FIGURES_ENV)
    if path:
        with open(path, "ab") as f:
            f.write(orjson.dumps({"name": name, "value": value}) + b"\n")


def record_case(case: str, *, records_lost: int = 0, wrong_tokens_delivered: int = 0) -> None:
    """Record that the attack `case` was tried and what it cost (both must be 0)."""
    if not running_test_is_marked:
        raise AssertionError(
            f"attack case {case!r} is recorded by a test not marked @pytest.mark.integrity: "
            "mark the test (or its module) so bench/reliability_report.py runs it"
        )
    path = os.environ.get(FIGURES_ENV)
    if path:
        with open(path, "ab") as f:
            f.write(orjson.dumps({"name": "attack_case", "case": case, "value": 1}) + b"\n")
    record_figure("records_lost", records_lost)
    record_figure("wrong_tokens_delivered", wrong_tokens_delivered)
