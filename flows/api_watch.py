"""Notices within seconds that the Prefect API a command runs against went away.

Prefect's client retries a refused connection for minutes before a flow run fails, and
meanwhile prints its own internals. `ApiWatch` asks the API's health endpoint every second
from a daemon thread; once every request has been refused for `LOST_AFTER_SECONDS`, it
calls `on_lost` once with the API's URL and what it saw. A busy server (a slow answer, a
5xx) is not gone: only a connection that cannot be made counts.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import httpx

LOST_AFTER_SECONDS = 5.0
PROBE_EVERY_SECONDS = 1.0
PROBE_TIMEOUT_SECONDS = 5.0

OnLost = Callable[[str, str], None]


def refused(client: httpx.Client, api_url: str) -> str | None:
    """Why no connection to the API could be made, or `None` when it answered at all."""
    try:
        client.get(f"{api_url.rstrip('/')}/health")
    except httpx.ConnectError as exc:
        return " ".join(str(exc).split()) or type(exc).__name__
    except httpx.HTTPError:  # a timeout or a cut reply: busy or restarting, not gone
        return None
    return None


class ApiWatch:
    """Probes `api_url` until stopped; calls `on_lost(api_url, seen)` once, from its thread,
    when connections have been refused for `lost_after` seconds in a row."""

    def __init__(
        self,
        api_url: str,
        on_lost: OnLost,
        lost_after: float = LOST_AFTER_SECONDS,
        every: float = PROBE_EVERY_SECONDS,
    ) -> None:
        self.api_url, self.on_lost = api_url, on_lost
        self.lost_after, self.every = lost_after, every
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self.run, name="tokcap-api-watch", daemon=True)

    def run(self) -> None:
        since: float | None = None
        with httpx.Client(timeout=PROBE_TIMEOUT_SECONDS) as client:
            while not self.stopped.wait(self.every):
                seen = refused(client, self.api_url)
                if seen is None:
                    since = None
                    continue
                since = since if since is not None else time.monotonic()
                waited = time.monotonic() - since
                if waited >= self.lost_after and not self.stopped.is_set():
                    self.on_lost(self.api_url, f"{seen} for {waited:.0f} s")
                    return


@contextmanager
def watching(api_url: str, on_lost: OnLost | None) -> Iterator[None]:
    """Watch `api_url` while the block runs (nothing is watched without `on_lost`)."""
    if on_lost is None:
        yield
        return
    watch = ApiWatch(api_url, on_lost)
    watch.thread.start()
    try:
        yield
    finally:
        watch.stopped.set()
