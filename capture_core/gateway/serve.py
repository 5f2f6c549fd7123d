"""Running a gateway in the foreground: bind, say where it listens, stop cleanly.

The socket is bound before the server starts, so port 0 picks a free port and the line
`tokcap gateway: listening on http://H:P` names the real one; it is printed once the server
accepts calls. SIGTERM or SIGINT stops accepting, lets every call in flight finish or be
recorded lost (within the settings' `shutdown_grace`; calls still running then are cut and
recorded lost with the cause `gateway_shutdown`) and returns.
The server runs on uvloop with httptools' parser: uvicorn's pure-Python defaults (asyncio's
loop, h11) cost the gateway a third more CPU per call and, measured here, tens of
milliseconds of added latency (docs/perf.md).
"""

from __future__ import annotations

import asyncio
import signal
import socket
import sys
from collections.abc import Callable
from typing import Any

import uvicorn

from capture_core.gateway.app import create_app
from capture_core.gateway.settings import GatewaySettings
from capture_core.store.base import CaptureStore

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
LISTENING = "tokcap gateway: listening on"
KEEPALIVE_SECONDS = 65
"""An idle client connection is kept this long: longer than clients keep theirs (httpx and
OpenAI's SDK: 5 s), so a client never sends a call on a connection the gateway is closing."""


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on `host:port` (IPv6 when `host` is an IPv6 address)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def url_of(sock: socket.socket, host: str) -> str:
    """The base URL a bound socket answers on."""
    port = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}"


class _Server(uvicorn.Server):
    """uvicorn's server, telling `on_listening` its URL once it accepts calls, and
    `on_cut()` when its grace period at shutdown runs out, just before it cuts the calls
    still running (so their losses name the shutdown, not the client)."""

    url: str = ""
    on_listening: Callable[[str], None] = staticmethod(lambda _url: None)
    on_cut: Callable[[], None] = staticmethod(lambda: None)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            self.on_listening(self.url)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        # uvicorn waits a moment before it starts its grace period: this timer ends first.
        grace = self.config.timeout_graceful_shutdown or 0
        timer = asyncio.get_running_loop().call_later(grace, self.on_cut)
        try:
            await super().shutdown(sockets)
        finally:
            timer.cancel()


def serve(
    settings: GatewaySettings, store: CaptureStore, on_listening: Callable[[str], None]
) -> None:
    """Serve until SIGTERM or SIGINT; `on_listening(url)` once calls are accepted."""
    sock = bind(settings.host, settings.port)
    config: dict[str, Any] = {
        "log_level": "warning",
        "access_log": False,
        "timeout_graceful_shutdown": settings.shutdown_grace,
        "timeout_keep_alive": KEEPALIVE_SECONDS,
        "lifespan": "on",
        "loop": "asyncio" if sys.platform == "win32" else "uvloop",  # uvloop has no Windows
        "http": "httptools",
    }
    app = create_app(settings, store)
    server = _Server(uvicorn.Config(app, **config))
    server.url, server.on_listening = url_of(sock, settings.host), on_listening
    server.on_cut = app.state.context.shutdown_cut
    # uvicorn raises a stop signal again once it has shut down, so the process's handler
    # runs; here that handler is one that returns: the stop was asked for and done (exit 0).
    kept = {sig: signal.signal(sig, _stopped) for sig in STOP_SIGNALS}
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
        for sig, handler in kept.items():
            signal.signal(sig, handler)


def _stopped(_signum: int, _frame: Any) -> None:
    """The process's stop handler while a gateway serves: the stop is uvicorn's to make."""
