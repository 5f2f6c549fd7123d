"""run_pace without a Prefect server: batches and rollouts done, rate, time left, masks."""

from __future__ import annotations

from capture_core.operator.run_pace import RunPace, duration


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_each_batch_says_k_of_n_the_rate_the_time_left_and_the_masks() -> None:
    clock = Clock()
    pace = RunPace([(250, True)] * 12, clock=clock)
    clock.now += 10.0
    first = pace.batch_done(masked=3)
    assert first.text == (
        "1/12 batches, 250/3000 rollouts, 25.0 rollouts/s, about 1 min 50 s left, 3 masked so far"
    )
    assert first.percent == 100 * 250 / 3000
    for _ in range(10):
        pace.batch_done(masked=5)
    clock.now += 100.0
    last = pace.batch_done(masked=7)
    assert last.finished and last.text.endswith(
        "3000/3000 rollouts, 27.3 rollouts/s, done, 7 masked so far"
    )


def test_batches_an_earlier_run_handed_off_count_as_done_but_not_in_the_rate() -> None:
    clock = Clock()
    pace = RunPace([(100, False), (100, False), (100, True), (100, True)], clock=clock)
    clock.now += 0.5
    earlier = pace.batch_done(masked=0)
    assert earlier.rollouts_per_second is None and "rate not known yet" in earlier.text
    assert "time left not known yet" in earlier.text and earlier.rollouts_done == 100
    pace.batch_done(masked=0)
    clock.now += 9.5
    fresh = pace.batch_done(masked=1)
    assert fresh.rollouts_per_second == 10.0 and fresh.seconds_left == 10.0
    assert fresh.text.startswith("3/4 batches, 300/400 rollouts, 10.0 rollouts/s, about 10 s left")


def test_durations_read_in_the_two_largest_units() -> None:
    assert [duration(s) for s in (0.2, 42, 185, 3900)] == ["1 s", "42 s", "3 min 5 s", "1 h 5 min"]
