"""The bench figures' statistics: the interval of a median and the 5% verdict."""

from __future__ import annotations

from bench.ratios import Sample, median_interval, ratios_of, timed, verdict


def test_median_interval_takes_the_binomial_order_statistics() -> None:
    # Known 95% ranks (1-based): n=9 -> 2..8, n=10 -> 2..9, n=20 -> 6..15.
    assert median_interval([float(i) for i in range(1, 10)]) == (2.0, 8.0)
    assert median_interval([float(i) for i in range(1, 11)]) == (2.0, 9.0)
    assert median_interval([float(i) for i in range(1, 21)]) == (6.0, 15.0)
    assert median_interval([3.0, 1.0, 2.0]) == (1.0, 3.0)


def test_verdict_tells_a_five_percent_change_only_when_the_interval_is_narrow() -> None:
    steady = [1.06, 1.07, 1.065, 1.068, 1.07, 1.062, 1.066, 1.069, 1.064, 1.067]
    assert "slower by" in verdict(steady) and "resolves a 5%" in verdict(steady)
    noisy = [0.7, 1.4, 0.9, 1.2, 1.0, 1.3, 0.8, 1.1, 0.95, 1.25]
    assert "no difference shown" in verdict(noisy) and "does NOT resolve" in verdict(noisy)


def test_a_timed_side_counts_its_cpu_beside_its_wall_time() -> None:
    sample = timed(lambda: sum(i * i for i in range(200_000)))
    assert sample.wall > 0 and sample.cpu > 0
    wall, cpu = ratios_of([Sample(2.0, 1.0)], [Sample(1.0, 2.0)])
    assert wall == [2.0] and cpu == [0.5]
