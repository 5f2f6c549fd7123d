"""Rollout record files: JSON lines at any fsspec URL, planned into batches and read by range.

Planning streams the file once and records each batch's byte range, line numbers and digest,
so a batch is later read with one ranged read and memory stays bounded by the batch.
A malformed line is reported with its file and line number; the other lines still count.
This module does not import Prefect.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from typing import Any

import orjson
from pydantic import BaseModel

from capture_core._fsspec import filesystem_for

READ_CHUNK = 1 << 20


class BatchPlan(BaseModel):
    """One batch of a rollout file: its byte range, first line number and content digest."""

    index: int
    start: int
    end: int
    first_line: int
    lines: int
    sha256: str


class RolloutFilePlan(BaseModel):
    """All batches of one rollout file, and the digest of the whole file."""

    url: str
    sha256: str
    size: int
    batches: list[BatchPlan]

    @property
    def rollouts(self) -> int:
        return sum(batch.lines for batch in self.batches)


def _lines_with_offsets(stream: Any) -> Iterator[tuple[int, bytes]]:
    offset = 0
    for line in stream:
        yield offset, line
        offset += len(line)


def plan_rollout_file(
    url: str, batch_size: int, storage_options: Mapping[str, Any] | None = None
) -> RolloutFilePlan:
    """Stream the file once and split its non-blank lines into batches of `batch_size`."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    fs, path = filesystem_for(url, storage_options)
    if not fs.exists(path):
        raise FileNotFoundError(f"rollout file {url} does not exist; check the URL")
    whole = hashlib.sha256()
    batches: list[BatchPlan] = []
    current: dict[str, Any] | None = None
    size = 0
    pending_blank = b""
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
            current["lines"] += 1
            current["sha"].update(pending_blank + line)
            pending_blank = b""
            current["end"] = size
            if current["lines"] == batch_size:
                batches.append(_close(len(batches), current))
                current, pending_blank = None, b""
    if current is not None:
        batches.append(_close(len(batches), current))
    return RolloutFilePlan(url=url, sha256=whole.hexdigest(), size=size, batches=batches)


def _close(index: int, current: dict[str, Any]) -> BatchPlan:
    return BatchPlan(
        index=index,
        start=current["start"],
        end=current["end"],
        first_line=current["first_line"],
        lines=current["lines"],
        sha256=current["sha"].hexdigest(),
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
        raise ValueError(
            f"rollout file {url} changed since it was planned (batch {batch.index}); "
            "input files must not change during a run"
        )
    parsed: list[ParsedLine] = []
    line_no = batch.first_line
    for line in data.splitlines():
        if line.strip():
            parsed.append(_parse_line(url, line_no, line))
        line_no += 1
    return parsed


def _parse_line(url: str, line_no: int, line: bytes) -> ParsedLine:
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        return ParsedLine(line=line_no, error=f"{url} line {line_no}: malformed JSON ({exc})")
    if not isinstance(record, dict):
        return ParsedLine(line=line_no, error=f"{url} line {line_no}: not a JSON object")
    return ParsedLine(line=line_no, record=record)


def read_records(
    url: str, storage_options: Mapping[str, Any] | None = None
) -> Iterator[ParsedLine]:
    """Stream every line of a rollout file as parsed records or errors."""
    fs, path = filesystem_for(url, storage_options)
    with fs.open(path, "rb", block_size=READ_CHUNK) as stream:
        for line_no, line in enumerate(stream, start=1):
            if line.strip():
                yield _parse_line(url, line_no, line)
