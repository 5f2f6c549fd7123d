"""Terminal attribution: the four witnesses and their verdict on the scored call.

Four witnesses testify (explicit call id, declared response id, the response's id, its
model-authored content); each abstains with a reason rather than guess.
Calls with identical token sequences are interchangeable and collapse to the smallest call id.
Witnesses naming different calls attribute nothing: a contradiction is a defect, never outranked.
`check_strict_chain` holds the strict policy's chain to the scored response as well.
Attribution never raises; an internal error is an abstention with a reason.
This module imports only `call_content`, `identical_calls`, `records`, `terminal` and
`transcript`.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from capture_core.builder.call_content import ContentReader, entry_fingerprint, extends, path_items
from capture_core.builder.identical_calls import collapse_identical
from capture_core.builder.terminal import (
    DISAGREEMENT,
    NOT_ATTRIBUTED,
    STRICT_CONTRADICTED,
    TerminalAttribution,
    TerminalInputs,
    nonempty_str,
)
from capture_core.builder.transcript import ends_in_silent_turn, transcript_readings
from capture_core.records import TokenEntry
from capture_core.records.served import response_items

logger = logging.getLogger(__name__)

# Reading a path scans every call, so only this many candidate calls are read that way;
# more are ambiguous (the same text in many calls), which keeps attribution linear.
PATH_CANDIDATES = 8


@dataclass(frozen=True)
class _Testimony:
    witness: str
    call_id: str | None = None
    reason: str = ""


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
    response_id = nonempty_str(response.get("id"))
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
