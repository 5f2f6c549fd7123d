"""The waits before each retry of a transient failure: 1, 4 and 10 s unless
`TOKCAP_RETRY_DELAYS` says otherwise (the test suite sets it short: tests/conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from capture_core.errors import InvalidInputError
from capture_core.run.retry_delays import RETRY_DELAYS_ENV, transient_retry_delays

POLICY = (
    "from tokcap.tasks.batches import plan_rollouts as t; print(t.retries, t.retry_delay_seconds)"
)


def task_policy(value: str | None) -> str:
    """A tokcap task's retries and delays, as a fresh process with `value` set imports it."""
    env = {k: v for k, v in os.environ.items() if k != RETRY_DELAYS_ENV}
    if value is not None:
        env[RETRY_DELAYS_ENV] = value
    done = subprocess.run(
        [sys.executable, "-c", POLICY], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def test_tasks_wait_1_4_and_10_s_unless_the_setting_says_otherwise() -> None:
    assert task_policy(None) == "3 [1.0, 4.0, 10.0]"
    assert task_policy("5, 30,120,300") == "4 [5.0, 30.0, 120.0, 300.0]"


@pytest.mark.parametrize("bad", ["x", "1,,4", "-1", "nan", "inf", ",".join(["1"] * 11)])
def test_a_bad_retry_delay_setting_is_refused_with_its_name(monkeypatch, bad: str) -> None:
    monkeypatch.setenv(RETRY_DELAYS_ENV, bad)
    with pytest.raises(InvalidInputError, match=f"{RETRY_DELAYS_ENV}=.* comma-separated"):
        transient_retry_delays()
