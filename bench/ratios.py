"""Figures as ratios against a baseline measured in the same run, alternately.

Each repetition runs the baseline, then the measured side, so a load spike on the shared
machine hits both. Prints the median and range of the time ratios over the repetitions.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Ratio:
    """Seconds of both sides per repetition, and their ratio (measured / baseline)."""

    baseline: list[float]
    measured: list[float]

    @property
    def ratios(self) -> list[float]:
        return [m / b for m, b in zip(self.measured, self.baseline, strict=True)]

    @property
    def median(self) -> float:
        return statistics.median(self.ratios)

    def describe(self) -> str:
        r = self.ratios
        return f"{self.median:.2f}x (range {min(r):.2f}-{max(r):.2f}, {len(r)} reps)"


def alternate(
    baseline: Callable[[], float], measured: Callable[[], float], repetitions: int
) -> Ratio:
    """Run `baseline` then `measured` `repetitions` times; each returns its seconds."""
    base: list[float] = []
    meas: list[float] = []
    for _ in range(max(repetitions, 3)):
        base.append(baseline())
        meas.append(measured())
    return Ratio(base, meas)


def alternate_sides(
    sides: dict[str, Callable[[], float]], repetitions: int
) -> dict[str, list[float]]:
    """Run every side in turn, `repetitions` times (at least 3); each returns its seconds.
    The first side runs first in odd repetitions and last in even ones."""
    seconds: dict[str, list[float]] = {name: [] for name in sides}
    order = list(sides)
    for rep in range(max(repetitions, 3)):
        for name in order if rep % 2 == 0 else order[::-1]:
            seconds[name].append(sides[name]())
    return seconds


def describe_seconds(values: list[float]) -> str:
    """Median and range of a side's seconds."""
    return f"{median(values):.3f}s (range {min(values):.3f}-{max(values):.3f})"


def median(values: list[float]) -> float:
    return statistics.median(values)
