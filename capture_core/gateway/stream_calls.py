"""One captured call, streamed: every event passes through as it comes, the terminal
`[DONE]` is held back until the capture is stored.

The client sees each chunk (without the fields the gateway added) as the engine sends it;
the gateway joins them (`streams.StreamAssembly`) and, once the engine's `[DONE]` came
after every choice's `finish_reason`, stores every choice's entry durably, then sends
`[DONE]`. A stream that ends any other way records its calls lost and ends with an error
event instead of `[DONE]`, so no client takes an uncaptured or partial generation for a
whole one: the engine broke off or restarted, the answer passed its limit, the client hung
up or a stopping gateway's grace period ran out (the engine's request is then aborted by
closing its connection).
This module imports only `gateway`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import httpx
import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from capture_core.gateway.calls import (
    Admitted,
    CallFailed,
    GatewayContext,
    dropped,
    error_body,
    failed_call,
    finish,
    forward,
    lose,
    timed_out,
    unreadable,
)
from capture_core.gateway.dialects import strip_added
from capture_core.gateway.engine import AnswerTooLargeError
from capture_core.gateway.streams import DONE, StreamAssembly, sse_events


def _event(data: bytes | str) -> bytes:
    return b"data: " + (data.encode() if isinstance(data, str) else data) + b"\n\n"


async def streamed(ctx: GatewayContext, admitted: Admitted, request: Request) -> Response:
    """Forward a streamed call; the engine's error status is passed on as it is."""
    try:
        response = await forward(ctx, admitted, request)
    except CallFailed as failed:
        return await failed_call(ctx, admitted, failed)
    if not response.is_success:
        try:
            body = await ctx.engine.read(response)
        except (httpx.HTTPError, AnswerTooLargeError):
            body = b""
        finally:
            await response.aclose()
        ctx.metrics.engine_errors.labels(kind=str(response.status_code)).inc()
        await lose(ctx, admitted, "engine_error", f"the engine answered {response.status_code}")
        media = response.headers.get("content-type", "application/json")
        return Response(body, response.status_code, media_type=media)
    return StreamingResponse(
        relay(ctx, admitted, response),
        response.status_code,
        media_type="text/event-stream",
        headers={"cache-control": "no-cache"},
    )


async def relay(
    ctx: GatewayContext, admitted: Admitted, response: httpx.Response
) -> AsyncIterator[bytes]:
    """The client's events; the capture is stored before `[DONE]`, or the calls are lost."""
    settled = False  # the calls are stored or reported lost: nothing left to record
    assembly = StreamAssembly(admitted.dialect)
    received = 0
    ctx.in_flight.enter()
    try:
        try:
            async for data in sse_events(ctx.engine.lines(response)):
                if data == DONE:
                    assembly.done = True
                    break
                received += len(data)
                chunk = _chunk(ctx, data)
                assembly.add(chunk)
                yield _event(orjson.dumps(strip_added(chunk, admitted.prepared, chunk=True)))
            if not assembly.done:
                raise CallFailed(
                    502,
                    "the engine's stream ended before [DONE]; the engine restarted or dropped "
                    "the connection",
                    "engine_dropped",
                )
            if assembly.unfinished():
                raise CallFailed(
                    502,
                    f"the engine's stream said [DONE] before choices {assembly.unfinished()} "
                    "had a finish_reason, so their generations may be cut short",
                    "engine_dropped",
                )
            await finish(ctx, admitted, assembly.answer(), received)
        except httpx.TimeoutException as exc:
            raise timed_out(ctx, exc) from None
        except httpx.HTTPError as exc:
            raise dropped(ctx, exc) from None
        except AnswerTooLargeError as exc:
            raise CallFailed(413, str(exc), "answer_too_large") from None
        except CallFailed:
            raise
        except Exception as exc:  # an engine stream in a shape nothing here reads
            raise unreadable(exc) from None
        settled = True
        ctx.metrics.calls.labels(dialect=admitted.dialect, outcome="captured").inc(
            len(admitted.call_ids)
        )
        yield _event(DONE)
    except CallFailed as failed:
        settled = True
        with anyio.CancelScope(shield=True):
            await response.aclose()
            if failed.cause is not None:
                await lose(ctx, admitted, failed.cause, failed.message)
        yield _event(error_body(failed.status, failed.message))
    finally:
        try:
            with anyio.CancelScope(shield=True):
                await response.aclose()  # aborts the engine's request when it is still running
                if not settled:
                    await lose(ctx, admitted, *ctx.cut_cause())
        finally:
            ctx.in_flight.leave()


def _chunk(ctx: GatewayContext, data: str) -> dict:
    """One engine event as a chunk; an error event or one that is not JSON fails the call."""
    try:
        chunk = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise CallFailed(
            502, "the engine sent an event that is not JSON", "unusable_answer"
        ) from None
    if not isinstance(chunk, dict):
        raise CallFailed(
            502, "the engine sent an event that is not a JSON object", "unusable_answer"
        )
    if "error" in chunk:
        ctx.metrics.engine_errors.labels(kind="stream_error").inc()
        error = chunk["error"]
        message = error.get("message") if isinstance(error, dict) else error
        raise CallFailed(502, f"the engine reported an error mid-stream: {message}", "engine_error")
    return chunk
