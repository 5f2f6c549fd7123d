"""The capture-store contract as a runnable check, for any `TokenSink`/`TokenSource` pair.

`run_conformance(sink_factory, source_factory)` exercises the store contract with fresh clients.
The contract is written down in docs/contract.md (The capture store).
Each factory call must return a new client of the same underlying storage.
It returns the names of the checks passed and raises `ConformanceError` on the first failure.
`CHECKS` names every check, in order; `run_check` runs one (the contract suite in
`capture_core.testing.contracts` runs each as its own test).
Checks needing an optional capability (`CAPABILITY`: `begin_call`, `delete`) are left out
when it is absent. This module does not import Prefect or any storage backend.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from capture_core.errors import InvalidInputError
from capture_core.protocols import TokenCaptureSnapshot, TokenSink, TokenSource
from capture_core.records import TokenEntry

SinkFactory = Callable[[], Any]
SourceFactory = Callable[[], Any]

CHECKS = (
    "round_trip",
    "identical_reput",
    "conflicting_reput",
    "mark_incomplete",
    "freeze_idempotent",
    "write_after_freeze",
    "conditional_retirement",
    "tombstone",
    "begin_call_custody",
    "delete_allows_reuse",
)
# Checks that need an optional method: of the sink (begin_call) or of the source (delete).
CAPABILITY = {
    "begin_call_custody": ("sink", "begin_call"),
    "delete_allows_reuse": ("source", "delete"),
}

__all__ = [
    "CAPABILITY",
    "CHECKS",
    "ConformanceError",
    "SinkFactory",
    "SourceFactory",
    "applies",
    "check_conformance",
    "run_check",
    "run_conformance",
]


class ConformanceError(AssertionError):
    """A store broke the capture contract; the message names the check."""


def _entry(rollout_id: str, call: str, prompt: list[int], gen: list[int]) -> TokenEntry:
    return TokenEntry(
        rollout_id=rollout_id,
        model_call_id=call,
        prompt_token_ids=prompt,
        generation_token_ids=gen,
        generation_log_probs=[-0.5] * len(gen),
        output_items=[{"type": "message", "role": "assistant", "content": []}],
        created_at=1.0,
    )


class _Checks:
    def __init__(self, sink_factory: SinkFactory, source_factory: SourceFactory) -> None:
        self.sink_factory = sink_factory
        self.source_factory = source_factory
        self.run = uuid.uuid4().hex[:10]

    def rid(self, name: str) -> str:
        return f"conf-{self.run}-{name}"

    async def sink(self) -> Any:
        sink = self.sink_factory()
        if not isinstance(sink, TokenSink):
            raise ConformanceError("sink: object does not satisfy the TokenSink protocol")
        return sink

    async def source(self) -> Any:
        source = self.source_factory()
        if not isinstance(source, TokenSource):
            raise ConformanceError("source: object does not satisfy the TokenSource protocol")
        return source

    async def freeze_fresh(self, rollout_id: str) -> TokenCaptureSnapshot:
        source = await self.source()
        try:
            return await source.freeze(rollout_id)
        finally:
            await source.close()

    async def stored(self, name: str) -> str:
        """A fresh rollout id holding one stored call, its sink closed."""
        rid = self.rid(name)
        sink = await self.sink()
        await sink.put(_entry(rid, "a", [1], [2]))
        await sink.close()
        return rid

    async def frozen_with_open_sink(self, name: str) -> tuple[str, Any, TokenCaptureSnapshot]:
        """A fresh rollout with one call, frozen, and its writer's sink still open."""
        rid = self.rid(name)
        sink = await self.sink()
        await sink.put(_entry(rid, "a", [1], [2]))
        return rid, sink, await self.freeze_fresh(rid)

    async def drop_fresh(self, rollout_id: str, snapshot_id: str, version: int) -> bool:
        """`drop` through a new source, so no client state can vouch for the snapshot."""
        source = await self.source()
        try:
            return await source.drop(rollout_id, snapshot_id=snapshot_id, version=version)
        finally:
            await source.close()

    async def round_trip(self) -> None:
        rid = self.rid("round-trip")
        sink = await self.sink()
        calls = {"call/1 ünïcode": [1, 2, 3], "call 2": [1, 2, 3, 9, 8, 4]}
        for call, prompt in calls.items():
            await sink.put(_entry(rid, call, prompt, [9, 8] if call == "call/1 ünïcode" else [5]))
        await sink.close()
        snap = await self.freeze_fresh(rid)
        got = {e.model_call_id: e.prompt_token_ids for e in snap.entries}
        _expect(got == calls, "round_trip", f"froze {got}, expected {calls}")
        _expect(not snap.incomplete, "round_trip", "a clean capture froze as incomplete")
        empty = await self.freeze_fresh(self.rid("never-written"))
        _expect(empty.entries == (), "round_trip", "a rollout with no records froze non-empty")

    async def identical_reput(self) -> None:
        rid = self.rid("reput")
        sink = await self.sink()
        await sink.put(_entry(rid, "a", [1], [2]))
        await sink.put(_entry(rid, "a", [1], [2]))
        await sink.close()
        snap = await self.freeze_fresh(rid)
        _expect(len(snap.entries) == 1, "identical_reput", f"{len(snap.entries)} entries")
        _expect(not snap.incomplete, "identical_reput", "identical re-put made it incomplete")

    async def conflicting_reput(self) -> None:
        rid = self.rid("conflict")
        sink = await self.sink()
        await sink.put(_entry(rid, "a", [1], [2]))
        raised = await _raises(sink.put(_entry(rid, "a", [1], [3])))
        await sink.close()
        _expect(raised, "conflicting_reput", "a different payload for one call id was accepted")
        snap = await self.freeze_fresh(rid)
        _expect(snap.incomplete, "conflicting_reput", "the conflict did not mark it incomplete")

    async def mark_incomplete(self) -> None:
        rid = self.rid("incomplete")
        sink = await self.sink()
        await sink.put(_entry(rid, "a", [1], [2]))
        before = await self.freeze_fresh(rid)
        await sink.mark_incomplete(rid, "b")
        await sink.close()
        after = await self.freeze_fresh(rid)
        _expect(after.incomplete, "mark_incomplete", "marker not visible to a fresh client")
        _expect(after.version != before.version, "mark_incomplete", "version did not change")
        dropped = await self.drop_fresh(rid, before.snapshot_id, before.version)
        _expect(not dropped, "mark_incomplete", "retired a snapshot older than the marker")

    async def freeze_idempotent(self) -> None:
        rid = await self.stored("idempotent")
        first, second = await asyncio.gather(self.freeze_fresh(rid), self.freeze_fresh(rid))
        third = await self.freeze_fresh(rid)
        for other in (second, third):
            same = (other.snapshot_id, other.version, other.entries) == (
                first.snapshot_id,
                first.version,
                first.entries,
            )
            _expect(same, "freeze_idempotent", "a repeated freeze returned another snapshot")

    async def write_after_freeze(self) -> None:
        rid, sink, snap = await self.frozen_with_open_sink("late-write")
        raised = await _raises(sink.put(_entry(rid, "late", [1, 2, 3], [4])))
        await sink.close()
        if raised:
            return
        dropped = await self.drop_fresh(rid, snap.snapshot_id, snap.version)
        _expect(not dropped, "write_after_freeze", "a late put slipped in silently")

    async def conditional_retirement(self) -> None:
        rid = await self.stored("retire")
        snap = await self.freeze_fresh(rid)
        source = await self.source()
        stale = await source.drop(rid, snapshot_id=snap.snapshot_id, version=snap.version + 1)
        wrong = await source.drop(rid, snapshot_id="not-" + snap.snapshot_id, version=snap.version)
        _expect(not stale and not wrong, "conditional_retirement", "a stale drop succeeded")
        kept = await self.freeze_fresh(rid)
        _expect(len(kept.entries) == 1, "conditional_retirement", "a refused drop lost evidence")
        exact = await source.drop(rid, snapshot_id=snap.snapshot_id, version=snap.version)
        await source.close()
        _expect(exact, "conditional_retirement", "the exact snapshot could not be retired")

    async def begin_call_custody(self) -> None:
        sink = await self.sink()
        lost, kept = self.rid("intent-lost"), self.rid("intent-kept")
        await sink.begin_call(lost, "a")
        await sink.begin_call(kept, "a")
        await sink.put(_entry(kept, "a", [1], [2]))
        await sink.close()
        _expect((await self.freeze_fresh(lost)).incomplete, "begin_call", "lost intent unnoticed")
        _expect(not (await self.freeze_fresh(kept)).incomplete, "begin_call", "kept intent masked")

    async def tombstone(self) -> None:
        rid, sink, snap = await self.frozen_with_open_sink("tombstone")
        dropped = await self.drop_fresh(rid, snap.snapshot_id, snap.version)
        _expect(dropped, "tombstone", "could not retire")
        raised = await _raises(sink.put(_entry(rid, "late", [1, 2], [3])))
        await sink.close()
        _expect(raised, "tombstone", "a late writer was accepted after retirement")

    async def delete_allows_reuse(self) -> None:
        rid, sink, snap = await self.frozen_with_open_sink("reuse")
        source = await self.source()
        await source.drop(rid, snapshot_id=snap.snapshot_id, version=snap.version)
        await asyncio.to_thread(source.delete, rid)
        await source.close()
        await sink.put(_entry(rid, "b", [7], [8]))
        await sink.close()
        again = await self.freeze_fresh(rid)
        got = [e.model_call_id for e in again.entries]
        _expect(got == ["b"], "delete_allows_reuse", f"after delete and reuse froze {got}")


async def _raises(awaitable: Awaitable[Any]) -> bool:
    try:
        await awaitable
    except Exception:
        return True
    return False


def _expect(ok: bool, check: str, message: str) -> None:
    if not ok:
        raise ConformanceError(f"{check}: {message}")


def applies(name: str, sink: Any, source: Any) -> bool:
    """Whether check `name` applies to this sink/source pair (it has the optional method)."""
    if name not in CAPABILITY:
        return True
    side, method = CAPABILITY[name]
    return hasattr(sink if side == "sink" else source, method)


async def check_conformance(sink_factory: SinkFactory, source_factory: SourceFactory) -> list[str]:
    """Async form of `run_conformance`, for callers already inside an event loop."""
    checks = _Checks(sink_factory, source_factory)
    probe_sink, probe_source = sink_factory(), source_factory()
    plan = [name for name in CHECKS if applies(name, probe_sink, probe_source)]
    for client in (probe_sink, probe_source):
        await client.close()
    passed = []
    for name in plan:
        await getattr(checks, name)()
        passed.append(name)
    return passed


def run_conformance(sink_factory: SinkFactory, source_factory: SourceFactory) -> list[str]:
    """Check a sink/source pair against the capture contract; return the checks passed."""
    return asyncio.run(check_conformance(sink_factory, source_factory))


def run_check(name: str, sink_factory: SinkFactory, source_factory: SourceFactory) -> None:
    """Run the one check `name` (of `CHECKS`) with fresh clients; raise `ConformanceError`."""
    if name not in CHECKS:
        raise InvalidInputError(f"unknown conformance check {name!r}; the checks are {CHECKS}")
    asyncio.run(getattr(_Checks(sink_factory, source_factory), name)())
