"""Figures the reliability tests report (crash points, faults, bad inputs, records lost).

When `TOKCAP_RELIABILITY_FIGURES` names a file, each figure is appended to it as a JSON line;
`bench/reliability_report.py` runs the tests with it set and prints the totals.
"""

from __future__ import annotations

import os

import orjson

FIGURES_ENV = "TOKCAP_RELIABILITY_FIGURES"


def record_figure(name: str, value: int) -> None:
    path = os.environ.get(FIGURES_ENV)
    if path:
        with open(path, "ab") as f:
            f.write(orjson.dumps({"name": name, "value": value}) + b"\n")
