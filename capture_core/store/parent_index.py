"""Which stored calls of a rollout a put may extend: a bounded index of digests, filled from
storage when a listing shows calls this process does not know.

Per rollout it keeps the names of the calls it knows (written here or read back) and, for
the few latest, their lengths and digests (`compact.Known`): a few dozen bytes per call,
whatever the context length. A put first tries the candidates held (`known`); when none
fits (`TokenCaptureStore._encode` says when), it lists the rollout's entries (one listing,
which also proves each candidate still exists) and reads back only the entries it has not
seen: those another process wrote, or all of a rollout whose state was evicted. Reading
back costs one object read per such entry, never its ancestors: its stored prompt digest
and generation are all a child needs. The whole index is bounded by `max_bytes` (rollouts
least recently used go first); eviction only costs reads, never a delta.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import orjson

from capture_core.store import compact
from capture_core.store.prompt_rebuild import parse_stored

# Parent lookup memory of one store, by default (a setting of `TokenCaptureStore`).
DEFAULT_MAX_BYTES = 32 * 2**20
# Candidates kept per rollout: the latest calls; an agent extends one of its last few.
PER_ROLLOUT = 4
# Estimated bytes held per rollout, per known call name and per candidate (Python objects).
_ROLLOUT_BYTES, _NAME_BYTES, _CANDIDATE_BYTES = 600, 100, 250

Reader = Callable[[Sequence[str]], dict[str, bytes | None]]


@dataclass
class _Rollout:
    seen: set[str] = field(default_factory=set)
    candidates: list[compact.Known] = field(default_factory=list)
    size: int = _ROLLOUT_BYTES


class ParentIndex:
    """Per-rollout parent candidates of one writer, in at most about `max_bytes`."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES, per_rollout: int = PER_ROLLOUT) -> None:
        if max_bytes < 0 or per_rollout < 1:
            raise ValueError("parent index bounds must be positive")
        self.max_bytes, self.per_rollout = max_bytes, per_rollout
        self._rollouts: OrderedDict[str, _Rollout] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def held_bytes(self) -> int:
        """The estimated bytes the index holds now (always at most `max_bytes`, or one rollout)."""
        return self._bytes

    def candidates(
        self, rollout_id: str, listed: Iterable[str], read: Reader
    ) -> list[compact.Known]:
        """Parent candidates among the rollout's `listed` entry names.

        Names not seen before are read back through `read` (names to bytes) and learned;
        what was known of a rollout that lost a known entry (retired or cleared) is dropped.
        """
        listed = set(listed)
        with self._lock:
            state = self._rollouts.get(rollout_id)
            if state is not None and not state.seen <= listed:
                # Events only grow: a known entry gone means the rollout was retired or
                # cleared (its id may be reused), so nothing known of it still holds.
                self._drop(rollout_id)
                state = None
            unseen = listed - state.seen if state is not None else listed
        learned: list[compact.Known] = []
        settled: list[str] = []
        if unseen:
            for name, data in read(sorted(unseen)).items():
                if data is None or compact.is_torn(data):
                    continue  # gone, or still being written: look again next time
                settled.append(name)
                known = _read_back(rollout_id, name, data)
                if known is not None:
                    learned.append(known)
        learned.sort(key=_length)
        with self._lock:
            if settled or state is None:
                state = self._update(rollout_id, settled, learned)
            elif rollout_id in self._rollouts:
                self._rollouts.move_to_end(rollout_id)
            return [c for c in state.candidates if c.call_key in listed]

    def known(self, rollout_id: str) -> list[compact.Known]:
        """The candidates held for a rollout, without reading storage (they may be stale)."""
        with self._lock:
            state = self._rollouts.get(rollout_id)
            return list(state.candidates) if state is not None else []

    def remember(self, rollout_id: str, name: str, known: compact.Known | None) -> None:
        """Learn a call this process stored (or found stored with the same payload)."""
        with self._lock:
            self._update(rollout_id, [name], [known] if known is not None else [])

    def forget(self, rollout_id: str) -> None:
        """Drop a rollout (its capture was deleted; its id may be reused)."""
        with self._lock:
            self._drop(rollout_id)

    def _drop(self, rollout_id: str) -> None:
        state = self._rollouts.pop(rollout_id, None)
        if state is not None:
            self._bytes -= state.size

    def _update(
        self, rollout_id: str, names: Sequence[str], learned: Sequence[compact.Known]
    ) -> _Rollout:
        state = self._rollouts.get(rollout_id)
        if state is None:
            state = self._rollouts[rollout_id] = _Rollout()
            self._bytes += state.size
        self._rollouts.move_to_end(rollout_id)
        fresh = [n for n in names if n not in state.seen]
        state.seen.update(fresh)
        held = len(state.candidates)
        if learned:
            known = {c.call_key for c in state.candidates}
            state.candidates.extend(c for c in learned if c.call_key not in known)
            del state.candidates[: -self.per_rollout]
        growth = sum(_NAME_BYTES + len(n) for n in fresh)
        growth += _CANDIDATE_BYTES * (len(state.candidates) - held)
        state.size += growth
        self._bytes += growth
        while len(self._rollouts) > 1 and self._bytes > self.max_bytes:
            _rollout, evicted = self._rollouts.popitem(last=False)
            self._bytes -= evicted.size
        return state


def _read_back(rollout_id: str, name: str, data: bytes) -> compact.Known | None:
    """A stored entry of another writer as a candidate, once its seal checks; else `None`.

    Only the object itself is read: its stored prompt digest stands for its whole prompt.
    """
    try:
        stored = orjson.loads(data)
        if not isinstance(stored, dict):
            return None
        entry = parse_stored(name, data, stored)
    except (orjson.JSONDecodeError, ValueError, TypeError):
        return None  # the freeze refuses it by name; it is never a parent
    generation = entry.fields.get("generation_token_ids")
    tail = entry.tail if entry.tail is not None else entry.prompt
    if entry.fields.get("rollout_id") != rollout_id or not isinstance(generation, list):
        return None
    raw = compact.token_bytes(generation)
    return compact.known_of(name, entry.shared + len(tail or []), entry.digest, raw)


def _length(candidate: compact.Known) -> int:
    return candidate.length
