"""The freeze claim and the retirement decision: two create-only objects per rollout.

`FROZEN` holds the first freezer's snapshot id; every later freezer follows it.
`RETIRED` holds the one retirement decision: a tombstone (drop retired exactly that
snapshot) or a refusal (a loss was reported after the freeze). Both are proposed by a
create of one key, so exactly one outcome holds for every client, without a lock service.
A tombstone is written for a group of rollouts at once (`TombstoneGroups`): one object
names each rollout's snapshot, and each rollout's `RETIRED` is an exclusive create of it.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from capture_core.errors import (
    CaptureRetiredError,
    CaptureStoreError,
    InvalidInputError,
    UnreadableCaptureError,
    is_transient,
)
from capture_core.ids import ROLLOUT_ID_PATTERN
from capture_core.protocols import DropRequest
from capture_core.storage import ByteStore, FolderView, StagedObject
from capture_core.store.capture_layout import FROZEN, MARKER, RETIRED, frozen_key, retired_key
from capture_core.store.stored_json import encode_json

# The sweep is a `TokenCaptureStore` operation: it logs under the store's name, as it did.
logger = logging.getLogger("capture_core.store")

# How old a tombstone must be before the scheduled sweep and `tokcap sweep` remove it. It must
# outlive every writer of the retired attempt; docs/store.md ("Sweeping tombstones") gives
# the reasoning: live writers end within minutes, the default also covers paused processes.
DEFAULT_SWEEP_AGE = "2d"
MIN_SWEEP_AGE_SECONDS = 3600.0
_AGE = re.compile(r"([0-9]+)([smhd])")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# Rollouts whose decisions are read, and (on S3) captures deleted, together; on S3 a sweep
# paused within a chunk is the open window of docs/store.md, so the chunk stays small.
SWEEP_CHUNK = 256
TOMBSTONE_GROUP = 64  # rollouts whose tombstones are one staged object (bounds its size)
GROUP_KEY = "retired"  # a group tombstone: {"retired": {rollout_id: {snapshot_id, version}}}


@dataclass(frozen=True)
class Proposal:
    """A decision offered for one rollout's `RETIRED`, its bytes staged for the create."""

    decision: dict[str, Any]
    staged: StagedObject


def claim_freeze(byte_store: ByteStore, rollout_id: str) -> str:
    """Propose a fresh snapshot id for `FROZEN`; return the one that holds (ours or earlier)."""
    key = frozen_key(rollout_id)
    for _attempt in range(5):
        mine = uuid.uuid4().hex
        if byte_store.create(key, encode_json({"snapshot_id": mine, "frozen_at": time.time()})):
            return mine
        winner = byte_store.get(key)
        if winner is not None:
            return parse_frozen(rollout_id, winner)
    raise CaptureStoreError(
        f"rollout {rollout_id}: freeze marker keeps vanishing (a dispatch-time clear "
        "running at the same time?); finalize the rollout after its dispatch"
    )


def frozen_snapshot_id(byte_store: ByteStore, rollout_id: str) -> str | None:
    """The snapshot id the rollout was frozen under, or `None` when it is not frozen."""
    data = byte_store.get(frozen_key(rollout_id))
    return None if data is None else parse_frozen(rollout_id, data)


def parse_frozen(rollout_id: str, data: bytes) -> str:
    try:
        return str(orjson.loads(data)["snapshot_id"])
    except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
        raise UnreadableCaptureError(
            f"rollout {rollout_id}: object {rollout_id}/{FROZEN} is not a freeze marker "
            f"({exc}); inspect it, then delete the rollout's capture"
        ) from exc


def read_decision(byte_store: ByteStore, rollout_id: str) -> dict[str, Any] | None:
    """The retirement decision (a tombstone or a refusal), or `None` when undecided."""
    data = byte_store.get(retired_key(rollout_id))
    return None if data is None else parse_decision(rollout_id, data)


def decide(byte_store: ByteStore, rollout_id: str, proposal: Proposal) -> dict[str, Any]:
    """Propose a decision for `RETIRED`; the first create wins, and everyone follows it.

    Drop proposes a tombstone, a loss reported after the freeze proposes a refusal.
    Both are create-only writes of one key, so exactly one outcome holds everywhere.
    """
    key = retired_key(rollout_id)
    for _attempt in range(5):
        if byte_store.create_staged(key, proposal.staged):
            return proposal.decision
        winner = read_decision(byte_store, rollout_id)
        if winner is not None:
            return winner
    raise CaptureStoreError(
        f"rollout {rollout_id}: its retirement decision keeps vanishing (a dispatch-time "
        "clear running at the same time?); retry after the clear"
    )


class TombstoneGroups:
    """The tombstone proposals of a batch of drops, each group staged on first use.

    On a backend that shares staged objects (`ByteStore.shares_staged`: local disk), up to
    `TOMBSTONE_GROUP` rollouts share one group tombstone naming each one's snapshot: one
    file written and synced per group, linked as each `RETIRED` (one fsync, of the folder,
    per rollout). Elsewhere each group is one rollout (S3 gains nothing from sharing, and a
    rollout's object then names no other). A group is staged only when one of its rollouts
    creates its decision, so a re-run whose decisions all exist writes nothing (it may be
    freeing a full disk), and a staging failure is that rollout's error alone. A request
    that is not well formed is in no group (its drop fails on its own). Every create stays
    exclusive per rollout; a reader takes only its own rollout's line, so a group object
    copied to another rollout does not name it and is unreadable there. Use it as a
    context manager: leaving it releases what was staged. Thread-safe.
    """

    def __init__(self, byte_store: ByteStore, drops: Sequence[DropRequest]) -> None:
        self._bytes = byte_store
        self._retired_at = time.time()
        size = TOMBSTONE_GROUP if byte_store.shares_staged else 1
        self._groups = _tombstone_groups([d for d in drops if _well_formed(d)], size)
        self._group_of = {id(d): i for i, group in enumerate(self._groups) for d in group}
        self._staged: dict[int, StagedObject] = {}
        self._lock = threading.Lock()
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> TombstoneGroups:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def proposal(self, drop: DropRequest) -> Proposal:
        """The tombstone `drop` proposes, its group staged if it was not yet."""
        index = self._group_of[id(drop)]
        with self._lock:
            staged = self._staged.get(index)
            if staged is None:
                named = {d.rollout_id: _line(d) for d in self._groups[index]}
                document = {GROUP_KEY: named, "retired_at": self._retired_at}
                staged = self._stack.enter_context(self._bytes.staged(encode_json(document)))
                self._staged[index] = staged
        return Proposal(_line(drop) | {"retired_at": self._retired_at}, staged)

    def release(self) -> None:
        """Remove what was staged (local: the temporary files). Safe to repeat."""
        with self._lock:
            self._stack.close()
            self._staged.clear()


def _well_formed(drop: DropRequest) -> bool:
    return (
        isinstance(drop.rollout_id, str)
        and ROLLOUT_ID_PATTERN.fullmatch(drop.rollout_id) is not None
        and isinstance(drop.snapshot_id, str)
        and isinstance(drop.version, int)
        and not isinstance(drop.version, bool)
    )


def _line(drop: DropRequest) -> dict[str, Any]:
    return {"snapshot_id": drop.snapshot_id, "version": drop.version}


def _tombstone_groups(drops: Sequence[DropRequest], size: int) -> list[list[DropRequest]]:
    """Consecutive groups of distinct rollouts, at most `size` each (repeats dropped)."""
    groups: list[list[DropRequest]] = [[]]
    seen: set[int] = set()
    for drop in drops:
        if id(drop) in seen:
            continue
        seen.add(id(drop))
        group = groups[-1]
        if len(group) == size or any(d.rollout_id == drop.rollout_id for d in group):
            groups.append(group := [])
        group.append(drop)
    return [group for group in groups if group]


@contextlib.contextmanager
def staged_refusal(byte_store: ByteStore, reason: str) -> Iterator[Proposal]:
    """A refusal proposal: a loss was reported after the freeze, so retirement is refused."""
    decision = {"refused": f"a loss was reported after the freeze: {reason}", "at": time.time()}
    with byte_store.staged(encode_json(decision)) as staged:
        yield Proposal(decision, staged)


def parse_decision(rollout_id: str, data: bytes) -> dict[str, Any]:
    """One rollout's decision from its `RETIRED` bytes: a group tombstone's line for it, a
    single tombstone (written before group tombstones), or a refusal."""
    why = "unexpected content"
    try:
        decision: Any = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        decision, why = None, str(exc)
    if isinstance(decision, dict) and GROUP_KEY in decision:
        decision, why = _group_line(rollout_id, decision), "a group tombstone not naming it"
    if not isinstance(decision, dict) or not ("snapshot_id" in decision or "refused" in decision):
        raise UnreadableCaptureError(
            f"rollout {rollout_id}: object {rollout_id}/{RETIRED} is not a retirement decision "
            f"({why}); inspect it, then delete the rollout's capture"
        )
    return decision


def _group_line(rollout_id: str, document: dict[str, Any]) -> dict[str, Any] | None:
    """The rollout's line of a group tombstone, with the group's time; None if it has none."""
    named = document[GROUP_KEY]
    line = named.get(rollout_id) if isinstance(named, dict) else None
    if not isinstance(line, dict) or "snapshot_id" not in line or "refused" in line:
        return None
    return {**line, "retired_at": document.get("retired_at")}


def is_tombstone(decision: dict[str, Any] | None) -> bool:
    """Whether a retirement decision retired the capture (rather than refusing it)."""
    return decision is not None and "snapshot_id" in decision and "refused" not in decision


def retires(decision: dict[str, Any], snapshot_id: str, version: int) -> bool:
    """Whether the decision is a tombstone for exactly this snapshot."""
    named = (decision.get("snapshot_id"), decision.get("version"))
    return is_tombstone(decision) and named == (snapshot_id, version)


def refuse_retired(byte_store: ByteStore, rollout_id: str) -> None:
    """Raise `CaptureRetiredError` if the rollout's capture was retired after a handoff."""
    decision = read_decision(byte_store, rollout_id)
    if decision is not None and is_tombstone(decision):
        raise CaptureRetiredError(
            f"rollout {rollout_id} was already retired after an earlier handoff: snapshot "
            f"{decision.get('snapshot_id')}, version {decision.get('version')}; its capture "
            "cannot be finalized again. Before dispatching a new attempt with this id, run "
            "`tokcap clear --rollouts FILE --store STORE`: it deletes the rollout's whole "
            "capture (entries, markers and the retired tombstone)"
        )


def tombstone_expired(
    rollout_id: str, decision: dict[str, Any], older_than_seconds: float, now: float
) -> bool:
    """Whether the decision is a tombstone written more than `older_than_seconds` ago.

    Refusals are not tombstones: they stay until the dispatch-time clear.
    """
    if not is_tombstone(decision):
        return False
    retired_at = decision.get("retired_at")
    if isinstance(retired_at, bool) or not isinstance(retired_at, (int, float)):
        raise UnreadableCaptureError(
            f"rollout {rollout_id}: tombstone {rollout_id}/{RETIRED} has no retirement "
            "time; inspect it, then delete the rollout's capture"
        )
    return now - retired_at >= older_than_seconds


def sweep_age_seconds(age: str) -> float:
    """Seconds of a sweep age such as `36h`, `2d`, `90m` or `3600s`; `ValueError` saying what
    is wrong when it is malformed or below `MIN_SWEEP_AGE_SECONDS`."""
    match = _AGE.fullmatch(age.strip()) if isinstance(age, str) else None
    if match is None:
        raise InvalidInputError(
            f"{age!r} is not a duration; use a whole number and a unit: 36h, 2d, 90m or 3600s"
        )
    seconds = float(int(match.group(1)) * _UNIT_SECONDS[match.group(2)])
    if seconds < MIN_SWEEP_AGE_SECONDS:
        raise InvalidInputError(
            f"{age} is below the 1h minimum: a writer of a recently retired attempt may still "
            "be running, and a tombstone is what fences it out (see tokcap docs store)"
        )
    return seconds


def sweep_tombstones(byte_store: ByteStore, older_than_seconds: float, now: float) -> int:
    """Delete the capture of every rollout whose tombstone is older than `older_than_seconds`;
    return how many went.

    Kept: rollouts without a decision (live, or frozen and masked: evidence), refusals, and
    tombstones with an incomplete marker beneath (a loss reported after retirement).
    Exactly the keys listed beneath an expired tombstone are deleted, every key's result
    checked: payloads first, then `FROZEN` and `RETIRED`, so a crash part-way leaves a
    tombstone that still refuses a freeze and is swept next time. Each rollout is judged
    through its folder pinned (`ByteStore.pinned`): on local disk it is deleted at once
    through that folder; where the view is the store itself (S3), the deletes of a chunk
    go in batches across rollouts. A rollout that cannot be read or removed is logged by
    name and skipped, so one damaged rollout never stops the sweep; an unreachable store
    fails it (retry).
    """
    names = [name for name in byte_store.list_children("") if ROLLOUT_ID_PATTERN.fullmatch(name)]
    swept = 0
    for start in range(0, len(names), SWEEP_CHUNK):
        chunk = names[start : start + SWEEP_CHUNK]
        batched: dict[str, list[str]] = {}
        for name, decision in _decisions(byte_store, chunk).items():
            try:
                with byte_store.pinned(name) as view:
                    keys = _sweepable(view, name, decision, older_than_seconds, now)
                    if keys and view is byte_store:
                        batched[name] = keys  # no folder held: batch across rollouts
                    elif keys:
                        swept += _delete_captures(view, {name: keys})
            except Exception as exc:
                _skip(name, exc)
        swept += _delete_captures(byte_store, batched)
    return swept


def _decisions(byte_store: ByteStore, names: list[str]) -> dict[str, bytes | None]:
    """Each rollout of `names` that may have a decision, with its `RETIRED` as read now
    (`None`: read it again through its folder)."""
    try:
        read = byte_store.get_many([retired_key(name) for name in names])
    except Exception as exc:  # one unreadable object: read them one by one, naming it
        if is_transient(exc):
            raise
        return dict.fromkeys(names)
    return {name: data for name in names if (data := read.get(retired_key(name))) is not None}


def _skip(rollout_id: str, exc: BaseException) -> None:
    if is_transient(exc):
        raise exc
    logger.warning(
        "sweep: skipped rollout %s, its tombstone could not be swept: %s: %s",
        rollout_id,
        type(exc).__name__,
        exc,
    )


def _sweepable(
    view: FolderView,
    rollout_id: str,
    decision: bytes | None,
    older_than_seconds: float,
    now: float,
) -> list[str] | None:
    key = retired_key(rollout_id)
    data = decision if decision is not None else view.get(key)
    if data is None:
        return None
    if not tombstone_expired(rollout_id, parse_decision(rollout_id, data), older_than_seconds, now):
        return None
    keys = view.list_prefix(rollout_id)
    if key not in keys or view.get(key) != data:
        return None  # cleared, and perhaps dispatched again, since the decision was read
    if any(k.startswith(f"{rollout_id}/{MARKER}/") for k in keys):
        logger.warning(
            "sweep: kept rollout %s: a loss was reported after it was retired, so its "
            "handed-off record may lack that call; its marker stays as evidence until the "
            "dispatch-time clear",
            rollout_id,
        )
        return None
    return keys


def _delete_captures(view: FolderView, doomed: dict[str, list[str]]) -> int:
    """Delete each rollout's keys through `view`, the decision markers last (on S3 the view
    is the store: batch deletes across rollouts); return how many rollouts went."""
    decisions = {retired_key(name) for name in doomed} | {frozen_key(name) for name in doomed}
    payloads = [key for keys in doomed.values() for key in keys if key not in decisions]
    failed = view.delete_each(payloads, durable=False) if payloads else {}
    whole = [name for name, keys in doomed.items() if not failed.keys() & set(keys)]
    last = [key for name in whole for key in doomed[name] if key in decisions]
    failed.update(view.delete_each(last, durable=False) if last else {})
    swept = 0
    for name, keys in doomed.items():
        reasons = [failed[key] for key in keys if key in failed]
        if reasons:
            _skip(name, CaptureStoreError(f"could not delete {len(reasons)} objects: {reasons[0]}"))
        else:
            swept += 1
    return swept
