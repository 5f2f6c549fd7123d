"""Figures as ratios against a baseline measured in the same run, alternately.

Each repetition runs the baseline, then the measured side, so a load spike on the shared
machine hits both. Every side is timed twice: wall seconds, and CPU seconds (user + system
of this process and every thread in it, plus waited-for child processes). On a loaded
machine the wall ratio swings with the neighbours' load; the CPU ratio counts only the work
the side did, so it is the figure that can tell a small change. Spreads are printed as the
median, interquartile range and range over the repetitions.

Two trees are compared with `TreeSides`: each tree's sides run in a long-lived child process
whose `capture_core` is that tree's, alternated with the other tree's in one run; the ratio
of the trees' ratios (each against its own reference in the same repetition) is printed with
a distribution-free 95% interval of its median, and whether that interval tells 5%.
"""

from __future__ import annotations

import math
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import orjson


@dataclass(frozen=True)
class Sample:
    """Wall and CPU seconds of one timed region."""

    wall: float
    cpu: float


def cpu_now() -> float:
    """CPU seconds so far: this process (all threads) plus its waited-for children."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


class Stopwatch:
    """Times a `with` block in wall and CPU seconds; `sample` holds both after it."""

    def __enter__(self) -> Stopwatch:
        self._wall, self._cpu = time.perf_counter(), cpu_now()
        return self

    def __exit__(self, *exc: object) -> None:
        self.sample = Sample(time.perf_counter() - self._wall, cpu_now() - self._cpu)


def timed(run: Callable[[], object]) -> Sample:
    """Wall and CPU seconds of `run()`."""
    with Stopwatch() as watch:
        run()
    return watch.sample


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
        return spread(self.ratios)


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


def alternate_samples(
    sides: dict[str, Callable[[], Sample]], repetitions: int
) -> dict[str, list[Sample]]:
    """`alternate_sides` for sides that return wall and CPU seconds."""
    return alternate_sides(sides, repetitions)  # type: ignore[arg-type,return-value]


def quartiles(values: list[float]) -> tuple[float, float, float]:
    """First quartile, median and third quartile (inclusive method)."""
    if len(values) < 2:
        return values[0], values[0], values[0]
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


def spread(ratios: list[float], unit: str = "x") -> str:
    """Median, interquartile range, range and count of per-repetition figures."""
    q1, q2, q3 = quartiles(ratios)
    return (
        f"{q2:.3f}{unit} (IQR {q1:.3f}-{q3:.3f}, range {min(ratios):.3f}-{max(ratios):.3f}, "
        f"{len(ratios)} reps)"
    )


def ratios_of(measured: list[Sample], baseline: list[Sample]) -> tuple[list[float], list[float]]:
    """Per-repetition wall and CPU ratios of `measured` to `baseline`."""
    wall = [m.wall / b.wall for m, b in zip(measured, baseline, strict=True)]
    cpu = [m.cpu / b.cpu for m, b in zip(measured, baseline, strict=True)]
    return wall, cpu


def describe_ratio(measured: list[Sample], baseline: list[Sample]) -> str:
    """Wall and CPU ratios of two sides, each with its spread."""
    wall, cpu = ratios_of(measured, baseline)
    return f"wall {spread(wall)}; CPU {spread(cpu)}"


def median_interval(values: list[float], confidence: float = 0.95) -> tuple[float, float]:
    """A distribution-free interval of the median: the order statistics k and n-k+1 with
    P(k <= Binomial(n, 1/2) < n-k+1) >= `confidence` (the full range when n is too small)."""
    ordered, n = sorted(values), len(values)
    k = 0
    while k + 1 < n - 2 - k:
        wider = sum(math.comb(n, i) for i in range(k + 2, n - k - 1)) / 2**n
        if wider < confidence:
            break
        k += 1
    return ordered[k], ordered[n - 1 - k]


def verdict(ratio_of_ratios: list[float], step: float = 0.05) -> str:
    """Whether the interval of the median tells a `step` change (either way) from none."""
    low, high = median_interval(ratio_of_ratios)
    width = high - low
    if low > 1:
        said = f"slower by {low - 1:.1%} to {high - 1:.1%}"
    elif high < 1:
        said = f"faster by {1 - high:.1%} to {1 - low:.1%}"
    else:
        said = "no difference shown"
    resolves = "resolves" if width < 2 * step else "does NOT resolve"
    return (
        f"95% interval of the median {low:.3f}-{high:.3f} ({said}); width {width:.3f}: "
        f"{resolves} a {step:.0%} change"
    )


def describe_seconds(values: list[float]) -> str:
    """Median and range of a side's seconds."""
    return f"{median(values):.3f}s (range {min(values):.3f}-{max(values):.3f})"


def describe_samples(samples: list[Sample]) -> str:
    """Median and range of a side's wall seconds, and its median CPU seconds."""
    wall = [s.wall for s in samples]
    cpu = [s.cpu for s in samples]
    return f"wall {describe_seconds(wall)}, CPU {median(cpu):.3f}s"


def median(values: list[float]) -> float:
    return statistics.median(values)


def load() -> float:
    """The one-minute load average."""
    return os.getloadavg()[0]


class TreeSides:
    """The sides of a bench run by another source tree, in a long-lived child process.

    The child is `python -m <module> --serve <args>` with `root` first on its path: `root`
    holds the tree's `capture_core` and this tree's `bench` (see `composed_root`). Each
    request names a side; the child runs it and answers its wall and CPU seconds, so its CPU
    is counted in the child alone.
    """

    def __init__(self, root: str, module: str, args: list[str]) -> None:
        env = {**os.environ, "PYTHONPATH": root}
        self.process = subprocess.Popen(
            [sys.executable, "-m", module, "--serve", *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            cwd=root,
        )
        ready = self._answer()
        if not str(ready.get("capture_core", "")).startswith(root):
            raise RuntimeError(f"the child imported capture_core from {ready}, not from {root}")

    def _answer(self) -> dict:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the bench child exited with {self.process.wait()}")
        return orjson.loads(line)

    def run(self, side: str) -> Sample:
        assert self.process.stdin is not None
        self.process.stdin.write(side.encode() + b"\n")
        self.process.stdin.flush()
        answer = self._answer()
        return Sample(answer["wall"], answer["cpu"])

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait()


def serve(sides: dict[str, Callable[[], Sample]]) -> None:
    """The child's loop: announce where `capture_core` came from, then run named sides."""
    import capture_core

    out = sys.stdout.buffer
    out.write(orjson.dumps({"capture_core": capture_core.__file__}) + b"\n")
    out.flush()
    for line in sys.stdin.buffer:
        sample = sides[line.strip().decode()]()
        out.write(orjson.dumps({"wall": sample.wall, "cpu": sample.cpu}) + b"\n")
        out.flush()


def composed_root(rev: str, into: str) -> str:
    """A folder with `rev`'s `capture_core` (extracted by `git archive`) and this tree's
    `bench`, so the same bench code times another tree's library. `rev` "." is this tree."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    root = os.path.join(into, f"tree-{rev.replace('/', '_')}")
    if os.path.isdir(root):
        return root
    os.makedirs(root)
    if rev == ".":
        os.symlink(os.path.join(here, "capture_core"), os.path.join(root, "capture_core"))
    else:
        archive = subprocess.run(
            ["git", "-C", here, "archive", rev, "capture_core"], check=True, capture_output=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", root], input=archive, check=True)
    os.symlink(os.path.join(here, "bench"), os.path.join(root, "bench"))
    return root


def against(
    trees: dict[str, TreeSides], reference: str, measured: str, repetitions: int
) -> dict[str, tuple[list[Sample], list[Sample]]]:
    """Alternate every tree's `reference` and `measured` sides over the repetitions (the
    trees' order flips each repetition); per tree, its reference and measured samples."""
    samples: dict[str, tuple[list[Sample], list[Sample]]] = {n: ([], []) for n in trees}
    order = list(trees)
    for rep in range(max(repetitions, 3)):
        for name in order if rep % 2 == 0 else order[::-1]:
            samples[name][0].append(trees[name].run(reference))
            samples[name][1].append(trees[name].run(measured))
    return samples


def report_against(
    samples: dict[str, tuple[list[Sample], list[Sample]]], new: str, old: str
) -> list[str]:
    """Each tree's ratio to its reference, wall and CPU, and the ratio of ratios new/old."""
    lines = []
    ratios = {}
    for name, (base, meas) in samples.items():
        ratios[name] = ratios_of(meas, base)
        lines.append(f"  {name}: {describe_ratio(meas, base)}")
    for i, kind in enumerate(("wall", "CPU")):
        rr = [n / o for n, o in zip(ratios[new][i], ratios[old][i], strict=True)]
        lines.append(f"  {kind} ratio {new} / {old}: {spread(rr)}")
        lines.append(f"    {verdict(rr)}")
    # Load only adds time, so each side's fastest repetition is its least disturbed one.
    fastest = {
        name: min(m.cpu for m in meas) / min(b.cpu for b in base)
        for name, (base, meas) in samples.items()
    }
    lines.append(
        f"  fastest CPU per side: {new} {fastest[new]:.3f}x, {old} {fastest[old]:.3f}x, "
        f"{new} / {old} = {fastest[new] / fastest[old]:.3f}"
    )
    return lines
