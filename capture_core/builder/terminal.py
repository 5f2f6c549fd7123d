"""Terminal attribution: which captured call produced the response the verifier scored.

Four witnesses testify (explicit call id, declared response id, the response's id, its
model-authored content); each abstains with a reason rather than guess.
Calls with identical token sequences are interchangeable and collapse to the smallest call id.
Witnesses naming different calls attribute nothing: a contradiction is a defect, never outranked.
Attribution never raises; an internal error is an abstention with a reason.
This module imports only `records` and `transcript`.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from capture_core.builder.transcript import ends_in_silent_turn, own_items, transcript_readings
from capture_core.records import TokenEntry, response_items

logger = logging.getLogger(__name__)

TERMINAL_CALL_KEY = "_ng_terminal_model_call_id"
DECLARED_RESPONSE_KEY = "terminal_response_id"
BEFORE_FINALIZE_KEY = "_before_finalize"
"""Where a finalized record keeps the fields finalize replaced, as the harness wrote them;
its `response` is the scored response when finalize rebuilt the record's."""
WITNESSES = ("explicit", "declared", "response_id", "content")
# Chain status of a build: no terminal given, the root-to-terminal path was delivered, the
# path crosses an ambiguous call, or the terminal is not among the buildable calls.
CHAIN_NONE, CHAIN_DELIVERED, CHAIN_BROKEN, CHAIN_NOT_CAPTURED = (
    "",
    "delivered",
    "broken",
    "not_captured",
)
UNATTRIBUTED = "none"
"""The method ledgers and reports name for a build that attributed no call (its metric's `"")."""
DISAGREEMENT = "witness_disagreement"
# The record's own declarations: an abstention of one of these masks the rollout.
DECLARING = ("explicit:", "declared:")
STRICT_CONTRADICTED = "content:contradicts_strict_chain"
# Reading a path scans every call, so only this many candidate calls are read that way;
# more are ambiguous (the same text in many calls), which keeps attribution linear.
PATH_CANDIDATES = 8


@dataclass(frozen=True)
class TerminalInputs:
    """What a finished rollout record says about its terminal call; every part is optional."""

    explicit_call_id: str | None = None
    declared_response_id: str | None = None
    response: Mapping[str, Any] | None = None

    @classmethod
    def from_record(cls, record: Any) -> TerminalInputs:
        """Read `_ng_terminal_model_call_id`, `terminal_response_id` and `response`.

        The scored response is the one the harness wrote: a finalized record's `response`
        holds finalize's rebuild, so the one it kept under `_before_finalize` is read instead.
        Values of the wrong type are ignored (they testify to nothing), so this never raises.
        """
        if not isinstance(record, Mapping):
            return cls()
        kept = record.get(BEFORE_FINALIZE_KEY)
        if isinstance(kept, Mapping) and "response" in kept:
            response = kept["response"]
        else:
            response = record.get("response")
        return cls(
            explicit_call_id=_nonempty_str(record.get(TERMINAL_CALL_KEY)),
            declared_response_id=_nonempty_str(record.get(DECLARED_RESPONSE_KEY)),
            response=response if isinstance(response, Mapping) else None,
        )


class ContentReader:
    """Model-authored content, read once per build: each call's own keys, and the scored
    response's items and readings. Each is remembered with the object it was read from, so a
    reader serves one build: content changed in place after it was read is not read again."""

    def __init__(self) -> None:
        self._own: dict[int, tuple[TokenEntry, tuple]] = {}
        self._response: Mapping[str, Any] | None = None
        self._items: list[Any] = []
        self._readings: tuple[tuple, tuple] | None = None

    def own(self, call: TokenEntry) -> tuple:
        """The call's own model-authored keys (`entry_fingerprint`)."""
        found = self._own.get(id(call))
        if found is None or found[0] is not call:
            found = self._own[id(call)] = (call, entry_fingerprint(call))
        return found[1]

    def items(self, response: Mapping[str, Any]) -> list[Any]:
        """The response's items (`response_items`)."""
        if self._response is not response:
            self._items, self._readings = response_items(response), None
            self._response = response
        return self._items

    def readings(self, response: Mapping[str, Any]) -> tuple[tuple, tuple]:
        """The readings of the response's items, all of them and the trailing block
        (`transcript_readings`); a malformed item raises, each time they are asked for."""
        items = self.items(response)
        if self._readings is None:
            self._readings = transcript_readings(items)
        return self._readings


@dataclass(frozen=True)
class TerminalAttribution:
    """The verdict: the attributed call (or none), the witness that named it, and the trail.

    `must_mask` is set when the record declared its terminal and the declaration could not
    be attributed, or when witnesses contradict each other: the strict policy must not
    deliver something the evidence disputes.
    """

    method: str = ""
    call_id: str | None = None
    reason: str = ""
    must_mask: bool = False

    def metrics(self, chain: str = CHAIN_NONE) -> dict[str, Any]:
        """The `terminal_attribution` block of a build's metrics, as the record carries it."""
        return TerminalMetric.of(self, chain).as_dict()


@dataclass(frozen=True, slots=True)
class TerminalMetric:
    """A build's `terminal_attribution` block, typed: the verdict and what became of its chain."""

    method: str = ""
    call_id: str | None = None
    reason: str = ""
    chain: str = CHAIN_NONE

    @classmethod
    def of(cls, attribution: TerminalAttribution, chain: str = CHAIN_NONE) -> TerminalMetric:
        return cls(attribution.method, attribution.call_id, attribution.reason, chain)

    @classmethod
    def from_dict(cls, block: Mapping[str, Any]) -> TerminalMetric:
        """Read the block back; absent or mistyped fields take their defaults."""
        call_id = block.get("call_id")
        return cls(
            method=str(block.get("method") or ""),
            call_id=call_id if isinstance(call_id, str) else None,
            reason=str(block.get("reason") or ""),
            chain=str(block.get("chain") or CHAIN_NONE),
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "call_id": self.call_id,
            "reason": self.reason,
            "chain": self.chain,
        }

    @property
    def abstentions(self) -> list[str]:
        """The abstention codes in the reason, for reports (`abstention_reasons`)."""
        return abstention_reasons(self.reason)


@dataclass(frozen=True)
class _Testimony:
    witness: str
    call_id: str | None = None
    reason: str = ""


NOT_ATTRIBUTED = TerminalAttribution()


def _nonempty_str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def same_sequence(a: TokenEntry, b: TokenEntry) -> bool:
    """Whether two calls have identical prompt and generation tokens (interchangeable)."""
    return a.generation_token_ids == b.generation_token_ids and (
        a.prompt_token_ids == b.prompt_token_ids
    )


def collapse_identical(candidates: Sequence[TokenEntry]) -> TokenEntry | None:
    """The smallest-id call when all candidates share one token sequence; else `None`."""
    if not candidates:
        return None
    first = candidates[0]
    if any(not same_sequence(first, other) for other in candidates[1:]):
        return None
    return min(candidates, key=lambda e: e.model_call_id)


def attribute_terminal(
    entries: Iterable[TokenEntry],
    inputs: TerminalInputs | None,
    reader: ContentReader | None = None,
) -> TerminalAttribution:
    """Join the scored response to the captured call that produced it; never raises.

    `reader` keeps what attribution read of the content for the rest of one build.
    """
    if inputs is None:
        return NOT_ATTRIBUTED
    try:
        return _attribute(list(entries), inputs, reader or ContentReader())
    except Exception as exc:  # attribution must never fail a build
        logger.warning("terminal attribution failed, abstaining: %s", exc)
        witness = _declaring_witness(inputs)
        return TerminalAttribution(
            reason=f"{witness or 'attribution'}:attribution_error[{type(exc).__name__}]",
            must_mask=witness is not None,
        )


def _declaring_witness(inputs: TerminalInputs) -> str | None:
    """The witness of the record's own declaration (declared, else explicit), or `None`."""
    if inputs.declared_response_id is not None:
        return "declared"
    return "explicit" if inputs.explicit_call_id is not None else None


def _attribute(
    entries: list[TokenEntry], inputs: TerminalInputs, reader: ContentReader
) -> TerminalAttribution:
    """The verdict; a declaration (explicit call or declared response id) naming no captured
    call stops attribution and masks: the harness said what it kept, and it is not there."""
    by_id = {entry.model_call_id: entry for entry in entries}
    testimonies: list[_Testimony] = []
    if inputs.explicit_call_id is not None:
        testimonies.append(_explicit(by_id, inputs.explicit_call_id))
    if inputs.declared_response_id is not None:
        testimonies.append(_by_response_id("declared", entries, inputs.declared_response_id))
    unmet = [t for t in testimonies if t.call_id is None]
    if unmet:
        return TerminalAttribution(reason=_trail(unmet), must_mask=True)
    if inputs.response is not None:
        testimonies.append(_guarded("response_id", _response_id, entries, inputs.response))
        content = functools.partial(_content, reader=reader)
        testimonies.append(_guarded("content", content, entries, inputs.response))
    return _verdict(testimonies, by_id)


def _guarded(
    witness: str,
    read: Callable[[list[TokenEntry], Mapping[str, Any]], _Testimony],
    entries: list[TokenEntry],
    response: Mapping[str, Any],
) -> _Testimony:
    """A witness whose reading of the response fails abstains; the others still testify."""
    try:
        return read(entries, response)
    except Exception as exc:  # a malformed response silences only its own witnesses
        logger.warning("terminal witness %s abstains: %s", witness, exc)
        return _Testimony(witness, reason=f"attribution_error[{type(exc).__name__}]")


def _explicit(by_id: Mapping[str, TokenEntry], call_id: str) -> _Testimony:
    if call_id in by_id:
        return _Testimony("explicit", call_id)
    return _Testimony("explicit", reason="explicit_terminal_not_captured")


_ID_REASONS = {
    "declared": ("declared_terminal_not_captured", "declared_ambiguous"),
    "response_id": ("response_id_no_match", "response_id_ambiguous"),
}


def _by_response_id(witness: str, entries: list[TokenEntry], response_id: str) -> _Testimony:
    """The one call served under `response_id`, after collapsing identical sequences."""
    not_found, ambiguous = _ID_REASONS[witness]
    named = [e for e in entries if getattr(e, "response_id", None) == response_id]
    if not named:
        return _Testimony(witness, reason=not_found)
    chosen = collapse_identical(named)
    if chosen is None:
        return _Testimony(witness, reason=ambiguous)
    return _Testimony(witness, chosen.model_call_id)


def _response_id(entries: list[TokenEntry], response: Mapping[str, Any]) -> _Testimony:
    response_id = _nonempty_str(response.get("id"))
    if response_id is None:
        return _Testimony("response_id", reason="response_has_no_id")
    return _by_response_id("response_id", entries, response_id)


def _content(
    entries: list[TokenEntry], response: Mapping[str, Any], reader: ContentReader
) -> _Testimony:
    """The call whose model-authored items the scored response holds, or an abstention.

    A call matches when its own items are all of the response's (a harness that returned
    the final turn) or its trailing block (a merged conversation); failing that, when its
    root-to-call path holds exactly the response's items (a merged conversation with no
    break between turns). Matches with identical sequences collapse; different ones are
    settled by `_settle`, else ambiguous.
    """
    items = reader.items(response)
    if ends_in_silent_turn(items):
        return _Testimony("content", reason="final_turn_without_content")
    full, trailing = reader.readings(response)
    readings = {reading for reading in (full, trailing) if reading}
    own = {id(e): reader.own(e) for e in entries}
    matches = [e for e in entries if own[id(e)] and own[id(e)] in readings]
    if not matches and full:
        ends = [e for e in entries if own[id(e)] and full[-len(own[id(e)]) :] == own[id(e)]]
        if len(ends) > PATH_CANDIDATES:
            return _Testimony("content", reason="content_ambiguous")
        matches = [e for e in ends if path_items(e, entries, own) == full]
    if not matches:
        return _Testimony("content", reason="no_content_match")
    chosen = collapse_identical(matches) or _settle(matches, entries, full, own)
    if chosen is None:
        return _Testimony("content", reason="content_ambiguous")
    return _Testimony("content", chosen.model_call_id)


def _settle(
    matches: list[TokenEntry], entries: list[TokenEntry], full: tuple, own: Mapping[int, tuple]
) -> TokenEntry | None:
    """One of several different matching calls, when the evidence singles it out; else `None`.

    First the whole transcript: a call whose root-to-call path holds exactly the response's
    model-authored items (or whose own items are all of them) beats calls that match only
    the trailing block, when those lie on its path (the same text earlier in the transcript).
    A trailing match on another branch is not outranked: its own path may only be unreadable
    from the tokens (a re-rendered prompt), so the two are a tie. A later call that extended
    one retry is no evidence: a judge of an abandoned attempt extends it just as a summary of
    the kept one does. Anything still tied (identical sequences collapse) is never picked.
    """
    if len(matches) > PATH_CANDIDATES:
        return None
    whole = [m for m in matches if own[id(m)] == full or path_items(m, entries, own) == full]
    pool = whole or matches
    if len(pool) < len(matches) and (chosen := collapse_identical(pool)) is not None:
        outranked = [m for m in matches if all(m is not p for p in pool)]
        return chosen if all(extends(chosen.prompt_token_ids, m) for m in outranked) else None
    return collapse_identical(pool)


def extends(prompt: Sequence[int], parent: TokenEntry) -> bool:
    """Whether `parent` generated tokens and its prompt plus generation begins `prompt`."""
    p, g = parent.prompt_token_ids, parent.generation_token_ids
    cut = len(p)
    return bool(g) and prompt[:cut] == p and prompt[cut : cut + len(g)] == g


def path_items(call: TokenEntry, entries: Sequence[TokenEntry], own: Mapping[int, tuple]) -> tuple:
    """The model-authored items along the root-to-`call` path, read from the tokens.

    The calls on the path are those whose sequence is a prefix of `call`'s prompt, one per
    length (identical retries are one call), in order of length.
    """
    ancestors: dict[int, TokenEntry] = {}
    for entry in entries:
        if entry is not call and extends(call.prompt_token_ids, entry):
            length = len(entry.prompt_token_ids) + len(entry.generation_token_ids)
            ancestors.setdefault(length, entry)
    path = [ancestors[n] for n in sorted(ancestors)]
    return tuple(key for entry in (*path, call) for key in own[id(entry)])


def _verdict(testimonies: list[_Testimony], by_id: Mapping[str, TokenEntry]) -> TerminalAttribution:
    named = [t for t in testimonies if t.call_id is not None]
    abstained = [t for t in testimonies if t.call_id is None]
    if not named:
        return TerminalAttribution(reason=_trail(abstained))
    chosen = collapse_identical([by_id[t.call_id] for t in named])  # type: ignore[index]
    if chosen is None:
        names = ";".join(f"{t.witness}={t.call_id}" for t in named)
        return TerminalAttribution(
            reason="; ".join(filter(None, [f"{DISAGREEMENT}[{names}]", _trail(abstained)])),
            must_mask=True,
        )
    corroboration = [t.witness for t in named[1:]]
    parts = [f"corroborated_by={','.join(corroboration)}"] if corroboration else []
    return TerminalAttribution(
        method=named[0].witness,
        call_id=chosen.model_call_id,
        reason="; ".join(filter(None, [*parts, _trail(abstained)])),
    )


def check_strict_chain(
    attribution: TerminalAttribution, inputs: TerminalInputs | None, chain: Sequence[TokenEntry]
) -> TerminalAttribution:
    """The verdict, made to mask when the scored response ends inside `chain`, before its leaf.

    `chain` is the strict policy's main chain, about to be delivered because nothing was
    attributed. The response ends at a call when its model-authored items are the chain's up
    to that call, or its whole or trailing reading is that call's own. Ending at an earlier
    call and not at the leaf means the chain runs past what was scored (a later call that
    continued the conversation, say). A response that matches no call of the chain testifies
    to nothing, so the strict policy stands. Never raises.
    """
    if attribution.call_id is not None or inputs is None or inputs.response is None:
        return attribution
    try:
        ends_early = _ends_before_leaf(inputs.response, chain)
    except Exception as exc:  # attribution must never fail a build
        logger.warning("checking the strict chain against the response failed: %s", exc)
        return attribution
    if not ends_early:
        return attribution
    reason = "; ".join(filter(None, [attribution.reason, STRICT_CONTRADICTED]))
    return TerminalAttribution(reason=reason, must_mask=True)


def _ends_before_leaf(response: Mapping[str, Any], chain: Sequence[TokenEntry]) -> bool:
    """Whether the response ends at a call of `chain` before its leaf, and not at the leaf."""
    full, trailing = transcript_readings(response_items(response))
    if not full:
        return False
    own = [entry_fingerprint(entry) for entry in chain]
    flat = [key for keys in own for key in keys]
    ends: list[bool] = []
    covered = 0
    for keys in own:
        covered += len(keys)
        whole = bool(keys) and covered == len(full) and tuple(flat[:covered]) == full
        ends.append(whole or (bool(keys) and keys in (full, trailing)))
    return any(ends[:-1]) and not ends[-1]


def _trail(abstained: Iterable[_Testimony]) -> str:
    return "; ".join(f"{t.witness}:{t.reason}" for t in abstained)


def blocking_reason(metric: TerminalMetric | Mapping[str, Any] | None) -> str | None:
    """Why an unattributed verdict masks (a failed declaration, disagreeing witnesses), or `None`.

    It reads the `terminal_attribution` metric, so ledgers and reports agree with the mask.
    """
    if isinstance(metric, Mapping):
        metric = TerminalMetric.from_dict(metric) if metric else None
    if metric is None or metric.method:
        return None
    reason = metric.reason
    parts = [part.strip() for part in reason.split(";")]
    if any(p.startswith((DISAGREEMENT, *DECLARING, STRICT_CONTRADICTED)) for p in parts):
        return f"terminal not attributable: {reason}"
    return None


def abstention_reasons(reason: str) -> list[str]:
    """The abstention codes in a verdict's reason (`witness_disagreement` included), for reports."""
    codes = []
    for part in filter(None, (p.strip() for p in reason.split(";"))):
        if part.startswith(DISAGREEMENT):
            codes.append(DISAGREEMENT)
        elif ":" in part and "=" not in part.split(":", 1)[0]:
            codes.append(part.split(":", 1)[1])
    return codes


def entry_fingerprint(entry: TokenEntry) -> tuple:
    """A call's own model-authored keys (from its captured content items)."""
    return own_items(entry.output_items)
