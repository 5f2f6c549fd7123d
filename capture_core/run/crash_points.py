"""Named crash points: where the run layer lets crash-safety tests kill the process.

`crash_point(name)` kills the process with SIGKILL when `TOKCAP_CRASH_AT` names that point,
so tests can prove that a re-run after a crash at any step produces the same output.
Unset (always, outside tests) it costs one dictionary lookup.
"""

from __future__ import annotations

import os
import signal

CRASH_ENV = "TOKCAP_CRASH_AT"
CRASH_POINTS = (
    "after-finalize",
    "mid-upload",
    "after-upload",
    "after-receipt",
    "after-retire-decisions",
    "mid-retire",
    "mid-clear",
)
__all__ = ["CRASH_ENV", "CRASH_POINTS", "crash_point"]


def crash_point(name: str) -> None:
    """Die here, without cleanup, if the test harness asked for it."""
    if os.environ.get(CRASH_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)
