"""How far a finalize run is: batches and rollouts done of the total, rate, time left, masks.

The run reports each batch as it is done, in input order. The rate counts only the
rollouts this run finalized (a batch an earlier run handed off costs nearly nothing), and
the time left is the rollouts still to finalize at that rate. `BatchProgress.text` is the
one line the run's log, the console and the progress artifact show: `k/N batches, ...`.
This module does not import Prefect.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from pydantic import BaseModel


class BatchProgress(BaseModel):
    """The run after its `batches_done`-th batch."""

    batches_done: int
    batches: int
    rollouts_done: int
    rollouts: int
    rollouts_per_second: float | None = None
    seconds_left: float | None = None
    masked: int = 0

    @property
    def percent(self) -> float:
        """Rollouts done of the total (batches when there are no rollouts), 0-100."""
        if self.rollouts:
            return 100.0 * self.rollouts_done / self.rollouts
        return 100.0 * self.batches_done / max(1, self.batches)

    @property
    def finished(self) -> bool:
        return self.batches_done >= self.batches

    @property
    def text(self) -> str:
        """`3/12 batches, 750/3000 rollouts, 41.2 rollouts/s, about 55 s left, 4 masked so far`."""
        rate = self.rollouts_per_second
        pace = "rate not known yet" if rate is None else f"{rate:.1f} rollouts/s"
        if self.finished:
            left = "done"
        elif self.seconds_left is None:
            left = "time left not known yet"
        else:
            left = f"about {duration(self.seconds_left)} left"
        return (
            f"{self.batches_done}/{self.batches} batches, {self.rollouts_done}/{self.rollouts} "
            f"rollouts, {pace}, {left}, {self.masked} masked so far"
        )


def duration(seconds: float) -> str:
    """`42 s`, `3 min 5 s`, `1 h 5 min`: whole units, the two largest; at least `1 s`."""
    whole = max(1, round(seconds))
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60} s"
    return f"{whole // 3600} h {whole % 3600 // 60} min"


class RunPace:
    """Counts batches done against the run's plan and times the rollouts it finalizes.

    `batches` holds, per batch in input order, its rollouts (input lines) and whether this
    run finalizes it (`False`: an earlier run handed it off). The clock starts at creation.
    """

    def __init__(
        self, batches: Sequence[tuple[int, bool]], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.batches, self.clock = list(batches), clock
        self.started = clock()
        self.done = self.rollouts_done = self.fresh_done = 0
        self.fresh_total = sum(lines for lines, fresh in self.batches if fresh)

    def batch_done(self, masked: int) -> BatchProgress:
        """The next batch is done; `masked` counts the rollouts masked so far."""
        lines, fresh = self.batches[self.done]
        self.done += 1
        self.rollouts_done += lines
        self.fresh_done += lines if fresh else 0
        elapsed = self.clock() - self.started
        rate = self.fresh_done / elapsed if self.fresh_done and elapsed > 0 else None
        left = None if rate is None else (self.fresh_total - self.fresh_done) / rate
        return BatchProgress(
            batches_done=self.done,
            batches=len(self.batches),
            rollouts_done=self.rollouts_done,
            rollouts=sum(lines for lines, _fresh in self.batches),
            rollouts_per_second=rate,
            seconds_left=left,
            masked=masked,
        )
