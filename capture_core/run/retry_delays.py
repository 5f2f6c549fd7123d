"""How long a task waits before each retry of a transient failure, from one setting.

`TOKCAP_RETRY_DELAYS` (comma-separated seconds, one retry per value) in the environment of
the worker or the command; unset, 1, 4 and 10 s. A value that is not 1 to 10 finite,
non-negative numbers is refused with the setting's name. This module does not import Prefect.
"""

from __future__ import annotations

import math
import os

from capture_core.errors import InvalidInputError

RETRY_DELAYS_ENV = "TOKCAP_RETRY_DELAYS"
DEFAULT_RETRY_DELAYS = (1.0, 4.0, 10.0)


def transient_retry_delays() -> list[float]:
    """Seconds before each retry: `TOKCAP_RETRY_DELAYS` (for example `5,30,120` to ride out
    longer storage outages), else 1, 4 and 10."""
    value = os.environ.get(RETRY_DELAYS_ENV, "").strip()
    if not value:
        return list(DEFAULT_RETRY_DELAYS)
    try:
        delays = [float(part) for part in value.split(",")]
    except ValueError:
        delays = []
    if not 1 <= len(delays) <= 10 or not all(0 <= d < math.inf for d in delays):
        raise InvalidInputError(
            f"{RETRY_DELAYS_ENV}={value!r} is not 1 to 10 comma-separated seconds; set it to "
            "the wait before each retry of a transient storage failure (for example 1,4,10)"
        )
    return delays
