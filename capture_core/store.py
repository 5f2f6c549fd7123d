"""`TokenCaptureStore`: the capture protocol on any filesystem, without a lock service.

One object per event, every write create-only, so racing writers and freezers stay correct.
Layout under the root: `<rollout>/e/<call>` entries (stored schema 3: sealed, prompts as
deltas against their parent call, see `compact`), `<rollout>/i/<call>` intents,
`<rollout>/x/<id>` incomplete markers, `<rollout>/FROZEN` (first freezer wins) and
`<rollout>/RETIRED`, the retirement decision: a tombstone (with FROZEN, what a successful
drop leaves) or a refusal written by a loss reported after the freeze.
A snapshot's version is the number of event objects, which only grows until drop or delete.
It is a `TokenSink` and a `TokenSource`; NeMo Gym can load it as a custom sink.
The guarantees are described in docs/store.md.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import logging
import os
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import orjson
from pydantic import ValidationError

from capture_core import compact
from capture_core._bytestore import ByteStore
from capture_core._fsspec import FsspecStore
from capture_core._local import LocalStore
from capture_core.errors import (
    CaptureConflictError,
    CaptureFencedError,
    CaptureRetiredError,
    CaptureStoreError,
    UnreadableCaptureError,
)
from capture_core.ids import ROLLOUT_ID_PATTERN, validate_rollout_id
from capture_core.protocols import TokenCaptureSnapshot
from capture_core.records import (
    TokenEntry,
    coerce_token_entry,
    describe_validation_error,
    entry_fields,
)

T = TypeVar("T")
logger = logging.getLogger(__name__)

ENTRY, INTENT, MARKER = "e", "i", "x"
EVENT_KINDS = (ENTRY, INTENT, MARKER)
FROZEN, RETIRED = "FROZEN", "RETIRED"
MAX_PLAIN_CALL_KEY = 160
IO_THREADS = 32
SETTLE_SECONDS = 5.0
LOCAL_SCHEMES = ("file://", "local://")


def open_byte_store(
    url: str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None
) -> ByteStore:
    """Open the byte store for a URL. Every local form (a path, `file://`, `local://`) is local.

    Only the local backend owns durability and exclusive creates on a local disk; other
    fsspec filesystems must create atomically themselves or are refused (`FsspecStore`).
    """
    text = local_path(url)
    if text is not None:
        if not os.path.isabs(text):
            raise ValueError(
                f"store location {text!r} is relative; use an absolute path or a URL such as "
                "s3://bucket/prefix"
            )
        return LocalStore(text)
    return FsspecStore(os.fspath(url), storage_options)


def local_path(url: str | os.PathLike[str]) -> str | None:
    """The local path a location names (a path, `file://`, `local://`), or `None` if remote."""
    text = os.fspath(url)
    for scheme in LOCAL_SCHEMES:
        if text.startswith(scheme):
            text = text[len(scheme) :]
            break
    return text if "://" not in text and "::" not in text else None


def call_key(model_call_id: str) -> str:
    """A filesystem-safe, case-insensitive, reversible key for a free-form call id.

    Very long ids are keyed by their digest; the entry itself still holds the exact id.
    """
    encoded = base64.b32encode(model_call_id.encode("utf-8")).decode("ascii").rstrip("=").lower()
    if len(encoded) <= MAX_PLAIN_CALL_KEY:
        return "c" + encoded
    return "h" + hashlib.sha256(model_call_id.encode("utf-8")).hexdigest()


def encode_entry(entry: TokenEntry) -> bytes:
    """Canonical stored-schema-1 bytes (whole prompt, no digest), as older versions wrote them.

    Readers refuse these objects (their tokens cannot be verified); kept for benchmarks and
    tests that need the legacy form.
    """
    return orjson.dumps(entry_fields(entry), option=_ENCODE_OPTIONS)


_ENCODE_OPTIONS = orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY


def _json(payload: Mapping[str, Any]) -> bytes:
    return orjson.dumps(payload, option=orjson.OPT_SORT_KEYS)


class TokenCaptureStore:
    """Capture store at `root`: a local path (plain, `file://`, `local://`), `memory://` or S3.

    `storage_options` go to the fsspec filesystem (endpoint, credentials); they are never
    logged or shown in `repr`. Async methods run blocking I/O on a private thread pool.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        """A local directory in NeMo Gym's file-store layout opens as `NemoGymFileStore`.

        Subclasses are constructed as they are, whatever their signature.
        """
        root = args[0] if args else kwargs.get("root")
        if cls is TokenCaptureStore and root is not None:
            from capture_core.nemo_gym_layout import nemo_gym_store_for

            found = nemo_gym_store_for(root)
            if found is not None:
                return found
        return super().__new__(cls)

    def __init__(
        self, root: str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None
    ) -> None:
        self.root = os.fspath(root)
        self.storage_options = dict(storage_options or {})
        self._bytes = open_byte_store(self.root, self.storage_options)
        self._pool: ThreadPoolExecutor | None = None
        self._recent = compact.RecentCumulatives()

    def __repr__(self) -> str:
        return f"TokenCaptureStore({self.root!r})"

    def __reduce__(self) -> tuple[type[TokenCaptureStore], tuple[str, dict[str, Any]]]:
        return (TokenCaptureStore, (self.root, self.storage_options))

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, TokenCaptureStore)
            and self.root == other.root
            and self.storage_options == other.storage_options
        )

    def __hash__(self) -> int:
        return hash(self.root)

    @property
    def byte_store(self) -> ByteStore:
        """The byte store beneath; for tools and tests that inspect the raw layout."""
        return self._bytes

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(IO_THREADS, thread_name_prefix="tokcap-io")
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    # -- writes ---------------------------------------------------------------------------

    async def put(self, entry: Any) -> None:
        """Record one call durably. See `put_now`."""
        await self._run(self.put_now, entry)

    def append(self, entry: Any) -> None:
        """Synchronous `put`, the name NeMo Gym's sink protocol uses."""
        self.put_now(entry)

    def put_now(self, entry: Any) -> None:
        """Record one call durably; when this returns every client of the root sees it.

        A byte-identical repeat is a no-op, also after freeze. A different payload for the
        same call id raises `CaptureConflictError` and marks the rollout incomplete.
        A put after freeze raises `CaptureFencedError`. One whose entry landed while the
        rollout was being frozen raises too: the entry is stored, and a snapshot listed
        before it landed can no longer be retired, because the entry changed its version.
        """
        record = coerce_token_entry(entry)
        rollout_id = validate_rollout_id(record.rollout_id)
        name = call_key(record.model_call_id)
        key = f"{rollout_id}/{ENTRY}/{name}"
        encoded = compact.encode(
            record,
            name,
            self._recent,
            lambda parent: self._bytes.exists(f"{rollout_id}/{ENTRY}/{parent}"),
        )
        if self._fence(rollout_id):
            existing = self._settled(key)
            if existing is not None and compact.stored_identity(existing) == encoded.identity:
                return
            raise CaptureFencedError(
                f"rollout {rollout_id} is already frozen or retired; call "
                f"{record.model_call_id!r} arrived too late and was not recorded"
            )
        existing = self._create_entry(rollout_id, record.model_call_id, key, encoded)
        if existing is None:
            return
        if compact.stored_identity(existing) == encoded.identity:
            self._remember(rollout_id, encoded)
            return
        self._refuse_conflict(rollout_id, record.model_call_id, existing)

    def _create_entry(
        self, rollout_id: str, model_call_id: str, key: str, encoded: compact.EncodedEntry
    ) -> bytes | None:
        """Store the entry; return `None` once stored, or the object already at `key`."""
        for _attempt in range(3):
            if self._bytes.create_in_place(key, encoded.data):
                self._remember(rollout_id, encoded)
                if self._fence(rollout_id):
                    raise CaptureFencedError(
                        f"call {model_call_id!r} of rollout {rollout_id} was stored while the "
                        "rollout was being frozen, so its finalization may not include it; a "
                        "snapshot without it cannot be retired (its version changed), so the "
                        "capture is kept either way. Put every call before finalizing its rollout"
                    )
                return None
            existing = self._settled(key)
            if existing is not None:
                return existing
        raise CaptureStoreError(
            f"rollout {rollout_id}: call {model_call_id!r} could not be stored, its object "
            "keeps vanishing (a concurrent delete of the rollout?); retry the put"
        )

    def _refuse_conflict(self, rollout_id: str, model_call_id: str, existing: bytes) -> None:
        """Another payload (or a torn earlier attempt) holds the call: report the call lost."""
        if compact.is_torn(existing):
            reason = f"an earlier put of call {model_call_id!r} was interrupted (torn object)"
            advice = "the call is lost; the rollout must be collected again"
        else:
            reason = f"call {model_call_id!r} was captured twice with different payloads"
            advice = "use a fresh model_call_id for every call"
        outcome = (
            "it was already retired, so its handed-off record holds the first payload"
            if self._report_loss(rollout_id, model_call_id, reason)
            else "the rollout is marked incomplete and will be masked"
        )
        raise CaptureConflictError(f"rollout {rollout_id}: {reason}; {outcome}; {advice}")

    def _settled(self, key: str) -> bytes | None:
        """The object at `key`, waiting up to `SETTLE_SECONDS` while it is torn.

        A local put writes in place, so a racing put of the same call may still be writing;
        a torn object that stays torn was left by a crashed put.
        """
        deadline = time.monotonic() + SETTLE_SECONDS
        pause = 0.001
        while True:
            data = self._bytes.get(key)
            if data is None or not compact.is_torn(data) or time.monotonic() > deadline:
                return data
            time.sleep(pause)
            pause = min(pause * 2, 0.05)

    def _remember(self, rollout_id: str, encoded: compact.EncodedEntry) -> None:
        if encoded.cumulative is not None:
            self._recent.remember(rollout_id, encoded.cumulative)

    async def mark_incomplete(
        self, rollout_id: str, model_call_id: str = "", reason: str = ""
    ) -> None:
        """Durably record a lost call; see `mark_incomplete_now`."""
        await self._run(self.mark_incomplete_now, rollout_id, model_call_id, reason)

    def mark_incomplete_now(
        self, rollout_id: str, model_call_id: str = "", reason: str = ""
    ) -> None:
        """Durably record a lost call. It changes the version even after a freeze.

        Each call adds evidence; nothing clears it but retirement or delete. Linearizable
        with `drop`: on a frozen rollout the marker also races drop for `RETIRED`, so either
        this returns and no drop can succeed, or it raises `CaptureRetiredError` because the
        rollout was retired first (its handed-off record may lack this call).
        """
        validate_rollout_id(rollout_id)
        text = reason or (
            f"call {model_call_id!r} was lost" if model_call_id else "a call was lost"
        )
        if self._report_loss(rollout_id, model_call_id, text):
            raise CaptureRetiredError(
                f"rollout {rollout_id} was retired before this loss was reported ({text}); "
                "its handed-off record may be missing that call"
            )

    def _report_loss(self, rollout_id: str, model_call_id: str, reason: str) -> bool:
        """Write an incomplete marker; return whether the rollout was retired before it.

        Not frozen yet: every freeze lists after the marker, so every snapshot includes it.
        Frozen: the marker races drop for `RETIRED` with a refusal; exactly one wins.
        """
        self._write_marker(rollout_id, model_call_id, reason)
        if not self._fence(rollout_id):
            return False
        refusal = {"refused": f"a loss was reported after the freeze: {reason}", "at": time.time()}
        return _is_tombstone(self._decide_retirement(rollout_id, refusal))

    def _write_marker(self, rollout_id: str, model_call_id: str, reason: str) -> None:
        marker = {"model_call_id": model_call_id, "reason": reason, "at": time.time()}
        self._bytes.create(f"{rollout_id}/{MARKER}/{uuid.uuid4().hex}", _json(marker))

    async def begin_call(self, rollout_id: str, model_call_id: str) -> None:
        """Durably record the intent to make a call; see `begin_call_now`."""
        await self._run(self.begin_call_now, rollout_id, model_call_id)

    def begin_call_now(self, rollout_id: str, model_call_id: str) -> None:
        """Record the intent to make a call; an intent without an entry at freeze is a loss.

        A repeat is a no-op. After freeze it raises `CaptureFencedError`, and so does an
        intent that landed while the rollout was being frozen: the call must not start.
        """
        validate_rollout_id(rollout_id)
        fenced = CaptureFencedError(
            f"rollout {rollout_id} is already frozen or retired; call {model_call_id!r} "
            "must not start"
        )
        if self._fence(rollout_id):
            raise fenced
        key = f"{rollout_id}/{INTENT}/{call_key(model_call_id)}"
        self._bytes.create_in_place(key, _json({"model_call_id": model_call_id}))
        if self._fence(rollout_id):
            raise fenced  # a freeze raced the intent: the snapshot may lack it

    def _fence(self, rollout_id: str) -> bool:
        """Whether writes are closed. Retirement keeps FROZEN, so one check covers both."""
        return self._bytes.exists(f"{rollout_id}/{FROZEN}")

    # -- freeze ---------------------------------------------------------------------------

    async def freeze(self, rollout_id: str) -> TokenCaptureSnapshot:
        """Fence and read a rollout's capture; see `freeze_now`."""
        return await self._run(self.freeze_now, rollout_id)

    def freeze_now(self, rollout_id: str) -> TokenCaptureSnapshot:
        """Fence a rollout against further writes and return its snapshot.

        Atomic and idempotent: the first freezer's id wins and, with nothing changed, a
        repeat returns the same id, version and entries. No records: an empty snapshot.
        A retired rollout raises `CaptureRetiredError`; an unreadable object raises
        `UnreadableCaptureError` naming it.
        """
        validate_rollout_id(rollout_id)
        # No decision check first: retirement keeps FROZEN, so a retired rollout's claim
        # fails and its listing shows RETIRED, which refuses it below (one round trip less).
        snapshot_id = self._claim_freeze(rollout_id)
        keys = self._bytes.list_prefix(rollout_id)
        if f"{rollout_id}/{RETIRED}" in keys:
            self._refuse_retired(rollout_id)
        events = _events(rollout_id, keys)
        entries, reasons = self._read_entries(rollout_id, events[ENTRY])
        reasons += self._incomplete_reasons(rollout_id, events, entries)
        return TokenCaptureSnapshot(
            rollout_id=rollout_id,
            entries=tuple(entries),
            incomplete=bool(reasons),
            snapshot_id=snapshot_id,
            version=sum(len(names) for names in events.values()),
            incomplete_reasons=tuple(reasons),
        )

    def _refuse_retired(self, rollout_id: str) -> None:
        decision = self._retirement(rollout_id)
        if _is_tombstone(decision):
            raise CaptureRetiredError(
                f"rollout {rollout_id} was already retired after an earlier handoff: snapshot "
                f"{decision.get('snapshot_id')}, version {decision.get('version')}; its capture "
                "cannot be finalized again. Before dispatching a new attempt with this id, run "
                "`tokcap clear --rollouts FILE --store STORE`: it deletes the rollout's whole "
                "capture (entries, markers and the retired tombstone)"
            )

    def _retirement(self, rollout_id: str) -> dict[str, Any] | None:
        """The retirement decision (a tombstone or a refusal), or `None` when undecided."""
        data = self._bytes.get(f"{rollout_id}/{RETIRED}")
        return None if data is None else _parse_retirement(rollout_id, data)

    def _decide_retirement(self, rollout_id: str, proposal: dict[str, Any]) -> dict[str, Any]:
        """Propose a decision for `RETIRED`; the first create wins, and everyone follows it.

        Drop proposes a tombstone, a loss reported after the freeze proposes a refusal.
        Both are create-only writes of one key, so exactly one outcome holds everywhere.
        """
        key = f"{rollout_id}/{RETIRED}"
        for _attempt in range(5):
            if self._bytes.create(key, _json(proposal)):
                return proposal
            winner = self._retirement(rollout_id)
            if winner is not None:
                return winner
        raise CaptureStoreError(
            f"rollout {rollout_id}: its retirement decision keeps vanishing (a dispatch-time "
            "clear running at the same time?); retry after the clear"
        )

    def _claim_freeze(self, rollout_id: str) -> str:
        key = f"{rollout_id}/{FROZEN}"
        for _attempt in range(5):
            mine = uuid.uuid4().hex
            if self._bytes.create(key, _json({"snapshot_id": mine, "frozen_at": time.time()})):
                return mine
            winner = self._bytes.get(key)
            if winner is not None:
                return self._parse_frozen(rollout_id, winner)
        raise CaptureStoreError(
            f"rollout {rollout_id}: freeze marker keeps vanishing (a dispatch-time clear "
            "running at the same time?); finalize the rollout after its dispatch"
        )

    @staticmethod
    def _parse_frozen(rollout_id: str, data: bytes) -> str:
        try:
            return str(orjson.loads(data)["snapshot_id"])
        except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
            raise UnreadableCaptureError(
                f"rollout {rollout_id}: object {rollout_id}/{FROZEN} is not a freeze marker "
                f"({exc}); inspect it, then delete the rollout's capture"
            ) from exc

    def _read_entries(
        self, rollout_id: str, names: list[str]
    ) -> tuple[list[TokenEntry], list[str]]:
        """Parse, rebuild and validate entries; return them and why any could not be rebuilt."""
        keys = [f"{rollout_id}/{ENTRY}/{name}" for name in names]
        stored: dict[str, compact.StoredEntry] = {}
        torn: list[str] = []
        for name, (key, data) in zip(names, self._bytes.iter_many(keys), strict=True):
            if data is None:
                raise CaptureStoreError(
                    f"rollout {rollout_id}: object {key} vanished while freezing (a concurrent "
                    "clear?); freeze again, the result is idempotent"
                )
            if compact.is_torn(data):
                torn.append(
                    f"call {name}: object {key} is torn, a put that never returned (a crash "
                    "mid-write, or a put still running during the freeze): the call is lost"
                )
                continue
            stored[name] = parse_stored_entry(rollout_id, key, name, data)
        reasons = torn + compact.rebuild_prompts(stored)
        entries = [
            finish_entry(rollout_id, f"{rollout_id}/{ENTRY}/{name}", item)
            for name, item in stored.items()
            if item.prompt is not None
        ]
        return entries, reasons

    def _incomplete_reasons(
        self, rollout_id: str, events: dict[str, list[str]], entries: list[TokenEntry]
    ) -> list[str]:
        reasons = []
        if events[MARKER]:
            keys = [f"{rollout_id}/{MARKER}/{name}" for name in events[MARKER]]
            for key, data in sorted(self._bytes.get_many(keys).items()):
                reasons.append(_marker_reason(key, data))
        captured = {call_key(e.model_call_id) for e in entries}
        for name in events[INTENT]:
            if name not in captured:
                reasons.append(f"call began but was never captured (intent {name})")
        return reasons

    def read_entries(self, rollout_id: str) -> list[TokenEntry]:
        """Read a rollout's entries without freezing it (diagnostics; no consistency promise)."""
        validate_rollout_id(rollout_id)
        events = _events(rollout_id, self._bytes.list_prefix(rollout_id))
        return self._read_entries(rollout_id, events[ENTRY])[0]

    # -- retire and delete ----------------------------------------------------------------

    async def drop(self, rollout_id: str, *, snapshot_id: str, version: int) -> bool:
        """Retire exactly the consumed snapshot; see `drop_now`."""
        return await self._run(self.drop_now, rollout_id, snapshot_id, version)

    def drop_now(self, rollout_id: str, snapshot_id: str, version: int) -> bool:
        """Retire exactly the consumed snapshot, leaving a small tombstone.

        Returns `False`, deleting nothing, when the freeze id or version differ, or when a
        loss reported after the freeze refused retirement first (see `mark_incomplete_now`).
        Safe to repeat, also after a crash part-way: the tombstone names the snapshot.
        Call only after the finalized record was durably handed off.
        """
        validate_rollout_id(rollout_id)
        decision = self._retirement(rollout_id)
        if decision is None:
            frozen = self._bytes.get(f"{rollout_id}/{FROZEN}")
            if frozen is None or self._parse_frozen(rollout_id, frozen) != snapshot_id:
                return False
            events = _events(rollout_id, self._bytes.list_prefix(rollout_id))
            if sum(len(names) for names in events.values()) != version:
                return False
            tombstone = {"snapshot_id": snapshot_id, "version": version, "retired_at": time.time()}
            decision = self._decide_retirement(rollout_id, tombstone)
        retired = _is_tombstone(decision) and (
            decision.get("snapshot_id"),
            decision.get("version"),
        ) == (snapshot_id, version)
        if retired:
            self._delete_payloads(rollout_id)
        return retired

    def _delete_payloads(self, rollout_id: str) -> None:
        """Delete every event object, then verify by listing; late objects go too.

        FROZEN and RETIRED stay: together they are the tombstone that fences late writers.
        The deletions need no fsync: the tombstone is durable, and a payload that reappears
        after a crash lies beneath it (a repeated drop or the sweep removes it).
        """
        keep = {f"{rollout_id}/{RETIRED}", f"{rollout_id}/{FROZEN}"}
        for _attempt in range(3):
            doomed = [k for k in self._bytes.list_prefix(rollout_id) if k not in keep]
            if not doomed:
                return
            self._bytes.delete(doomed, durable=False)
        raise CaptureStoreError(
            f"rollout {rollout_id}: retired, but some payloads could not be deleted; "
            "retry the drop (it resumes safely) or check delete permissions"
        )

    def delete(self, rollout_id: str) -> None:
        """Remove a rollout's capture unconditionally, tombstone included, so the id can be reused.

        Used by the dispatch-time clear. Safe to repeat; verified by listing.
        """
        validate_rollout_id(rollout_id)
        self._recent.forget(rollout_id)
        for _attempt in range(3):
            keys = self._bytes.list_prefix(rollout_id)
            if not keys:
                return
            self._bytes.delete(keys)
        raise CaptureStoreError(
            f"rollout {rollout_id}: capture could not be deleted completely; retry the "
            "delete (safe to repeat) or check delete permissions"
        )

    def sweep_retired(self, older_than_seconds: float) -> int:
        """Remove tombstones retired more than `older_than_seconds` ago; return how many.

        A rollout whose tombstone cannot be read or removed is logged by name and skipped,
        so one damaged rollout never stops the sweep. Refusals are not tombstones: they stay
        until the dispatch-time clear. Also removes temporary files crashed local writers left.
        """
        now = time.time()
        swept = 0
        for name in self._bytes.list_children(""):
            if not ROLLOUT_ID_PATTERN.fullmatch(name):
                continue
            try:
                swept += self._sweep_one(name, older_than_seconds, now)
            except Exception as exc:
                logger.warning(
                    "sweep: skipped rollout %s, its tombstone could not be swept: %s: %s",
                    name,
                    type(exc).__name__,
                    exc,
                )
        if isinstance(self._bytes, LocalStore):
            self._bytes.remove_stale_temporaries(max(older_than_seconds, 3600.0), now)
        return swept

    def _sweep_one(self, rollout_id: str, older_than_seconds: float, now: float) -> int:
        decision = self._retirement(rollout_id)
        if not _is_tombstone(decision):
            return 0
        retired_at = decision.get("retired_at")
        if not isinstance(retired_at, (int, float)):
            raise UnreadableCaptureError(
                f"rollout {rollout_id}: tombstone {rollout_id}/{RETIRED} has no retirement "
                "time; inspect it, then delete the rollout's capture"
            )
        if now - retired_at < older_than_seconds:
            return 0
        self.delete(rollout_id)
        return 1

    async def close(self) -> None:
        """Release the thread pool and backend. Safe to repeat."""
        self.close_now()

    def close_now(self) -> None:
        """Synchronous `close`. Safe to repeat."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self._bytes.close()


def _events(rollout_id: str, keys: list[str]) -> dict[str, list[str]]:
    """Group a rollout's listed keys by event kind; unknown objects are refused loudly."""
    events: dict[str, list[str]] = {kind: [] for kind in EVENT_KINDS}
    prefix = f"{rollout_id}/"
    for key in keys:
        rest = key[len(prefix) :]
        if rest in (FROZEN, RETIRED):
            continue
        kind, _, name = rest.partition("/")
        if kind not in events or not name or "/" in name:
            raise UnreadableCaptureError(
                f"rollout {rollout_id}: object {key} does not belong to the capture layout; "
                "move it out of the store root"
            )
        events[kind].append(name)
    return events


def _parse_retirement(rollout_id: str, data: bytes) -> dict[str, Any]:
    try:
        decision = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        decision = exc
    if not isinstance(decision, dict) or not ("snapshot_id" in decision or "refused" in decision):
        raise UnreadableCaptureError(
            f"rollout {rollout_id}: object {rollout_id}/{RETIRED} is not a retirement decision "
            f"({decision if isinstance(decision, Exception) else 'unexpected content'}); "
            "inspect it, then delete the rollout's capture"
        )
    return decision


def _is_tombstone(decision: dict[str, Any] | None) -> bool:
    """Whether a retirement decision retired the capture (rather than refusing it)."""
    return decision is not None and "snapshot_id" in decision and "refused" not in decision


def _unreadable(rollout_id: str, key: str, detail: str) -> UnreadableCaptureError:
    return UnreadableCaptureError(
        f"rollout {rollout_id}: object {key} is not a readable token entry: {detail}"
    )


def parse_stored_entry(rollout_id: str, key: str, name: str, data: bytes) -> compact.StoredEntry:
    """Parse and verify a stored entry, refusing garbage, damage and legacy objects by name."""
    try:
        stored = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise _unreadable(rollout_id, key, str(exc)) from exc
    if not isinstance(stored, dict):
        raise _unreadable(rollout_id, key, "not a JSON object")
    try:
        return compact.parse_stored(name, data, stored)
    except (ValueError, TypeError) as exc:
        raise _unreadable(rollout_id, key, str(exc)) from exc


def finish_entry(rollout_id: str, key: str, stored: compact.StoredEntry) -> TokenEntry:
    """Validate a rebuilt entry, refusing newer schemas and misplaced records by name.

    A delta's tail was validated with its fields and its prefix belongs to its validated
    parent, so the rebuilt prompt is attached without re-checking every token.
    """
    delta = stored.tail is not None and stored.prompt is not stored.tail
    fields = {**stored.fields, "prompt_token_ids": stored.tail if delta else stored.prompt}
    try:
        entry = TokenEntry.model_validate(fields)
    except ValidationError as exc:
        raise _unreadable(rollout_id, key, describe_validation_error(exc)) from exc
    if delta:
        entry.prompt_token_ids = stored.prompt  # type: ignore[assignment]
    if entry.rollout_id != rollout_id or call_key(entry.model_call_id) != stored.name:
        raise UnreadableCaptureError(
            f"rollout {rollout_id}: object {key} holds call {entry.model_call_id!r} of rollout "
            f"{entry.rollout_id!r}; it was copied into the wrong place"
        )
    return entry


def _marker_reason(key: str, data: bytes | None) -> str:
    if data is None:
        return f"incomplete marker {key} vanished"
    try:
        return str(orjson.loads(data).get("reason") or "a call was lost")
    except (orjson.JSONDecodeError, AttributeError):
        return f"unreadable incomplete marker {key}"
