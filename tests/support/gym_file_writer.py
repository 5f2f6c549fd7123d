"""A test-only writer of NeMo Gym's file store, written from the format's documented facts.

It stands in for a live NeMo Gym model server: same files, same flock protocol, same checks.
It deliberately shares no code with `capture_core`, so the tests compare two implementations.
Run as a module it is a writer process: it puts calls until the rollout is frozen, or
(`mark`) reports a lost call the moment it is told to.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import orjson


class GymWriterRefused(RuntimeError):
    """The rollout is frozen or retired; NeMo Gym's writer refuses the write."""


class GymWriter:
    """put / begin_call / mark_incomplete as NeMo Gym performs them, under the exclusive lock."""

    def __init__(self, root: str) -> None:
        self.root = root
        os.makedirs(root, exist_ok=True)

    def path(self, rollout_id: str, suffix: str) -> str:
        return os.path.join(self.root, f"{rollout_id}.tokens.{suffix}")

    @contextmanager
    def locked(self, rollout_id: str) -> Iterator[None]:
        with open(self.path(rollout_id, "lock"), "a+b") as handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)

    def state(self, rollout_id: str) -> dict[str, Any]:
        try:
            with open(self.path(rollout_id, "state.json"), "rb") as f:
                return orjson.loads(f.read())
        except FileNotFoundError:
            return {
                "frozen": False,
                "retired": False,
                "incomplete": False,
                "snapshot_id": "",
                "version": 0,
                "entry_digests": {},
                "indexed_size": 0,
            }

    def write_state(self, rollout_id: str, state: dict[str, Any], durable: bool) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".tokens-state-")
        with os.fdopen(fd, "wb") as f:
            f.write(orjson.dumps(state, option=orjson.OPT_SORT_KEYS))
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, self.path(rollout_id, "state.json"))
        if durable:
            dir_fd = os.open(self.root, os.O_RDONLY)
            os.fsync(dir_fd)
            os.close(dir_fd)

    def _reconcile(self, rollout_id: str, state: dict[str, Any]) -> None:
        """Index the JSONL beyond `indexed_size` (this writer never leaves a torn tail)."""
        path = self.path(rollout_id, "jsonl")
        if not os.path.exists(path):
            return
        with open(path, "rb") as f:
            f.seek(state["indexed_size"])
            tail = f.read()
        for line in tail.split(b"\n"):
            if line.strip():
                entry = orjson.loads(line)
                state["entry_digests"][entry["model_call_id"]] = hashlib.sha256(line).hexdigest()
                state["version"] += 1
        state["indexed_size"] += len(tail)

    def put(self, entry: dict[str, Any], *, crash_before_state: bool = False) -> None:
        line = orjson.dumps(entry, option=orjson.OPT_SORT_KEYS)
        digest = hashlib.sha256(line).hexdigest()
        rollout_id = entry["rollout_id"]
        with self.locked(rollout_id):
            state = self.state(rollout_id)
            if state["retired"] or state["frozen"]:
                raise GymWriterRefused(f"rollout {rollout_id} is frozen or retired")
            self._reconcile(rollout_id, state)
            known = state["entry_digests"].get(entry["model_call_id"])
            if known == digest:
                return
            if known is not None:
                state["incomplete"] = True
                state["version"] += 1
                self.write_state(rollout_id, state, durable=True)
                raise ValueError("model call id reused with a different payload")
            with open(self.path(rollout_id, "jsonl"), "ab") as f:
                f.write(line + b"\n")
                f.flush()
                os.fsync(f.fileno())
                size = f.tell()
            if crash_before_state:
                return
            state["indexed_size"] = size
            state["entry_digests"][entry["model_call_id"]] = digest
            state["version"] += 1
            self.write_state(rollout_id, state, durable=False)

    def begin_call(self, rollout_id: str, model_call_id: str) -> None:
        with self.locked(rollout_id):
            state = self.state(rollout_id)
            if state["retired"] or state["frozen"]:
                raise GymWriterRefused(f"rollout {rollout_id} is frozen or retired")
            self._append(self.path(rollout_id, "intents"), model_call_id)

    def mark_incomplete(self, rollout_id: str, model_call_id: str = "") -> None:
        with self.locked(rollout_id):
            state = self.state(rollout_id)
            if state["retired"]:
                raise GymWriterRefused(f"rollout {rollout_id} is retired")
            state["incomplete"] = True
            state["version"] += 1
            self.write_state(rollout_id, state, durable=True)
            self._append(self.path(rollout_id, "incomplete"), model_call_id)

    @staticmethod
    def _append(path: str, text: str) -> None:
        with open(path, "ab") as f:
            f.write(text.encode() + b"\n")
            f.flush()
            os.fsync(f.fileno())


def entry_payload(rollout_id: str, call: int) -> dict[str, Any]:
    """Call `call` of a linear chain, as NeMo Gym dumps a `TokenEntry` (`mode="json"`)."""
    prompt = [1, 2, 3, *(t for earlier in range(call) for t in (100 + earlier, 200 + earlier, 7))]
    return {
        "schema_version": 1,
        "rollout_id": rollout_id,
        "model_call_id": f"c{call:04d}",
        "model": "policy",
        "prompt_token_ids": prompt,
        "generation_token_ids": [100 + call, 200 + call],
        "generation_log_probs": [-0.5, -0.25],
        "routed_experts": None,
        "output_items": [],
        "token_item_index": None,
        "created_at": float(call),
    }


def main(root: str, rollout_id: str, calls: int, late: int) -> None:
    """Begin and put calls, printing `ok <n>` per acknowledged put, until refused.

    Then, as a late writer of the same attempt, keep putting `late` more calls; each must be
    refused (`late-refused`), or is acknowledged (`late-ok`, a fence violation).
    """
    writer = GymWriter(root)
    for call in range(calls):
        try:
            writer.begin_call(rollout_id, f"c{call:04d}")
        except GymWriterRefused:
            print(f"refused-begin {call}", flush=True)
            break
        try:
            writer.put(entry_payload(rollout_id, call))
        except GymWriterRefused:
            print(f"refused-put {call}", flush=True)
            break
        print(f"ok {call}", flush=True)
    for call in range(calls, calls + late):
        try:
            writer.put(entry_payload(rollout_id, call))
        except GymWriterRefused:
            print(f"late-refused {call}", flush=True)
            continue
        print(f"late-ok {call}", flush=True)


def mark_when_told(root: str, rollout_id: str, go: str) -> None:
    """Say `ready`, wait for the file `go`, then report a lost call at once; print the outcome."""
    print("ready", flush=True)
    while not os.path.exists(go):
        time.sleep(0.0005)
    try:
        GymWriter(root).mark_incomplete(rollout_id, "lost-late")
    except GymWriterRefused:
        print("refused", flush=True)
        return
    print("marked", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "mark":
        mark_when_told(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
