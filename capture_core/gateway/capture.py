"""Writing a captured call: its intent before forwarding, its entry before the answer, its
loss when it cannot be captured.

Every store operation runs off the event loop and is durable when awaited (the store's own
`begin_call`, `put` and `mark_incomplete`). An intent recorded and never followed by an entry
masks its rollout as a lost call, as NeMo Gym's do; a loss is also reported explicitly, with
its cause, and logged once per call (rollout, call, cause). A loss report that cannot be
written (the store is down) leaves the intent, which masks the rollout all the same.
Loss reports run shielded from cancellation: a client that hangs up cannot stop them.
This module imports only `records`, `store` and `gateway`.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Mapping
from typing import Any

import anyio

from capture_core.gateway.answers import ChoiceCall
from capture_core.gateway.metrics import GatewayMetrics
from capture_core.records import TokenEntry
from capture_core.records.provenance import LABEL_FIELD, SERVED_METADATA, served_label
from capture_core.store.base import CaptureStore

logger = logging.getLogger("tokcap.gateway")


def new_call_ids(count: int) -> list[str]:
    """Fresh model call ids for one request: one per choice it asks for. 64 random bits name
    a call uniquely within its rollout (a clash needs billions of calls in one rollout) and
    keep the id, stored in each entry and intent, short."""
    base = f"gw-{secrets.token_hex(8)}"
    return [base] if count == 1 else [f"{base}-c{i}" for i in range(count)]


def build_entry(
    rollout_id: str,
    call_id: str,
    call: ChoiceCall,
    answer: Mapping[str, Any],
    provenance: Mapping[str, Any],
    single: bool,
) -> TokenEntry:
    """The `TokenEntry` of one choice. The answer's `id` is the call's `response_id` only
    when the answer has one choice (n > 1 choices share it, which would name no call)."""
    fields: dict[str, Any] = dict(provenance)
    if call.routed_experts is not None:
        fields["routed_experts"] = call.routed_experts
    served_id = answer.get("id")
    if single and isinstance(served_id, str) and served_id:
        fields["response_id"] = served_id
    label = served_label(answer.get(SERVED_METADATA))
    if label is not None and LABEL_FIELD not in fields:
        fields[LABEL_FIELD] = label
    return TokenEntry(
        rollout_id=rollout_id,
        model_call_id=call_id,
        model=str(answer.get("model") or ""),
        prompt_token_ids=call.prompt_ids,
        generation_token_ids=call.generation_ids,
        generation_log_probs=call.log_probs,
        output_items=call.output_items,
        token_item_index=0 if call.output_items else None,
        created_at=time.time(),
        **fields,
    )


class CaptureWriter:
    """Intents, entries and losses of captured calls on one store, counted in `metrics`."""

    def __init__(self, store: CaptureStore, metrics: GatewayMetrics) -> None:
        self.store = store
        self.metrics = metrics
        self._pending: set[asyncio.Task[None]] = set()

    async def begin(self, rollout_id: str, call_ids: list[str]) -> None:
        """Record each call's intent durably, before anything is forwarded."""
        for call_id in call_ids:
            await self.store.begin_call(rollout_id, call_id)

    async def put(self, entry: TokenEntry) -> None:
        """Write one entry durably; its latency goes to the metrics."""
        started = time.perf_counter()
        await self.store.put(entry)
        self.metrics.write_seconds.observe(time.perf_counter() - started)

    async def lose(self, rollout_id: str, call_ids: list[str], cause: str, detail: str) -> None:
        """Report every call lost with its cause; shielded, so it completes even when the
        request is being cancelled. Never raises: a report that cannot be stored is logged,
        and the call's intent still masks the rollout."""
        task = asyncio.get_running_loop().create_task(
            self._report(rollout_id, call_ids, cause, detail)
        )
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
        with anyio.CancelScope(shield=True):
            await asyncio.wait({task})

    async def _report(self, rollout_id: str, call_ids: list[str], cause: str, detail: str) -> None:
        for call_id in call_ids:
            self.metrics.lost.labels(cause=cause).inc()
            logger.warning(
                "lost call: rollout=%s call=%s cause=%s (%s)", rollout_id, call_id, cause, detail
            )
            try:
                await self.store.mark_incomplete(rollout_id, call_id, f"{cause}: {detail}")
            except Exception as exc:
                logger.error(
                    "rollout=%s call=%s: the loss could not be stored (%s: %s); its recorded "
                    "intent still masks the rollout",
                    rollout_id,
                    call_id,
                    type(exc).__name__,
                    exc,
                )

    async def drain(self) -> None:
        """Wait for every loss report still being written (at shutdown)."""
        while self._pending:
            await asyncio.wait(set(self._pending))
