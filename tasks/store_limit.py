"""The global concurrency limit on store requests, shared by every worker of a server.

`tokcap automations apply` creates the limit `tokcap-store-requests`. While it exists, each
finalize and retire batch holds as many of its slots as rollouts it works on at once
(`TOKCAP_STORE_CONCURRENCY`, 16 by default; a finalize from local disk 4 unless it is
set), so the limit caps the store requests in flight across all workers. Without the
limit nothing is acquired: one process alone, or a server where it was never applied, runs
as before.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager

from capture_core.run.concurrency import store_concurrency

STORE_REQUESTS = "tokcap-store-requests"


def limit_of(name: str) -> int | None:
    """The global concurrency limit's size on the configured server (`PREFECT_API_URL`), or
    `None` when there is none of that name, or no configured server (a temporary one has
    no limits)."""
    from prefect.settings import PREFECT_API_URL

    api_url = PREFECT_API_URL.value()
    return _limit_at(str(api_url), name) if api_url else None


@functools.cache
def _limit_at(api_url: str, name: str) -> int | None:
    """Asked once per process and server: a flow-run process is short-lived, and asking per
    batch would cost a request to the server each time."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            limit = client.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            return None
    return limit.limit if limit.active else None


@contextmanager
def store_requests(slots: int | None = None) -> Iterator[None]:
    """Hold this batch's share of `tokcap-store-requests` while it talks to the store:
    `slots`, the rollouts it works on at once (default `store_concurrency()`)."""
    from prefect.concurrency.sync import concurrency

    limit, slots = limit_of(STORE_REQUESTS), slots or store_concurrency()
    if limit is None:
        yield
        return
    if slots > limit:
        raise ValueError(
            f"the global concurrency limit {STORE_REQUESTS} is {limit}, below the "
            f"{slots} store requests one batch makes at once (TOKCAP_STORE_CONCURRENCY, "
            "16 by default, 4 for a finalize from local disk); "
            f"raise it with tokcap automations apply --store-request-limit {slots} or more"
        )
    with concurrency(STORE_REQUESTS, occupy=slots):
        yield
