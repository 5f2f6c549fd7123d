"""Which rollouts of a receipt may be retired: the receipt's claim, checked by its part.

A receipt marks rollouts retirable; the verified part's records decide. A rollout is
permitted only when its record is in the part at its place, names the same rollout, is not
masked and carries token ids (an `all_traces` record: an envelope that passes its checks).
Records are skimmed, not parsed whole, so a part of long rollouts is judged at memchr
speed. This module does not import Prefect.
"""

from __future__ import annotations

import re

import orjson

from capture_core.builder.build_result import MASK_SAMPLE_KEY
from capture_core.builder.trace_envelope import ENVELOPE_KEY, TraceEnvelopeError, check_envelope
from capture_core.run.finalize import plain_rollout_id, rollout_carries_token_ids
from capture_core.run.receipt import HandoffReceipt, RolloutOutcome


def claimed_retirable(receipt: HandoffReceipt) -> list[RolloutOutcome]:
    """The rollouts a receipt marks retirable: rebuilt or redundant, at a known snapshot."""
    return [
        r
        for r in receipt.rollouts
        if r.rollout_id and r.can_retire and r.snapshot_id is not None and r.version is not None
    ]


def retirable(receipt: HandoffReceipt, part: bytes) -> tuple[list[RolloutOutcome], dict[str, str]]:
    """The rollouts the verified `part` permits retiring, and why it refutes the others.

    The receipt's verdict is a claim; the part's records decide. A rollout the receipt marks
    retirable is retired only when its record is in the part at its place (the part holds
    one line per emitted rollout, in receipt order), names the same rollout, is not masked
    and carries token ids. The drop still names the receipt's snapshot, and the store
    drops only a capture at exactly that freeze.
    """
    claimed = {id(r) for r in claimed_retirable(receipt)}
    emitted = [r for r in receipt.rollouts if r.emitted]
    lines = _line_spans(part)
    refuted = {
        r.rollout_id or "": f"has no record of line {r.line} (refused as input: {r.error})"
        for r in receipt.rollouts
        if id(r) in claimed and not r.emitted
    }
    if len(lines) != len(emitted):
        why = f"holds {len(lines)} records where the receipt lists {len(emitted)}"
        return [], {**refuted, **{r.rollout_id or "": why for r in emitted if id(r) in claimed}}
    allowed: list[RolloutOutcome] = []
    for rollout, (start, end) in zip(emitted, lines, strict=True):
        if id(rollout) not in claimed:
            continue
        why = _part_refutes(rollout, skimmed_record(part, start, end))
        if why is None:
            allowed.append(rollout)
        else:
            refuted[rollout.rollout_id or ""] = why
    return allowed, refuted


def _line_spans(part: bytes) -> list[tuple[int, int]]:
    """Where each line of a part starts and ends (a last line without `\\n` counts): the
    lines are read in place, so a part of long rollouts is not copied line by line."""
    spans, start = [], 0
    while (end := part.find(b"\n", start)) >= 0:
        spans.append((start, end))
        start = end + 1
    if start < len(part):
        spans.append((start, len(part)))
    return spans


def _part_refutes(rollout: RolloutOutcome, record: object) -> str | None:
    """Why the part's (skimmed) record at a rollout's place does not permit retiring it, or
    `None`."""
    if not isinstance(record, dict):
        return f"line {rollout.line} is not a JSON record"
    found = plain_rollout_id(record)
    if found != rollout.rollout_id:
        return f"holds rollout {found!r} at line {rollout.line}"
    if record.get(MASK_SAMPLE_KEY):
        return "records it masked (mask_sample: true)"
    if rollout.traces is not None:  # an all_traces build: its envelope must check
        try:
            check_envelope(record.get(ENVELOPE_KEY), rollout.rollout_id)
        except TraceEnvelopeError as exc:
            return f"records no envelope that passes its checks ({exc})"
        return None
    if not rollout_carries_token_ids(record):
        return "records it without token ids"
    return None


# A flat token array's opening, as orjson writes it; such an array ends at the next `]`.
# The key's closing quote cannot occur unescaped inside a JSON string, so every match is a key.
_TOKEN_ARRAY = re.compile(rb'"(?:prompt_token_ids|generation_token_ids|generation_log_probs)":\[')
_NOT_BLANK = re.compile(rb"[^ \t\n\r\x0b\x0c]")  # what `bytes.strip` keeps


def skimmed_record(part: bytes, start: int = 0, end: int | None = None) -> object:
    """The part line at `part[start:end]` (the whole of `part` by default) parsed with each
    non-empty flat token array cut to `[0]`, or `None`.

    What decides retirement (ids, `mask_sample`, whether ids are carried) survives the cut,
    and parsing skips the arrays at memchr speed instead of building every id: a part of
    long rollouts holds each call's cumulative prompt. A line the cut leaves unparsable is
    parsed whole; `None` when that fails too.
    """
    end = len(part) if end is None else end
    pieces, position = [], start
    while (found := _TOKEN_ARRAY.search(part, position, end)) is not None:
        opened = found.end()
        closed = part.find(b"]", opened, end)
        if closed < 0:
            break
        carried = _NOT_BLANK.search(part, opened, closed) is not None
        pieces += [part[position:opened], b"0" if carried else b""]
        position = closed
    whole = memoryview(part)[start:end]
    for candidate in (b"".join([*pieces, part[position:end]]), whole):
        try:
            return orjson.loads(candidate)
        except orjson.JSONDecodeError:
            continue
    return None
