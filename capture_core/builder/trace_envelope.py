"""The `training_traces` envelope (version 1) and the rules a consumer checks before training.

A delivered rollout's `record["training_traces"]` holds `schema_version`, `rollout_id`,
`builder` and `traces`; each trace is one training row with `trace_id`, `model_call_ids`,
`token_ids`, `generation_logprobs`, `loss_mask` and `sampled_spans` (docs/traces.md).
`check_envelope` enforces every rule of the envelope on its own; given the captured calls it
also checks that each span is exactly its call's prompt, generation and log probs, and that
the owned calls are exactly the ones expected. The checks compare whole lists (C speed),
never token by token in Python. Pure: no I/O.
This module imports only `records`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Collection, Mapping
from typing import Any

from capture_core.records import TokenEntry
from capture_core.records.token_values import all_finite, are_token_ids, float32_holds

SCHEMA_VERSION = 1
ENVELOPE_KEY = "training_traces"
MAIN_CHAIN, ALL_TRACES = "main_chain", "all_traces"
DELIVERIES = (MAIN_CHAIN, ALL_TRACES)
"""`main_chain` (the default) rebuilds `response.output`; `all_traces` adds the envelope."""
ENVELOPE_BUILDERS = ("prefix_merging", "per_request")
ENVELOPE_FIELDS = ("schema_version", "rollout_id", "builder", "traces")
TRACE_FIELDS = (
    "trace_id",
    "model_call_ids",
    "token_ids",
    "generation_logprobs",
    "loss_mask",
    "sampled_spans",
)
SPAN_FIELDS = ("model_call_id", "start", "end")
ZERO_LOG_PROB = 0.0
"""The log prob of a position no span owns; the builder fills rows with this one object, so
the check's comparison of a gap with it is a pointer comparison per position."""
_TRACE_KEYS, _SPAN_KEYS, _STR = frozenset(TRACE_FIELDS), frozenset(SPAN_FIELDS), frozenset([str])


class TraceEnvelopeError(ValueError):
    """An envelope breaks a rule of `training_traces` version 1; it must not be trained on."""


def _fail(where: str, why: str) -> TraceEnvelopeError:
    return TraceEnvelopeError(
        f"training_traces {where}: {why}; the envelope is refused and the rollout must not "
        "be trained from it"
    )


def _is_int(value: Any) -> bool:
    return type(value) is int


def _is_mapping(value: Any) -> bool:
    """A JSON object; the exact-type test first, as the ABC test costs more."""
    return type(value) is dict or isinstance(value, Mapping)


def _check_finite(values: list[Any], where: str) -> None:
    """Log probs of row `where` that are finite numbers; the sum in `all_finite` refuses
    anything that is not a number. The field is named only when one fails."""
    try:
        finite = all_finite(values)
    except TypeError:  # not a number
        finite = False
    if not finite:
        raise _fail(f"{where}.generation_logprobs", "holds a value that is not a finite number")


def _check_header(envelope: Any, rollout_id: str | None) -> list[Any]:
    if not _is_mapping(envelope):
        raise _fail("envelope", f"must be a JSON object, got {type(envelope).__name__}")
    missing = [name for name in ENVELOPE_FIELDS if name not in envelope]
    if missing:
        raise _fail("envelope", f"misses the fields {missing}")
    version = envelope["schema_version"]
    if not _is_int(version) or version != SCHEMA_VERSION:
        raise _fail("schema_version", f"is {version!r}; this reader knows version 1 only")
    found = envelope["rollout_id"]
    if not isinstance(found, str) or not found or (rollout_id is not None and found != rollout_id):
        raise _fail("rollout_id", f"is {found!r}, not the record's rollout {rollout_id!r}")
    if envelope["builder"] not in ENVELOPE_BUILDERS:
        raise _fail("builder", f"is {envelope['builder']!r}, not one of {ENVELOPE_BUILDERS}")
    traces = envelope["traces"]
    if not isinstance(traces, list) or not traces:
        raise _fail("traces", "must be a non-empty list")
    return traces


def _check_spans(
    spans: Any, calls: Collection[str], where: str, n: int
) -> list[tuple[str, int, int]]:
    """The spans of a row of `n` positions, ordered by position: each a non-empty range after
    position 0, naming one of the row's calls, none overlapping another."""
    if not isinstance(spans, list):
        raise _fail(f"{where}.sampled_spans", "must be a list")
    parsed: list[tuple[str, int, int]] = []
    in_order = True
    last_end = 0
    # The tests of `_is_mapping` and `_is_int` written out, a plain dict's keys read by
    # lookup: this loop runs once per span.
    for k, span in enumerate(spans):
        is_object = type(span) is dict or (isinstance(span, Mapping) and span.keys() >= _SPAN_KEYS)
        if is_object:
            try:  # a plain dict's fields are told by reading them
                call, start, end = span["model_call_id"], span["start"], span["end"]
            except (KeyError, TypeError, IndexError):
                is_object = False
        if not is_object:
            raise _fail(
                f"{where}.sampled_spans[{k}]", f"must be an object with {list(SPAN_FIELDS)}"
            )
        if type(start) is not int or type(end) is not int or not 0 < start < end <= n:
            raise _fail(
                f"{where}.sampled_spans[{k}]",
                f"[{start!r}, {end!r}) is not a non-empty range after position 0",
            )
        if type(call) is not str or call not in calls:  # an unhashable id is no call
            raise _fail(
                f"{where}.sampled_spans[{k}]",
                f"names call {call!r}, which is not among the row's model_call_ids",
            )
        if start < last_end:
            in_order = False
        last_end = end
        parsed.append((call, start, end))
    if not in_order:
        parsed.sort(key=lambda span: span[1])
        for (_, _, end), (call, start, _) in itertools.pairwise(parsed):
            if start < end:
                raise _fail(
                    f"{where}.sampled_spans", f"span of {call!r} overlaps the one before it"
                )
    return parsed


def _check_trace(
    trace: Any,
    where: str,
    rollout_id: str,
    owned: dict[str, str],
    calls: Mapping[str, TokenEntry] | None,
    calls_finite: bool,
) -> None:
    """The rules of one row; each span's call is added to `owned` (by the row's `where`)."""
    if not _is_mapping(trace) or not trace.keys() >= _TRACE_KEYS:
        raise _fail(where, f"must be an object with {list(TRACE_FIELDS)}")
    row_calls = trace["model_call_ids"]
    if not isinstance(row_calls, list) or not row_calls or not set(map(type, row_calls)) <= _STR:
        raise _fail(f"{where}.model_call_ids", "must be a non-empty list of call ids")
    if trace["trace_id"] != f"{rollout_id}:{row_calls[-1]}":
        raise _fail(
            f"{where}.trace_id", f"is {trace['trace_id']!r}, not '<rollout_id>:<last call>'"
        )
    tokens, logprobs, mask = trace["token_ids"], trace["generation_logprobs"], trace["loss_mask"]
    if not are_token_ids(tokens):
        raise _fail(f"{where}.token_ids", "must be a list of non-negative integer ids")
    n = len(tokens)
    if not isinstance(logprobs, list) or len(logprobs) != n:
        raise _fail(f"{where}.generation_logprobs", f"must be a list of {n} numbers")
    if not isinstance(mask, list) or len(mask) != n:
        raise _fail(f"{where}.loss_mask", f"must be a list of {n} values of 0 or 1")
    if n and mask[0] != 0:
        raise _fail(f"{where}.loss_mask", "trains the first position, which has no context")
    spans = _check_spans(trace["sampled_spans"], set(row_calls), where, n)
    _check_mask(_mask_bytes(mask, where), spans, where)
    _claim(spans, owned, where)
    if calls is None:
        _check_log_probs(logprobs, spans, where)
    else:
        _check_against_capture(tokens, logprobs, spans, calls, where, calls_finite)


def _mask_bytes(mask: list[Any], where: str) -> bytearray:
    """The mask as bytes (one C pass); a value that is not a small integer is refused."""
    try:
        return bytearray(mask)
    except (TypeError, ValueError):
        raise _fail(
            f"{where}.loss_mask", "is not 1 exactly at the positions the spans cover"
        ) from None


def _check_mask(marks: bytearray, spans: list[tuple[str, int, int]], where: str) -> None:
    """1s over every span and nothing but 0s elsewhere (position 0 is in no span)."""
    covered = 0
    for _, start, end in spans:
        if marks.count(1, start, end) != end - start:
            raise _fail(f"{where}.loss_mask", "is not 1 exactly at the positions the spans cover")
        covered += end - start
    # Every span is all 1s and spans do not overlap: the mask is exact iff it holds no other
    # 1 and nothing but 0 elsewhere.
    if marks.count(1) != covered or marks.count(0) != len(marks) - covered:
        raise _fail(f"{where}.loss_mask", "is not 1 exactly at the positions the spans cover")


def _claim(spans: list[tuple[str, int, int]], owned: dict[str, str], where: str) -> None:
    """Each span's call, owned by this row; a call another span owns is refused."""
    for call_id, _, _ in spans:
        if call_id in owned:
            raise _fail(where, f"call {call_id!r} is owned twice ({owned[call_id]} and here)")
        owned[call_id] = where


def _check_log_probs(logprobs: list[Any], spans: list[tuple[str, int, int]], where: str) -> None:
    """Finite numbers, and 0.0 at every position no span owns."""
    _check_finite(logprobs, where)
    gap_start = 0
    for _, start, end in [*spans, ("", len(logprobs), len(logprobs))]:
        if logprobs[gap_start:start].count(ZERO_LOG_PROB) != start - gap_start:
            raise _fail(f"{where}.generation_logprobs", "is not 0.0 outside the sampled spans")
        gap_start = end


def _check_against_capture(
    tokens: list[int],
    logprobs: list[Any],
    spans: list[tuple[str, int, int]],
    calls: Mapping[str, TokenEntry],
    where: str,
    calls_finite: bool,
) -> None:
    """Each span is exactly its call: the row before it is the call's prompt, the span its
    generation and log probs; every other log prob is 0.0.

    Prompts are compared longest first against one copy of the row's head, cut shorter for
    each: every position is copied once per row, however many spans' prompts hold it. The
    log probs are compared in one comparison with the row they must be: 0.0 in the gaps and
    each span's captured log probs, as many as the span's tokens and finite (what JSON gives
    that equals a finite float, an integer, a float or a bool, is a finite number); they are
    summed for that unless `calls_finite` says they were just checked.
    A row that differs is read again rule by rule, to name the rule it breaks.
    """
    expected = [ZERO_LOG_PROB] * len(logprobs)
    sampled: list[list[float]] = []
    head = tokens[: spans[-1][1]] if spans else []
    for call_id, start, end in reversed(spans):
        entry = calls.get(call_id)
        if entry is None:
            raise _fail(f"{where} span of {call_id!r}", "names a call the capture does not hold")
        del head[start:]
        prompt = entry.prompt_token_ids
        if start != len(prompt) or head != prompt:
            raise _fail(
                f"{where} span of {call_id!r}",
                "is not preceded by exactly the prompt the call was served",
            )
        if tokens[start:end] != entry.generation_token_ids:
            raise _fail(
                f"{where} span of {call_id!r}", "is not exactly the tokens the call generated"
            )
        captured = entry.generation_log_probs
        if type(captured) is not list or len(captured) != end - start:
            raise _fail(
                f"{where} span of {call_id!r}", "does not carry the call's sampling-time log probs"
            )
        expected[start:end] = captured
        sampled.append(captured)
    if not calls_finite and not _sums_to_finite(sampled):
        _check_finite(expected, where)  # decided value by value
    if logprobs != expected:
        _check_log_probs(logprobs, spans, where)
        wrong = [
            call_id for call_id, start, end in spans if logprobs[start:end] != expected[start:end]
        ]
        raise _fail(
            f"{where} span of {wrong[0]!r}" if wrong else f"{where}.generation_logprobs",
            "does not carry the call's sampling-time log probs",
        )


def _sums_to_finite(parts: list[list[float]]) -> bool:
    """Whether the parts' total is a finite float (each part summed as a float from its
    start, as `all_finite` does) and float32 holds every value; false also when it cannot
    be summed or overflows, and then each value must be looked at."""
    try:
        if not math.isfinite(sum(map(sum, parts, itertools.repeat(0.0)))):
            return False
    except (TypeError, ArithmeticError):
        return False
    return all(map(float32_holds, parts))


def check_envelope(
    envelope: Any,
    rollout_id: str | None = None,
    *,
    calls: Mapping[str, TokenEntry] | None = None,
    owners: Collection[str] | None = None,
    calls_finite: bool = False,
) -> None:
    """Raise `TraceEnvelopeError` unless `envelope` obeys every rule of version 1.

    Always checked: the header, each row's lengths, a 0 first mask position, spans that do
    not overlap and cover exactly the mask's 1s, log probs 0.0 outside spans and finite,
    trace ids `<rollout_id>:<last call>` (unique), and no call owned by two spans. With
    `calls` (the capture by call id) each span must be exactly its call; with `owners` the
    owned calls must be exactly those. `calls_finite` tells that every call's log probs were
    found finite since they last changed (`records.check_entry_consistency`, which a build
    runs on each entry it reads), so they are not summed again: a row's log probs must still
    equal them exactly.
    """
    traces = _check_header(envelope, rollout_id)
    rollout = envelope["rollout_id"]
    owned: dict[str, str] = {}
    seen_ids: set[str] = set()
    for t, trace in enumerate(traces):
        where = f"traces[{t}]"
        _check_trace(trace, where, rollout, owned, calls, calls_finite)
        if trace["trace_id"] in seen_ids:
            raise _fail(f"{where}.trace_id", f"{trace['trace_id']!r} is used twice")
        seen_ids.add(trace["trace_id"])
    if owners is not None and set(owned) != set(owners):
        missing = sorted(set(owners) - set(owned))[:5]
        extra = sorted(set(owned) - set(owners))[:5]
        raise _fail("traces", f"own other calls than expected (unowned {missing}, extra {extra})")


def trained_tokens(envelope: Mapping[str, Any]) -> int:
    """How many positions of a (checked) envelope train: the 1s of every row's mask."""
    return sum(sum(trace["loss_mask"]) for trace in envelope["traces"])


def owned_calls(envelope: Mapping[str, Any]) -> list[str]:
    """The call ids the spans of a (checked) envelope own, in trace order."""
    return [
        span["model_call_id"] for trace in envelope["traces"] for span in trace["sampled_spans"]
    ]


def envelope_of(record: Mapping[str, Any]) -> Any:
    """The record's envelope, or `None` when it carries none."""
    return record.get(ENVELOPE_KEY)
