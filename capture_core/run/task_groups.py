"""GRPO groups in batch planning: with `group_by="task"` a batch never splits a task's rollouts.

A rollout's group is its task index (`_ng_task_index`, read as `ids.index_value` reads it).
Planning counts each task's rollouts in a first pass over the file, then lets a batch grow
past the batch size until every task it holds has all its rollouts in it.
A record without an integer task index, a task with more rollouts than `max_group_size`, or a
batch that cannot close within `max_group_size` rollouts past the batch size (a task's
rollouts spread across the file) is refused by name before anything runs.
This module does not import Prefect.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from capture_core.errors import InvalidInputError
from capture_core.ids import TASK_INDEX_KEY, index_value

GROUP_BY = ("none", "task")
"""The `group_by` choices: `none` (the default: batches of exactly `batch_size`), `task`."""
DEFAULT_MAX_GROUP_SIZE = 1000
MAX_NAMED = 5


def group_by_setting(group_by: str | None) -> str | None:
    """The run setting of a `group_by` choice: `None` for none (the default), else `task`."""
    if group_by is None or group_by == "none":
        return None
    if group_by == "task":
        return group_by
    raise InvalidInputError(f"unknown group_by {group_by!r}; use one of {', '.join(GROUP_BY)}")


def check_max_group_size(max_group_size: int) -> int:
    """Refuse a cap below 1 (or not an integer), naming the setting."""
    if isinstance(max_group_size, bool) or not isinstance(max_group_size, int):
        raise InvalidInputError(f"max_group_size must be an integer, got {max_group_size!r}")
    if max_group_size < 1:
        raise InvalidInputError(f"max_group_size must be at least 1, got {max_group_size}")
    return max_group_size


@dataclass
class TaskSpan:
    """One task's rollouts in the whole input: how many, and its first and last line."""

    count: int
    first: int
    last: int

    def lines(self) -> str:
        return (
            f"line {self.first}" if self.first == self.last else f"lines {self.first}-{self.last}"
        )


def _no_task_index(url: str, missing: list[tuple[int, Any]]) -> str:
    shown = ", ".join(
        f"line {n}" + ("" if raw is None else f" ({TASK_INDEX_KEY} {raw!r} is not an integer)")
        for n, raw in missing[:MAX_NAMED]
    )
    more = f" and {len(missing) - MAX_NAMED} more" if len(missing) > MAX_NAMED else ""
    return (
        f"{url}: --group-by task needs an integer task index ({TASK_INDEX_KEY}) on every record; "
        f"{shown}{more} have none. Nothing was finalized. Give each record the integer task "
        "index of its prompt, or finalize without --group-by task"
    )


def _too_large(url: str, cap: int, large: list[tuple[int, TaskSpan]]) -> str:
    shown = "; ".join(
        f"task {task} has {span.count} rollouts ({span.lines()})"
        for task, span in large[:MAX_NAMED]
    )
    more = f" (and {len(large) - MAX_NAMED} more tasks)" if len(large) > MAX_NAMED else ""
    biggest = max(span.count for _, span in large)
    return (
        f"{url}: {shown}{more}: more than --max-group-size {cap} (max_group_size), the "
        "largest group one batch may hold. Nothing was finalized. Raise --max-group-size to "
        f"at least {biggest}, or finalize without --group-by task"
    )


@dataclass
class TaskGroups:
    """Each task's span in the input, and the open groups of the batch being planned."""

    url: str
    cap: int
    spans: dict[int, TaskSpan]
    sha256: str
    seen: dict[int, int] = field(default_factory=dict)
    open: set[int] = field(default_factory=set)
    batch: dict[int, int] = field(default_factory=dict)

    @classmethod
    def count(cls, url: str, lines: Iterator[tuple[int, bytes, Any]], cap: int) -> TaskGroups:
        """First pass: each task's count and lines, from `(line number, bytes, record)` of
        every non-blank line (record `None` when it is not a JSON object: not a rollout).

        Raises `InvalidInputError` naming the records without an integer task index, or the
        tasks with more rollouts than `cap`."""
        spans: dict[int, TaskSpan] = {}
        missing: list[tuple[int, Any]] = []
        whole = hashlib.sha256()
        for line_no, line, record in lines:
            whole.update(line)
            if record is None:
                continue
            raw = record.get(TASK_INDEX_KEY)
            task = index_value(raw)
            if task is None:
                missing.append((line_no, raw))
                continue
            span = spans.setdefault(task, TaskSpan(0, line_no, line_no))
            span.count, span.last = span.count + 1, line_no
        if missing:
            raise InvalidInputError(_no_task_index(url, missing))
        large = [(task, span) for task, span in spans.items() if span.count > cap]
        if large:
            raise InvalidInputError(_too_large(url, cap, large))
        return cls(url=url, cap=cap, spans=spans, sha256=whole.hexdigest())

    def add(self, record: Mapping[str, Any] | None) -> None:
        """Second pass: one more line of the batch being planned."""
        if record is None:
            return
        task = index_value(record.get(TASK_INDEX_KEY))
        if task is None or task not in self.spans:  # not what the first pass read
            raise InvalidInputError(f"rollout file {self.url} changed while it was planned")
        seen = self.seen[task] = self.seen.get(task, 0) + 1
        self.batch[task] = self.batch.get(task, 0) + 1
        if seen == self.spans[task].count:
            self.open.discard(task)
        else:
            self.open.add(task)

    def may_close(self, lines: int, batch_size: int, first_line: int) -> bool:
        """Whether the batch of `lines` rollouts from `first_line` may close here: it reached
        `batch_size` and holds every rollout of its tasks. Raises `InvalidInputError` naming
        the task that keeps it open once it reached `batch_size + cap` rollouts."""
        if lines < batch_size:
            return False
        if not self.open:
            return True
        if lines >= batch_size + self.cap:
            raise InvalidInputError(self._spread(first_line, batch_size))
        return False

    def close(self) -> dict[int, int]:
        """The group size of each task of the batch just closed; the next batch starts empty."""
        sizes = {task: self.spans[task].count for task in self.batch}
        self.batch = {}
        return sizes

    def _spread(self, first_line: int, batch_size: int) -> str:
        task = min(self.open, key=lambda t: self.spans[t].first)
        span = self.spans[task]
        return (
            f"{self.url}: the batch from line {first_line} cannot close within --max-group-size "
            f"{self.cap} (max_group_size) rollouts past --batch-size {batch_size}: task {task}'s "
            f"{span.count} rollouts are spread over {span.lines()}, and a batch holds every "
            "rollout of its tasks. Nothing was finalized. Sort the file by task index "
            f"({TASK_INDEX_KEY}) so each task's rollouts are close together, or raise "
            "--max-group-size"
        )
