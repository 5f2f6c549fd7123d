"""Rollout record files: JSON lines at any fsspec URL, planned into batches and read by range.

Planning streams the file once and records each batch's byte range, line numbers and digest,
so a batch is later read with one ranged read; memory holds one batch (and, while planning,
one id per rollout).
A malformed line is reported with its file and line number; the other lines still count.
Lines end at LF only, one splitter for planning and reading, so line numbers always agree.
A rollout id on more than one line is found while planning; every copy of it is refused.
This module does not import Prefect.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import orjson
from pydantic import BaseModel, Field

from capture_core.errors import InvalidInputError, LocationMissingError, StoreUnavailableError
from capture_core.ids import TASK_INDEX_KEY, index_value, maybe_rollout_id_from_run_body
from capture_core.run.task_groups import (
    DEFAULT_MAX_GROUP_SIZE,
    TaskGroups,
    check_max_group_size,
    group_by_setting,
)
from capture_core.storage import filesystem_for, is_connection_error, unreachable_message

READ_CHUNK = 1 << 20


class BatchPlan(BaseModel):
    """One batch of a rollout file: its byte range, first and last line numbers (of its
    non-blank lines; `last_line` 0 in plans made before it was recorded), line count and
    content digest. `group_sizes` (planned with `group_by="task"`, else empty) maps each task
    index of the batch to its rollouts in the whole input, all of which the batch holds."""

    index: int
    start: int
    end: int
    first_line: int
    lines: int
    last_line: int = 0
    sha256: str
    refused: dict[int, str] = Field(default_factory=dict)
    group_sizes: dict[int, int] = Field(default_factory=dict)

    def group_size(self, record: Mapping[str, Any]) -> int | None:
        """The group size of a record's task (`None` when the run does not group by task)."""
        task = index_value(record.get(TASK_INDEX_KEY))
        return None if task is None else self.group_sizes.get(task)


class RolloutFilePlan(BaseModel):
    """All batches of one rollout file, the digest of the whole file, and repeated rollout ids.

    `duplicates` maps each rollout id found on more than one line to those line numbers.
    """

    url: str
    sha256: str
    size: int
    batches: list[BatchPlan]
    duplicates: dict[str, list[int]] = Field(default_factory=dict)
    fingerprint: str | None = None

    @property
    def rollouts(self) -> int:
        return sum(batch.lines for batch in self.batches)

    def duplicates_error(self) -> str | None:
        """One message naming the repeated rollout ids, or `None` when every id is unique."""
        if not self.duplicates:
            return None
        shown = [duplicate_reason(self.url, rid, lines) for rid, lines in self.duplicates.items()]
        more = f" (and {len(shown) - 3} more ids)" if len(shown) > 3 else ""
        return "; ".join(shown[:3]) + more


def duplicate_reason(url: str, rollout_id: str, lines: list[int]) -> str:
    """Why every copy of a repeated rollout id is refused, naming its lines."""
    listed = ", ".join(str(n) for n in lines[:20]) + (", ..." if len(lines) > 20 else "")
    return (
        f"{url}: rollout id {rollout_id} appears on lines {listed}; no copy is finalized or "
        "retired (its capture is kept). Give each rollout one line and finalize the corrected "
        "file under a new run id"
    )


class _DuplicateFinder:
    """Remembers the first line of each rollout id and every line of the ids seen again."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.first: dict[str, int] = {}
        self.repeated: dict[str, list[int]] = {}

    def add(self, line_no: int, record: dict[str, Any] | None) -> None:
        try:
            rollout_id = None if record is None else maybe_rollout_id_from_run_body(record)
        except ValueError:
            rollout_id = None
        if rollout_id is None:
            return
        first = self.first.setdefault(rollout_id, line_no)
        if first != line_no:
            self.repeated.setdefault(rollout_id, [first]).append(line_no)

    def refuse(self, batches: list[BatchPlan]) -> dict[str, list[int]]:
        """Mark each copy in its batch; return the repeated ids with their lines."""
        starts = [batch.first_line for batch in batches]
        for rollout_id, lines in self.repeated.items():
            reason = duplicate_reason(self.url, rollout_id, lines)
            for line_no in lines:
                batches[bisect.bisect_right(starts, line_no) - 1].refused[line_no] = reason
        return self.repeated


def split_lines(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """Split a byte stream into lines ending at LF only, each with its LF (the last may lack it).

    This is the one line splitter for rollout files: planning, batch reads and record streams
    all use it, so a CR or other separator inside a record never shifts line numbers.
    """
    pending: list[bytes] = []
    for chunk in chunks:
        start = 0
        while (end := chunk.find(b"\n", start)) != -1:
            yield (
                b"".join([*pending, chunk[start : end + 1]]) if pending else chunk[start : end + 1]
            )
            pending, start = [], end + 1
        if start < len(chunk):
            pending.append(chunk[start:])
    if pending:
        yield b"".join(pending)


def _stream_chunks(stream: Any) -> Iterator[bytes]:
    while chunk := stream.read(READ_CHUNK):
        yield chunk


def _lines_with_offsets(stream: Any) -> Iterator[tuple[int, bytes]]:
    offset = 0
    for line in split_lines(_stream_chunks(stream)):
        yield offset, line
        offset += len(line)


def open_rollout_file(
    url: str, storage_options: Mapping[str, Any] | None = None
) -> tuple[Any, str]:
    """The filesystem and path of a rollout file; `LocationMissingError` when it is missing,
    `StoreUnavailableError` naming the endpoint when its S3 endpoint does not answer."""
    fs, path = filesystem_for(url, storage_options)
    try:
        found = fs.exists(path)
    except Exception as exc:
        if not is_connection_error(exc):
            raise
        what = "read the rollout file"
        raise StoreUnavailableError(unreachable_message(url, what, exc, storage_options)) from exc
    if not found:
        raise LocationMissingError(f"rollout file {url} does not exist; check the URL")
    return fs, path


def plan_rollout_file(
    url: str,
    batch_size: int,
    storage_options: Mapping[str, Any] | None = None,
    group_by: str | None = None,
    max_group_size: int = DEFAULT_MAX_GROUP_SIZE,
) -> RolloutFilePlan:
    """Stream the file once and split its non-blank lines into batches of `batch_size`.

    Every line that repeats another line's rollout id is marked refused in its batch, the
    first copy included: no copy of a repeated id may be finalized.
    With `group_by="task"` the file is read twice: the first pass counts each task's
    rollouts (`task_groups.TaskGroups`), and a batch grows past `batch_size` until it holds
    every rollout of its tasks; what cannot be grouped within `max_group_size` is refused.
    """
    if batch_size < 1:
        raise InvalidInputError(f"batch_size must be at least 1, got {batch_size}")
    grouped = group_by_setting(group_by) is not None
    cap = check_max_group_size(max_group_size) if grouped else max_group_size
    fs, path = open_rollout_file(url, storage_options)
    fingerprint = file_fingerprint(url, storage_options)  # before reading: see its doc
    groups = TaskGroups.count(url, _records(url, fs, path), cap) if grouped else None
    whole = hashlib.sha256()
    batches: list[BatchPlan] = []
    current: dict[str, Any] | None = None
    size = 0
    pending_blank = b""
    finder = _DuplicateFinder(url)
    with fs.open(path, "rb", block_size=READ_CHUNK) as stream:
        for line_no, (offset, line) in enumerate(_lines_with_offsets(stream), start=1):
            whole.update(line)
            size = offset + len(line)
            if not line.strip():
                pending_blank += line if current is not None else b""
                continue
            if current is None:
                current = {
                    "start": offset,
                    "first_line": line_no,
                    "lines": 0,
                    "sha": hashlib.sha256(),
                }
            record = _parse_line(url, line_no, line).record
            finder.add(line_no, record)
            current["lines"] += 1
            current["last_line"] = line_no
            current["sha"].update(pending_blank + line)
            pending_blank = b""
            current["end"] = size
            if groups is None and current["lines"] == batch_size:
                batches.append(_close(len(batches), current))
                current, pending_blank = None, b""
            elif groups is not None:
                groups.add(record)
                if groups.may_close(current["lines"], batch_size, current["first_line"]):
                    batches.append(_close(len(batches), current, groups.close()))
                    current, pending_blank = None, b""
    if current is not None:
        batches.append(_close(len(batches), current, groups.close() if groups else None))
    if groups is not None and groups.sha256 != whole.hexdigest():
        raise InvalidInputError(
            f"rollout file {url} changed while it was planned; input files must not change "
            "during a run"
        )
    duplicates = finder.refuse(batches)
    return RolloutFilePlan(
        url=url,
        sha256=whole.hexdigest(),
        size=size,
        batches=batches,
        duplicates=duplicates,
        fingerprint=fingerprint,
    )


def _records(url: str, fs: Any, path: str) -> Iterator[tuple[int, bytes, dict[str, Any] | None]]:
    """Every line with its number and record (`None` for a blank or unparsable line)."""
    with fs.open(path, "rb", block_size=READ_CHUNK) as stream:
        for line_no, line in enumerate(split_lines(_stream_chunks(stream)), start=1):
            record = _parse_line(url, line_no, line).record if line.strip() else None
            yield line_no, line, record


def file_fingerprint(url: str, storage_options: Mapping[str, Any] | None = None) -> str | None:
    """A cheap identity of a file's bytes, or `None` when its filesystem offers none.

    On S3 the size and ETag; locally the size, inode, and change and modification times
    (no write leaves all of them as they were). Equal fingerprints mean equal bytes, unequal
    ones prove nothing: compare `file_sha256` then. Taken before the file is read, so a file
    replaced meanwhile gets a fingerprint that no later reader will match.
    """
    fs, path = filesystem_for(url, storage_options)
    fs.invalidate_cache(path)
    info = fs.info(path)
    if info.get("ETag"):
        return f"{info.get('size')}:{info['ETag']}"
    local = [info.get(name) for name in ("size", "ino", "created", "mtime")]
    return None if None in local else ":".join(map(str, local))


def file_sha256(url: str, storage_options: Mapping[str, Any] | None = None) -> str:
    """The sha256 of the whole file, as `plan_rollout_file` records it."""
    fs, path = filesystem_for(url, storage_options)
    whole = hashlib.sha256()
    with fs.open(path, "rb", block_size=READ_CHUNK) as stream:
        for chunk in _stream_chunks(stream):
            whole.update(chunk)
    return whole.hexdigest()


def _close(
    index: int, current: dict[str, Any], group_sizes: dict[int, int] | None = None
) -> BatchPlan:
    return BatchPlan(
        index=index,
        start=current["start"],
        end=current["end"],
        first_line=current["first_line"],
        lines=current["lines"],
        last_line=current["last_line"],
        sha256=current["sha"].hexdigest(),
        group_sizes=group_sizes or {},
    )


class ParsedLine(BaseModel):
    """One line of a batch: the record, or why it could not be parsed."""

    line: int
    record: dict[str, Any] | None = None
    error: str | None = None


def read_batch(
    url: str, batch: BatchPlan, storage_options: Mapping[str, Any] | None = None
) -> list[ParsedLine]:
    """Read one planned batch with a ranged read; refuse it if the file changed since planning."""
    fs, path = filesystem_for(url, storage_options)
    data = fs.cat_file(path, start=batch.start, end=batch.end)
    if hashlib.sha256(data).hexdigest() != batch.sha256:
        raise InvalidInputError(
            f"rollout file {url} changed since it was planned (batch {batch.index}); "
            "input files must not change during a run"
        )
    parsed: list[ParsedLine] = []
    line_no = batch.first_line
    for line in split_lines([data]):
        if line.strip():
            parsed.append(_parse_line(url, line_no, line))
        line_no += 1
    return parsed


REPAIR = (
    "repair or drop that line, then finalize the rollout it held on its own line in a new file "
    "under a new run id (this run hands off the file's other lines; re-running it cannot "
    "succeed while the line is unchanged)"
)
COLLECT_CUT = (
    "collect that rollout again, or finalize its complete line in a new file under a new run "
    "id (this run hands off the file's other lines; re-running it cannot succeed while the "
    "file is unchanged)"
)


def _parse_line(url: str, line_no: int, line: bytes) -> ParsedLine:
    """A line as a record, or an error naming the file, the line, what is wrong and what to
    do: a last line without its newline that does not parse was cut short (a copy taken
    while the file was still written), anything else is a line to repair."""
    where = f"{url} line {line_no}"
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        if not line.endswith(b"\n"):
            why = f"malformed JSON, cut short: the file ends inside this line ({exc})"
            return ParsedLine(line=line_no, error=f"{where}: {why}; {COLLECT_CUT}")
        return ParsedLine(line=line_no, error=f"{where}: malformed JSON ({exc}); {REPAIR}")
    if not isinstance(record, dict):
        return ParsedLine(line=line_no, error=f"{where}: not a JSON object; {REPAIR}")
    return ParsedLine(line=line_no, record=record)


def read_records(
    url: str, storage_options: Mapping[str, Any] | None = None
) -> Iterator[ParsedLine]:
    """Stream every line of a rollout file as parsed records or errors."""
    fs, path = filesystem_for(url, storage_options)
    with fs.open(path, "rb", block_size=READ_CHUNK) as stream:
        for line_no, line in enumerate(split_lines(_stream_chunks(stream)), start=1):
            if line.strip():
                yield _parse_line(url, line_no, line)
