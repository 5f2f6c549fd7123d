"""The watch of the Prefect API a command runs against, on a real loopback HTTP server.

It reports a server that stopped (every connection refused) once, within seconds, and never
a server that answers, slowly or with errors.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.support.servers import wait_until
from tokcap.flows.api_watch import ApiWatch


@contextmanager
def health_server(status: int) -> Iterator[tuple[ThreadingHTTPServer, list[int]]]:
    """A server answering `status` to every request; yields it and its request count."""
    seen: list[int] = []

    class Health(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(status)
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server, seen
    finally:
        server.shutdown()
        server.server_close()


def test_a_stopped_server_is_reported_once_within_seconds() -> None:
    lost: queue.Queue[tuple[str, str]] = queue.Queue()
    with health_server(200) as (server, seen):
        url = f"http://127.0.0.1:{server.server_address[1]}/api"
        watch = ApiWatch(url, lambda api, why: lost.put((api, why)), lost_after=1.0, every=0.1)
        watch.thread.start()
        wait_until(lambda: len(seen) >= 3, 30, "the watch to probe the answering server")
        assert lost.empty()
    api, why = lost.get(timeout=30)
    assert api == url and "refused" in why.lower(), why
    watch.thread.join(timeout=30)
    assert not watch.thread.is_alive() and lost.empty(), "reported once, then the watch ends"


def test_a_server_answering_errors_is_not_reported() -> None:
    lost: queue.Queue[tuple[str, str]] = queue.Queue()
    with health_server(503) as (server, seen):
        url = f"http://127.0.0.1:{server.server_address[1]}/api"
        watch = ApiWatch(url, lambda api, why: lost.put((api, why)), lost_after=0.2, every=0.05)
        watch.thread.start()
        try:
            wait_until(lambda: len(seen) >= 10, 30, "ten probes answered 503")
        finally:
            watch.stopped.set()
        watch.thread.join(timeout=30)
    assert lost.empty(), "a busy server is not gone"
