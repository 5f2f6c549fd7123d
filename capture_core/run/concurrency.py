"""How many rollouts a batch finalizes or retires at once, from one setting.

`TOKCAP_STORE_CONCURRENCY` sets both; without it a batch finalizes 4 rollouts at once from a
tokcap store on local disk (fsync-bound: more only add thread switches) and 16 from any
other source, and retires 16 at once. A value that is not a positive integer is refused
with the setting's name. This module does not import Prefect.
"""

from __future__ import annotations

import os

from capture_core.errors import InvalidInputError
from capture_core.storage.local import LocalStore

STORE_CONCURRENCY_ENV = "TOKCAP_STORE_CONCURRENCY"
DEFAULT_STORE_CONCURRENCY = 16
LOCAL_FINALIZE_CONCURRENCY = 4
"""Rollouts a batch finalizes at once from a tokcap store on local disk, unless told."""


def finalize_concurrency(source: object) -> int:
    """Rollouts a batch finalizes at once from `source`: `TOKCAP_STORE_CONCURRENCY` when it
    is set; else 4 from a tokcap store on local disk, 16 from any other source.

    On local disk a finalize is interpreter work plus a few milliseconds of fsync for its
    freeze claim: four in flight overlap those, and more only add thread switches and
    garbage-collector work (a batch took about 1.4 times as long at 16: docs/perf.md). A
    remote store's round trips need the 16; so may a local path on a network filesystem,
    where each fsync is a round trip: set the variable there. Retirement keeps
    `store_concurrency()`: its unlinks and deletes gain from more at once.
    """
    byte_store = getattr(source, "byte_store", None)
    if isinstance(byte_store, LocalStore) and not os.environ.get(STORE_CONCURRENCY_ENV):
        return LOCAL_FINALIZE_CONCURRENCY
    return store_concurrency()


def store_concurrency() -> int:
    """Rollouts finalized or retired at once per batch: `TOKCAP_STORE_CONCURRENCY`, else 16."""
    value = os.environ.get(STORE_CONCURRENCY_ENV, "")
    try:
        number = int(value) if value else DEFAULT_STORE_CONCURRENCY
    except ValueError:
        number = 0
    if number < 1:
        raise InvalidInputError(
            f"{STORE_CONCURRENCY_ENV}={value!r} is not a positive integer; set it to the "
            "number of rollouts to finalize or retire at once (for example 16)"
        )
    return number
