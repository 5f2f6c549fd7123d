"""A loopback HTTP proxy in front of the moto server that injects S3 faults.

For a chosen fraction of requests, optionally only some operations, it answers 500 or
503 SlowDown, or drops the connection before forwarding (nothing applied) or after forwarding
(applied, but the reply is lost). A request signed with a rejected access key gets 403
InvalidAccessKeyId. `outage_after` (a method and a path fragment) starts an outage, every
later request faulted, the moment such a request has been forwarded and answered: an outage
that begins at an exact step of a run. Every decision is counted, so tests and reports can
say what was injected.
"""

from __future__ import annotations

import http.client
import random
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

FAULT_KINDS = ("500", "503", "drop-before", "drop-after")

SLOW_DOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)
INTERNAL = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>InternalError</Code>'
    b"<Message>We encountered an internal error. Please try again.</Message></Error>"
)
BAD_KEY = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>InvalidAccessKeyId</Code>'
    b"<Message>The AWS Access Key Id you provided does not exist in our records."
    b"</Message></Error>"
)


def operation(method: str, path: str) -> str:
    """A coarse S3 operation name: read, list, write, delete or other."""
    query = urlsplit(path).query
    if method in ("GET", "HEAD"):
        return "list" if "list-type" in query or urlsplit(path).path.count("/") <= 1 else "read"
    if method == "PUT":
        return "write"
    if method == "DELETE" or (method == "POST" and "delete" in query):
        return "delete"
    return "other"


@dataclass
class FaultPlan:
    """What to inject: a rate, the fault kinds, the operations it applies to."""

    rate: float = 0.0
    kinds: tuple[str, ...] = FAULT_KINDS
    operations: tuple[str, ...] = ("read", "list", "write", "delete", "other")
    rejected_key: str | None = None
    outage_after: tuple[str, str] | None = None
    seed: int = 0
    injected: Counter = field(default_factory=Counter)
    forwarded: int = 0

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        self._lock = threading.Lock()

    def decide(self, op: str) -> str | None:
        with self._lock:
            if op not in self.operations or self._rng.random() >= self.rate:
                return None
            kind = self._rng.choice(self.kinds)
            self.injected[f"{op}:{kind}"] += 1
            return kind

    def forwarded_to(self, method: str, path: str) -> None:
        """Count a forwarded request; the one `outage_after` names starts the outage."""
        with self._lock:
            self.forwarded += 1
            starts = self.outage_after is not None and self.outage_after[0] == method
            if starts and self.outage_after[1] in path:
                self.rate, self.outage_after = 1.0, None


def _handler(upstream: tuple[str, int], plan: FaultPlan) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            return None

        def _respond(self, status: int, body: bytes, headers: list[tuple[str, str]] = ()) -> None:
            self.send_response(status)
            upstream_length = None
            for name, value in headers:
                if name.lower() == "content-length":
                    upstream_length = value
                elif name.lower() not in ("transfer-encoding", "connection"):
                    self.send_header(name, value)
            head = self.command == "HEAD" and upstream_length is not None
            self.send_header("Content-Length", upstream_length if head else str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _forward(self, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
            conn = http.client.HTTPConnection(*upstream, timeout=60)
            try:
                headers = {k: v for k, v in self.headers.items() if k.lower() != "expect"}
                conn.request(self.command, self.path, body=body or None, headers=headers)
                response = conn.getresponse()
                return response.status, response.getheaders(), response.read()
            finally:
                conn.close()

        def _drop(self) -> None:
            self.close_connection = True
            self.connection.close()

        def _handle(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            auth = self.headers.get("Authorization") or ""
            if plan.rejected_key and f"Credential={plan.rejected_key}/" in auth:
                plan.injected["rejected-credentials"] += 1
                self._respond(403, BAD_KEY, [("Content-Type", "application/xml")])
                return
            kind = plan.decide(operation(self.command, self.path))
            if kind == "drop-before":
                self._drop()
                return
            if kind in ("500", "503"):
                self._respond(
                    int(kind),
                    SLOW_DOWN if kind == "503" else INTERNAL,
                    [("Content-Type", "application/xml")],
                )
                return
            status, headers, payload = self._forward(body)
            plan.forwarded_to(self.command, self.path)
            if kind == "drop-after":
                self._drop()
                return
            self._respond(status, payload, headers)

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

    return Handler


@contextmanager
def fault_proxy(upstream_url: str, plan: FaultPlan) -> Iterator[str]:
    """Serve the proxy on a free loopback port; yield its endpoint URL."""
    parts = urlsplit(upstream_url)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler((parts.hostname, parts.port), plan))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
