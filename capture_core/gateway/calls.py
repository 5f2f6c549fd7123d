"""One captured call, unstreamed, from admission to answer; and the steps streams share.

Admission: the request is read within its limit and prepared (`dialects`), the start
version is read, and every call's intent is durable before a byte goes to the engine.
Completion: the answer is read into one call per choice (`answers`), stamped with the end
version and the engine's spans (`versions`), and every entry is durable before the client
gets the answer. Anything that stops a call on the way reports it lost with its cause and
gives the client an error: never an answer whose capture was not stored.
This module imports only `errors`, `records`, `store` and `gateway`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx
import orjson
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response

from capture_core.errors import (
    CaptureFencedError,
    EngineAnswerError,
    InvalidInputError,
    InvalidRecordError,
    TokcapError,
)
from capture_core.gateway.answers import choice_calls
from capture_core.gateway.capture import CaptureWriter, build_entry, new_call_ids
from capture_core.gateway.dialects import Prepared, prepare, strip_added
from capture_core.gateway.engine import AnswerTooLargeError, Engine
from capture_core.gateway.guard import Session
from capture_core.gateway.metrics import GatewayMetrics
from capture_core.gateway.settings import GatewaySettings
from capture_core.gateway.versions import VersionReader, engine_provenance
from capture_core.records import TokenEntry, describe_validation_error


class InFlight:
    """The captured calls running now, so a stopping gateway lets each one cut by the
    shutdown record its loss before the store is closed."""

    def __init__(self) -> None:
        self.count = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def enter(self) -> None:
        self.count += 1
        self._idle.clear()

    def leave(self) -> None:
        self.count -= 1
        if self.count == 0:
            self._idle.set()

    async def settled(self, timeout: float) -> None:
        """Wait until no call runs, at most `timeout` seconds."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout)


@dataclass
class GatewayContext:
    """What every handler shares: settings, store writer, engine, versions, metrics."""

    settings: GatewaySettings
    writer: CaptureWriter
    engine: Engine
    versions: VersionReader
    metrics: GatewayMetrics
    in_flight: InFlight = field(default_factory=InFlight)
    cut_by_shutdown: bool = False
    """Set once the gateway stops and its grace period ran out: a call cancelled from then
    on was cut by the shutdown (cause `gateway_shutdown`), not by its client."""

    def shutdown_cut(self) -> None:
        self.cut_by_shutdown = True

    def cut_cause(self) -> tuple[str, str]:
        """The cause and detail of a call stopped before it settled."""
        if self.cut_by_shutdown:
            return (
                "gateway_shutdown",
                f"the gateway stopped and its grace period of {self.settings.shutdown_grace:g} "
                "s ran out before the call finished",
            )
        return "client_disconnected", "the client closed the stream"


class CallFailed(TokcapError):
    """A call that cannot be answered: its HTTP status, the loss cause (`None`: nothing was
    recorded, so nothing is lost) and the message the client gets."""

    def __init__(self, status: int, message: str, cause: str | None = None) -> None:
        super().__init__(message)
        self.status, self.cause, self.message = status, cause, message


def error_body(status: int, message: str) -> bytes:
    """An error in the OpenAI shape clients read: `{"error": {"message", "type", "code"}}`."""
    return orjson.dumps({"error": {"message": message, "type": "tokcap_gateway", "code": status}})


def error_response(status: int, message: str) -> Response:
    return Response(error_body(status, message), status, media_type="application/json")


@dataclass
class Admitted:
    """A call admitted: intents durable, its start version read."""

    session: Session
    dialect: str
    prepared: Prepared
    call_ids: list[str]
    start: int | None


async def admit(ctx: GatewayContext, session: Session, dialect: str, body: bytes) -> Admitted:
    """Prepare the request, read the start version and record every call's intent.
    Raises `CallFailed` (nothing forwarded; nothing lost unless an intent was written)."""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise CallFailed(400, "the request body is not JSON") from None
    if not isinstance(parsed, dict):
        raise CallFailed(400, "the request body must be a JSON object")
    try:
        prepared = prepare(dialect, parsed)
    except InvalidInputError as exc:
        raise CallFailed(400, str(exc)) from None
    try:
        start = await ctx.versions.current()
    except InvalidRecordError as exc:
        raise CallFailed(503, f"the call was not forwarded: {exc}") from None
    call_ids = new_call_ids(prepared.choices)
    admitted = Admitted(session, dialect, prepared, call_ids, start)
    try:
        await ctx.writer.begin(session.rollout_id, call_ids)
    except CaptureFencedError as exc:
        raise CallFailed(409, f"{exc}; the rollout was already finalized") from None
    except Exception as exc:
        await lose(ctx, admitted, "store_failed", f"intent not stored: {exc}")
        raise CallFailed(
            503,
            f"the capture store cannot record the call, so it was not "
            f"forwarded ({type(exc).__name__}: {exc})",
        ) from None
    return admitted


async def lose(ctx: GatewayContext, admitted: Admitted, cause: str, detail: str) -> None:
    """Report every call of `admitted` lost."""
    ctx.metrics.calls.labels(dialect=admitted.dialect, outcome="lost").inc(len(admitted.call_ids))
    await ctx.writer.lose(admitted.session.rollout_id, admitted.call_ids, cause, detail)


async def forward(ctx: GatewayContext, admitted: Admitted, request: Request) -> httpx.Response:
    """Send the prepared request to the engine; a transport failure is a `CallFailed`."""
    body = orjson.dumps(admitted.prepared.body)
    headers = ctx.engine.headers(request.headers)
    headers["content-type"] = "application/json"
    try:
        return await ctx.engine.open("POST", admitted.session.engine_path, headers, body)
    except httpx.TimeoutException as exc:
        ctx.metrics.engine_errors.labels(kind="timeout").inc()
        raise CallFailed(
            504, f"the engine did not answer in time ({exc!r})", "engine_timeout"
        ) from None
    except httpx.HTTPError as exc:
        ctx.metrics.engine_errors.labels(kind="unreachable").inc()
        raise CallFailed(
            502,
            f"the engine at {ctx.engine.url} cannot be reached ({type(exc).__name__})",
            "engine_unreachable",
        ) from None


async def finish(
    ctx: GatewayContext, admitted: Admitted, answer: Mapping[str, Any], answer_bytes: int
) -> list[TokenEntry]:
    """Every choice's entry, stamped and stored durably; raises `CallFailed` otherwise.
    `answer_bytes` (the engine's answer as it came) is counted once all are stored."""
    try:
        calls = choice_calls(admitted.dialect, answer, admitted.prepared.prompt_ids)
    except EngineAnswerError as exc:
        raise CallFailed(502, str(exc), "unusable_answer") from None
    if len(calls) != len(admitted.call_ids):
        raise CallFailed(
            502,
            f"the engine answered {len(calls)} choices for the {len(admitted.call_ids)} the "
            "request asked for, so the calls cannot be told apart",
            "unusable_answer",
        )
    try:
        end = await ctx.versions.current()
    except InvalidRecordError as exc:
        raise CallFailed(503, str(exc), "version_source") from None
    entries = _entries(ctx, admitted, answer, calls, end)
    for entry in entries:
        try:
            await ctx.writer.put(entry)
        except Exception as exc:
            raise CallFailed(
                503,
                f"the capture store could not store call {entry.model_call_id} "
                f"({type(exc).__name__}: {exc}); the answer is withheld because its capture "
                "was not stored",
                "store_failed",
            ) from None
    ctx.metrics.bytes_stored.inc(answer_bytes)
    return entries


def _entries(
    ctx: GatewayContext,
    admitted: Admitted,
    answer: Mapping[str, Any],
    calls: list[Any],
    end: int | None,
) -> list[TokenEntry]:
    settings = ctx.settings
    base: dict[str, Any] = {"replica": settings.replica_name}
    if admitted.start is not None:
        base["start_weight_version"] = admitted.start
    if end is not None:
        base["end_weight_version"] = end
    entries = []
    for call_id, call in zip(admitted.call_ids, sorted(calls, key=lambda c: c.index), strict=True):
        try:
            spans = engine_provenance(
                call.version_spans, len(call.generation_ids), settings.engine_labels_are_versions
            )
            entries.append(
                build_entry(
                    admitted.session.rollout_id,
                    call_id,
                    call,
                    answer,
                    {**base, **spans},
                    single=len(calls) == 1,
                )
            )
        except EngineAnswerError as exc:
            raise CallFailed(502, str(exc), "unusable_answer") from None
        except (ValidationError, InvalidRecordError) as exc:
            detail = (
                describe_validation_error(exc) if isinstance(exc, ValidationError) else str(exc)
            )
            raise CallFailed(
                502, f"the engine's answer cannot be captured: {detail}", "unusable_answer"
            ) from None
    return entries


async def unstreamed(ctx: GatewayContext, admitted: Admitted, request: Request) -> Response:
    """Forward, read, capture, answer: the whole of an unstreamed captured call. A client
    that hangs up does not stop it; a shutdown that cuts it records it lost."""
    ctx.in_flight.enter()
    try:
        return await _unstreamed(ctx, admitted, request)
    except asyncio.CancelledError:
        cause, detail = ctx.cut_cause()
        with anyio.CancelScope(shield=True):
            await lose(ctx, admitted, cause, detail)
        raise
    finally:
        ctx.in_flight.leave()


async def _unstreamed(ctx: GatewayContext, admitted: Admitted, request: Request) -> Response:
    try:
        response = await forward(ctx, admitted, request)
        try:
            body = await ctx.engine.read(response)
        finally:
            await response.aclose()
        if not response.is_success:
            ctx.metrics.engine_errors.labels(kind=str(response.status_code)).inc()
            await lose(ctx, admitted, "engine_error", f"the engine answered {response.status_code}")
            media = response.headers.get("content-type", "application/json")
            return Response(body, response.status_code, media_type=media)
        try:
            answer = orjson.loads(body)
        except orjson.JSONDecodeError:
            raise CallFailed(502, "the engine's answer is not JSON", "unusable_answer") from None
        if not isinstance(answer, dict):
            raise CallFailed(502, "the engine's answer is not a JSON object", "unusable_answer")
        await finish(ctx, admitted, answer, len(body))
    except CallFailed as failed:
        return await failed_call(ctx, admitted, failed)
    except httpx.TimeoutException as exc:
        return await failed_call(ctx, admitted, timed_out(ctx, exc))
    except httpx.HTTPError as exc:
        return await failed_call(ctx, admitted, dropped(ctx, exc))
    except AnswerTooLargeError as exc:
        return await failed_call(ctx, admitted, CallFailed(413, str(exc), "answer_too_large"))
    except Exception as exc:  # an engine answer in a shape nothing here reads
        return await failed_call(ctx, admitted, unreadable(exc))
    ctx.metrics.calls.labels(dialect=admitted.dialect, outcome="captured").inc(
        len(admitted.call_ids)
    )
    if admitted.prepared.top or admitted.prepared.choice:  # fields the gateway asked for
        body = orjson.dumps(strip_added(answer, admitted.prepared))
    return Response(body, response.status_code, media_type="application/json")


def timed_out(ctx: GatewayContext, exc: Exception) -> CallFailed:
    ctx.metrics.engine_errors.labels(kind="timeout").inc()
    return CallFailed(504, f"the engine did not answer in time ({exc!r})", "engine_timeout")


def unreadable(exc: Exception) -> CallFailed:
    """An answer whose shape broke the reading (a field of the wrong type): the call is lost
    as unusable, and the client told so, rather than the request failing with a bare 500."""
    return CallFailed(
        502,
        f"the engine's answer cannot be read ({type(exc).__name__}: {exc})",
        "unusable_answer",
    )


def dropped(ctx: GatewayContext, exc: Exception) -> CallFailed:
    ctx.metrics.engine_errors.labels(kind="dropped").inc()
    return CallFailed(
        502,
        f"the engine's answer broke off ({type(exc).__name__}); the engine restarted or "
        "dropped the connection",
        "engine_dropped",
    )


async def failed_call(ctx: GatewayContext, admitted: Admitted, failed: CallFailed) -> Response:
    """Report the calls lost (when the failure has a cause) and answer with the error."""
    if failed.cause is not None:
        await lose(ctx, admitted, failed.cause, failed.message)
    return error_response(failed.status, failed.message)
