"""Talking to the engine over HTTP: forwarding a call, reading its answer within a bound,
asking after its health. No engine library is imported: any engine that answers in vLLM's
shapes works.

Which key the engine sees: the engine key the operator set (`TOKCAP_ENGINE_API_KEY`), else,
when the gateway has no key of its own, the client's `Authorization` header as it came
(the client's key is the engine's). A gateway key is never passed on. Keys are never logged.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Mapping

import httpx

from capture_core.errors import TokcapError
from capture_core.gateway.dialects import PATHS
from capture_core.gateway.settings import GatewaySettings

FORWARDED_HEADERS = ("content-type", "accept", "user-agent", "x-request-id")
HEALTH_TIMEOUT = 5.0
KEEPALIVE_SECONDS = 2.0
"""An idle connection to the engine is dropped after this long: before the engine's own
keep-alive timeout (uvicorn's and vLLM's: 5 s) can close it under a request being sent."""


class AnswerTooLargeError(TokcapError):
    """The engine's answer passed the gateway's bound on answer bytes."""


def _basic_auth(url: httpx.URL) -> str | None:
    """The `Authorization: Basic` value of a user and password in the engine URL, if any."""
    if not (url.username or url.password):
        return None
    pair = f"{url.username}:{url.password}".encode()
    return "Basic " + base64.b64encode(pair).decode("ascii")


def _text(line: bytearray) -> str:
    return line.removesuffix(b"\r").decode("utf-8", "replace")


class Engine:
    """One engine behind the gateway, with one connection pool."""

    def __init__(self, settings: GatewaySettings) -> None:
        self.url = settings.engine_shown  # what messages name: no credentials
        self.max_answer_bytes = settings.max_answer_bytes
        self._engine_key = settings.engine_api_key
        self._pass_client_key = not settings.api_key
        self._base = settings.engine
        self._urls: dict[str, httpx.URL] = {}
        self._timeout = httpx.Timeout(settings.engine_timeout, connect=10.0, pool=None).as_dict()
        self._transport = httpx.AsyncHTTPTransport(
            limits=httpx.Limits(
                max_connections=None,
                max_keepalive_connections=64,
                keepalive_expiry=KEEPALIVE_SECONDS,
            )
        )
        self.client = httpx.AsyncClient(base_url=settings.engine, transport=self._transport)
        self._basic = _basic_auth(httpx.URL(settings.engine))

    def _url(self, path: str) -> httpx.URL:
        """The engine URL of a path, parsed once for the captured paths (`PATHS`: a fixed
        few, so the cache stays small)."""
        url = self._urls.get(path)
        if url is None:
            url = httpx.URL(self._base + path)
            if path in PATHS:
                self._urls[path] = url
        return url

    def headers(self, incoming: Mapping[str, str]) -> dict[str, str]:
        """The request headers the engine gets."""
        out = {name: incoming[name] for name in FORWARDED_HEADERS if name in incoming}
        if self._engine_key:
            out["authorization"] = f"Bearer {self._engine_key}"
        elif self._pass_client_key and "authorization" in incoming:
            out["authorization"] = incoming["authorization"]
        if self._basic:  # a user and password in the engine URL win, as httpx's client has it
            out["authorization"] = self._basic
        return out

    async def open(
        self, method: str, path: str, headers: Mapping[str, str], body: bytes, query: str = ""
    ) -> httpx.Response:
        """Send a request and return the engine's response with its body not yet read.
        The caller closes it (`aclose`): closing it early aborts the engine's request.

        A pooled connection the engine closed as the request went out fails before any
        answer came; the request is then sent once more, on a new connection (the engine
        sampled nothing for the first, and only an answer is ever captured).
        """
        url = self._url(path) if not query else httpx.URL(f"{self._base}{path}?{query}")
        try:
            return await self._send(method, url, headers, body)
        except (httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError):
            return await self._send(method, url, headers, body)

    async def _send(
        self, method: str, url: httpx.URL, headers: Mapping[str, str], body: bytes
    ) -> httpx.Response:
        """One request straight to the connection pool: the client's cookies, redirects,
        auth and URL joining are work a proxy to one engine never needs, on every call."""
        request = httpx.Request(
            method, url, headers=headers, content=body, extensions={"timeout": self._timeout}
        )
        response = await self._transport.handle_async_request(request)
        response.request = request
        return response

    async def read(self, response: httpx.Response) -> bytes:
        """The whole body of a response, refused past `max_answer_bytes`."""
        parts, size = [], 0
        async for part in response.aiter_bytes():
            size += len(part)
            if size > self.max_answer_bytes:
                raise AnswerTooLargeError(
                    f"the engine's answer passed the gateway's limit of {self.max_answer_bytes} "
                    "bytes (--max-answer-bytes); ask for fewer tokens (max_tokens)"
                )
            parts.append(part)
        return b"".join(parts)

    async def lines(self, response: httpx.Response) -> AsyncIterator[str]:
        """A streamed body's lines (ends `\n` or `\r\n`), refused once the bytes received
        pass `max_answer_bytes`: counted as they arrive, so a line that never ends is
        refused at the limit too, and never held whole in memory past it."""
        size, buffer = 0, bytearray()
        async for part in response.aiter_bytes():
            size += len(part)
            if size > self.max_answer_bytes:
                raise AnswerTooLargeError(
                    f"the engine's streamed answer passed the gateway's limit of "
                    f"{self.max_answer_bytes} bytes (--max-answer-bytes) before its end; ask "
                    "for fewer tokens"
                )
            buffer += part
            start = 0
            while (end := buffer.find(b"\n", start)) != -1:
                yield _text(buffer[start:end])
                start = end + 1
            del buffer[:start]
        if buffer:
            yield _text(buffer)

    async def health(self) -> str | None:
        """`None` when the engine answers its health check with 2xx, else why not."""
        try:
            response = await self.client.get("/health", timeout=HEALTH_TIMEOUT)
        except httpx.HTTPError as exc:
            return f"the engine at {self.url} does not answer ({type(exc).__name__})"
        if response.is_success:
            return None
        return f"the engine at {self.url} answered its health check with {response.status_code}"

    async def close(self) -> None:
        await self.client.aclose()
