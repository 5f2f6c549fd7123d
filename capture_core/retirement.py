"""The freeze claim and the retirement decision: two create-only objects per rollout.

`FROZEN` holds the first freezer's snapshot id; every later freezer follows it.
`RETIRED` holds the one retirement decision: a tombstone (drop retired exactly that
snapshot) or a refusal (a loss was reported after the freeze). Both are proposed by a
create of one key, so exactly one outcome holds for every client, without a lock service.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

import orjson

from capture_core.capture_layout import FROZEN, RETIRED, frozen_key, retired_key
from capture_core.errors import CaptureRetiredError, CaptureStoreError, UnreadableCaptureError
from capture_core.ids import ROLLOUT_ID_PATTERN
from capture_core.storage import ByteStore
from capture_core.stored_json import encode_json

# The sweep is a `TokenCaptureStore` operation: it logs under the store's name, as it did.
logger = logging.getLogger("capture_core.store")


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


def decide(byte_store: ByteStore, rollout_id: str, proposal: dict[str, Any]) -> dict[str, Any]:
    """Propose a decision for `RETIRED`; the first create wins, and everyone follows it.

    Drop proposes a tombstone, a loss reported after the freeze proposes a refusal.
    Both are create-only writes of one key, so exactly one outcome holds everywhere.
    """
    key = retired_key(rollout_id)
    for _attempt in range(5):
        if byte_store.create(key, encode_json(proposal)):
            return proposal
        winner = read_decision(byte_store, rollout_id)
        if winner is not None:
            return winner
    raise CaptureStoreError(
        f"rollout {rollout_id}: its retirement decision keeps vanishing (a dispatch-time "
        "clear running at the same time?); retry after the clear"
    )


def tombstone(snapshot_id: str, version: int) -> dict[str, Any]:
    return {"snapshot_id": snapshot_id, "version": version, "retired_at": time.time()}


def refusal(reason: str) -> dict[str, Any]:
    return {"refused": f"a loss was reported after the freeze: {reason}", "at": time.time()}


def parse_decision(rollout_id: str, data: bytes) -> dict[str, Any]:
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
    byte_store: ByteStore, rollout_id: str, older_than_seconds: float, now: float
) -> bool:
    """Whether the rollout holds a tombstone written more than `older_than_seconds` ago.

    Refusals are not tombstones: they stay until the dispatch-time clear.
    """
    decision = read_decision(byte_store, rollout_id)
    if decision is None or not is_tombstone(decision):
        return False
    retired_at = decision.get("retired_at")
    if not isinstance(retired_at, (int, float)):
        raise UnreadableCaptureError(
            f"rollout {rollout_id}: tombstone {rollout_id}/{RETIRED} has no retirement "
            "time; inspect it, then delete the rollout's capture"
        )
    return now - retired_at >= older_than_seconds


def sweep_tombstones(
    byte_store: ByteStore,
    delete: Callable[[str], None],
    older_than_seconds: float,
    now: float,
) -> int:
    """`delete` every rollout whose tombstone is older than `older_than_seconds`; return how
    many. A rollout whose tombstone cannot be read or removed is logged by name and skipped,
    so one damaged rollout never stops the sweep."""
    swept = 0
    for name in byte_store.list_children(""):
        if not ROLLOUT_ID_PATTERN.fullmatch(name):
            continue
        try:
            if tombstone_expired(byte_store, name, older_than_seconds, now):
                delete(name)
                swept += 1
        except Exception as exc:
            logger.warning(
                "sweep: skipped rollout %s, its tombstone could not be swept: %s: %s",
                name,
                type(exc).__name__,
                exc,
            )
    return swept
