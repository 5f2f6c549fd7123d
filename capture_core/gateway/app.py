"""The gateway's ASGI app: one entry point that checks the key, finds the session and sends
the request to its handler.

- `GET /health`: 200 when the engine answers its own health check, else 503 naming it.
- `GET /metrics`: Prometheus' text format (`metrics`).
- A session path (`/ng-rollout/<id>/training-token-capture/...`): chat and completions
  (and vLLM's `/inference/v1/generate`) are captured (`calls`, `stream_calls`); another path
  there is forwarded and its rollout marked incomplete (a dialect the gateway cannot
  observe); `GET .../v1/models` is forwarded as it is (it samples nothing).
- Any other path is forwarded unchanged and nothing is captured.
With a key set every request but `/health` needs it: a 401 otherwise, nothing recorded.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from capture_core.errors import CaptureFencedError, InvalidInputError
from capture_core.gateway.calls import (
    CallFailed,
    GatewayContext,
    admit,
    error_response,
    unstreamed,
)
from capture_core.gateway.capture import CaptureWriter, new_call_ids
from capture_core.gateway.dialects import PATHS
from capture_core.gateway.engine import Engine
from capture_core.gateway.guard import BodyTooLargeError, Session, key_matches, read_bounded
from capture_core.gateway.guard import session_of as find_session
from capture_core.gateway.metrics import CONTENT_TYPE, GatewayMetrics
from capture_core.gateway.settings import GatewaySettings
from capture_core.gateway.stream_calls import streamed
from capture_core.gateway.versions import VersionReader
from capture_core.store.base import CaptureStore

METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]
HOP_HEADERS = {"content-length", "transfer-encoding", "connection"}
UNCAPTURED_READS = {"/v1/models"}
SETTLE_SECONDS = 10.0
"""At shutdown, how long the calls just cut may take to record their losses before the store
is closed (each is one durable write)."""


def create_app(settings: GatewaySettings, store: CaptureStore) -> Starlette:
    """The gateway for `settings`, writing to `store` (closed when the app shuts down)."""
    metrics = GatewayMetrics()
    ctx = GatewayContext(
        settings=settings,
        writer=CaptureWriter(store, metrics),
        engine=Engine(settings),
        versions=VersionReader(settings.weight_version_source),
        metrics=metrics,
    )

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await ctx.in_flight.settled(SETTLE_SECONDS)  # calls just cut record their losses
            await ctx.writer.drain()
            await ctx.engine.close()
            store.close_now()

    async def entry(request: Request) -> Response:
        return await handle(ctx, request)

    app = Starlette(routes=[Route("/{path:path}", entry, methods=METHODS)], lifespan=lifespan)
    app.state.context = ctx
    return app


async def handle(ctx: GatewayContext, request: Request) -> Response:
    """Route one request (see the module docstring)."""
    path = request.url.path
    if path == "/health" and request.method == "GET":
        problem = await ctx.engine.health()
        if problem is None:
            return Response(b'{"status": "ok"}', 200, media_type="application/json")
        return error_response(503, problem)
    key = ctx.settings.api_key
    if key and not key_matches(request.headers, key):
        return error_response(
            401, "missing or wrong API key: send it as Authorization: Bearer <key>"
        )
    if path == "/metrics" and request.method == "GET":
        return Response(ctx.metrics.exposition(), 200, media_type=CONTENT_TYPE)
    try:
        session = find_session(path)
        body = await read_bounded(
            request.stream(), request.headers.get("content-length"), ctx.settings.max_body_bytes
        )
    except InvalidInputError as exc:
        ctx.metrics.calls.labels(dialect="none", outcome="refused").inc()
        return error_response(400, str(exc))
    except BodyTooLargeError as exc:
        ctx.metrics.calls.labels(dialect="none", outcome="refused").inc()
        return error_response(413, str(exc))
    if session is None:
        return await pass_through(ctx, request, path, body)
    dialect = PATHS.get(session.engine_path) if request.method == "POST" else None
    if dialect is None:
        return await unobserved(ctx, request, session, body)
    try:
        admitted = await admit(ctx, session, dialect, body)
    except CallFailed as failed:
        ctx.metrics.calls.labels(dialect=dialect, outcome="refused").inc()
        return error_response(failed.status, failed.message)
    if admitted.prepared.stream:
        return await streamed(ctx, admitted, request)
    return await unstreamed(ctx, admitted, request)


async def unobserved(
    ctx: GatewayContext, request: Request, session: Session, body: bytes
) -> Response:
    """A path under the prefix the gateway cannot observe: mark the rollout incomplete
    before forwarding (its tokens cannot be captured), as NeMo Gym's capture does. The
    call's intent is stored first, so the rollout masks even when the loss report cannot
    be; a store that cannot take the intent gets the client a 503, nothing forwarded."""
    if request.method == "GET" and session.engine_path in UNCAPTURED_READS:
        return await pass_through(ctx, request, session.engine_path, body)
    call_ids = new_call_ids(1)
    try:
        await ctx.writer.begin(session.rollout_id, call_ids)
    except CaptureFencedError as exc:
        return error_response(409, f"{exc}; the rollout was already finalized")
    except Exception as exc:
        return error_response(
            503,
            f"the capture store cannot record the call, so it was not forwarded "
            f"({type(exc).__name__}: {exc})",
        )
    await ctx.writer.lose(
        session.rollout_id,
        call_ids,
        "unobserved_path",
        f"{request.method} {session.engine_path} is not a dialect the gateway captures",
    )
    ctx.metrics.calls.labels(dialect="unobserved", outcome="lost").inc()
    return await pass_through(ctx, request, session.engine_path, body)


async def pass_through(ctx: GatewayContext, request: Request, path: str, body: bytes) -> Response:
    """Forward a request unchanged and relay the engine's answer as it streams."""
    ctx.metrics.calls.labels(dialect="none", outcome="forwarded").inc()
    headers = ctx.engine.headers(request.headers)
    try:
        response = await ctx.engine.open(request.method, path, headers, body, request.url.query)
    except httpx.HTTPError as exc:
        ctx.metrics.engine_errors.labels(kind="unreachable").inc()
        return error_response(502, f"the engine at {ctx.engine.url} cannot be reached ({exc!r})")

    async def relay() -> AsyncIterator[bytes]:
        try:
            async for part in response.aiter_raw():
                yield part
        finally:
            await response.aclose()

    kept = {k: v for k, v in response.headers.items() if k.lower() not in HOP_HEADERS}
    return StreamingResponse(relay(), response.status_code, headers=kept)
