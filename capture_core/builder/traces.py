"""Every sampled call trained exactly once: the `training_traces` envelope of one rollout.

Calls are linked by prefix as in `prefix_merging` (`forest.CallForest`), from the tokens
alone: a call whose prompt extends no call's prompt-plus-generation (a thinking model's
stripped history, a compaction summary, a sub-agent) is a root of its own row. Each call is
owned by exactly one span, in the first row (in a deterministic order) that holds it; a
shared ancestor repeated in another row is context there.

Left out, never owned (`TraceBuild.excluded`, with the reason):
- calls that generated nothing, and calls with exactly another call's tokens (one trains);
- abandoned tries: among calls with one prompt, a try that nothing extends and nothing
  names, when another try of the group is extended, named, or is the scored call; and
  every call built on an abandoned try. Tries that said the same thing as the transcript
  are told apart only by a later turn of the transcript made on top of one: an extension
  alone (a summary of the kept try, a judge of a rejected one) is no evidence there;
- calls made after the scored response: with an attributed terminal call, the calls that
  extend it and the calls whose prompt holds its whole generation (they saw the answer);
- an unsettled group (no try extended or named) only when a scored call elsewhere is
  attributed: then none of its tries led anywhere, and none is owned.
What makes the tokens unsafe masks the rollout (`TraceBuild.error`, no envelope): two
different captures of one call id, writer lineage the tokens contradict (an edited or
misrecorded capture, a lost parent), a disputed terminal, an unsettled group without an
attributed scored call, a call with an empty prompt, several traces in a capture that
cannot show it holds one attempt (an earlier attempt of the id looks like independent
traces), and an envelope that fails `trace_envelope.check_envelope` against the capture.
Retry groups are settled in `retry_groups` and the rows laid out in `trace_rows`; this module
decides which calls are owned and hands back the checked envelope.
This module imports only `call_content`, `errors`, `forest`, `identical_calls`, `records`,
`retry_groups`, `terminal`, `terminal_witnesses`, `trace_envelope` and `trace_rows`;
nothing here recurses.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from capture_core.builder.call_content import ContentReader
from capture_core.builder.forest import CallForest, call_order
from capture_core.builder.identical_calls import collapse_twins
from capture_core.builder.retry_groups import (
    ABANDONED_TRY,
    ON_ABANDONED_TRY,
    UNSETTLED_TRY,
    settle_retry_groups,
)
from capture_core.builder.terminal import NOT_ATTRIBUTED, TerminalAttribution, TerminalInputs
from capture_core.builder.terminal_witnesses import attribute_terminal
from capture_core.builder.trace_envelope import (
    ENVELOPE_BUILDERS,
    SCHEMA_VERSION,
    TraceEnvelopeError,
    check_envelope,
)
from capture_core.builder.trace_rows import merged_rows, trace_row
from capture_core.errors import InvalidInputError
from capture_core.records import TokenEntry, coerce_token_entry

EMPTY_GENERATION = "empty_generation"
IDENTICAL_DUPLICATE = "identical_duplicate"
AFTER_SCORED = "after_scored_response"
EXCLUSION_REASONS = (
    EMPTY_GENERATION,
    IDENTICAL_DUPLICATE,
    ABANDONED_TRY,
    ON_ABANDONED_TRY,
    AFTER_SCORED,
    UNSETTLED_TRY,
)
# A generation this short may occur in another prompt by chance; it is no evidence of order.
MIN_SEEN_GENERATION = 8
NO_ATTEMPT_MARKER = "no dispatch-time clear recorded"


@dataclass(frozen=True)
class TraceBuild:
    """One rollout's envelope, or the reason it has none; what was left out and why."""

    rollout_id: str
    builder: str
    envelope: dict[str, Any] | None
    error: str | None = None
    attribution: TerminalAttribution = NOT_ATTRIBUTED
    excluded: dict[str, str] = field(default_factory=dict)
    tokens_captured: int = 0
    tokens_trained: int = 0
    n_calls: int = 0

    @property
    def traces(self) -> int:
        return len(self.envelope["traces"]) if self.envelope else 0

    @property
    def owned_calls(self) -> int:
        if not self.envelope:
            return 0
        return sum(len(t["sampled_spans"]) for t in self.envelope["traces"])

    def excluded_counts(self) -> dict[str, int]:
        """Left-out calls per reason, reasons sorted."""
        counts: dict[str, int] = {}
        for why in self.excluded.values():
            counts[why] = counts.get(why, 0) + 1
        return dict(sorted(counts.items())) if len(counts) > 1 else counts


class _Unsafe(Exception):
    """The capture cannot be trained from safely; the message is the rollout's mask reason."""


def build_training_traces(
    rollout_id: str,
    entries: Iterable[Any],
    builder: str = "prefix_merging",
    terminal: TerminalInputs | None = None,
    *,
    one_attempt: bool = True,
) -> TraceBuild:
    """The envelope of one frozen snapshot's entries, checked; an unsafe capture has none.

    `terminal` (from the finished record) names the scored call and its transcript, the
    evidence that tells a used try from an abandoned one. `one_attempt` says whether the
    capture shows it holds one attempt (the snapshot's attempt marker); without it, calls
    that form more than one trace mask the rollout, since an earlier attempt of the id left
    in the capture would look like independent traces. Invalid entries raise `ValueError`;
    an unknown builder too. Every entry is read before any is checked; entries another
    thread changes while the build runs are not defended against.
    """
    if builder not in ENVELOPE_BUILDERS:
        known = ", ".join(ENVELOPE_BUILDERS)
        raise InvalidInputError(f"unknown builder {builder!r}; use one of {known}")
    # Every entry is read before any is checked, so the checks see the entries the build uses.
    records = [coerce_token_entry(entry) for entry in list(entries)]
    plan = _Plan(rollout_id, records, terminal)
    try:
        plan.settle()
        if not one_attempt:
            plan.refuse_unproven_attempt()
        envelope = plan.envelope(builder)
        calls = dict(zip(plan.call_ids, plan.calls, strict=True))
        # Every call was checked by `coerce_token_entry` above, log probs finite included.
        owners = plan.kept_ids()
        check_envelope(envelope, rollout_id, calls=calls, owners=owners, calls_finite=True)
    except _Unsafe as exc:
        return plan.build(builder, None, error=str(exc))
    except TraceEnvelopeError as exc:
        return plan.build(builder, None, error=f"envelope refused before handoff: {exc}")
    return plan.build(builder, envelope)


class _Plan:
    """Which calls of a rollout are owned, decided from the tokens and the finished record."""

    def __init__(
        self, rollout_id: str, records: list[TokenEntry], terminal: TerminalInputs | None
    ) -> None:
        self.rollout_id, self.records, self.terminal = rollout_id, records, terminal
        self.attribution = NOT_ATTRIBUTED
        self.early: dict[str, str] = {}
        self.calls: list[TokenEntry] = []
        self.call_ids: list[str] = []
        self.excluded: dict[int, str] = {}
        self.forest: CallForest | None = None
        self._kept: list[int] = []
        self.reader = ContentReader()

    def build(
        self, builder: str, envelope: dict[str, Any] | None, error: str | None = None
    ) -> TraceBuild:
        """The outcome: the checked envelope and the tokens it trains, or the mask reason."""
        records, calls = self.records, self.calls
        trained = sum([len(calls[i].generation_token_ids) for i in self._kept]) if envelope else 0
        captured = sum([len(r.generation_token_ids) for r in records])
        return TraceBuild(
            self.rollout_id,
            builder,
            envelope,
            error=error,
            attribution=self.attribution,
            excluded=self.excluded_ids(),
            tokens_captured=captured,
            tokens_trained=trained,
            n_calls=len(records),
        )

    def excluded_ids(self) -> dict[str, str]:
        if not self.excluded and not self.early:
            return {}
        named = {self.calls[i].model_call_id: why for i, why in self.excluded.items()}
        return dict(sorted({**self.early, **named}.items()))

    def kept_ids(self) -> list[str]:
        return list(map(self.call_ids.__getitem__, self._kept))

    def settle(self) -> None:
        """Decide every call's fate; raise `_Unsafe` when the capture must mask."""
        distinct, known = _distinct_by_id(self.records)
        with_tokens = [r for r in distinct if r.generation_token_ids]
        if len(with_tokens) < len(distinct):
            self.early = {
                r.model_call_id: EMPTY_GENERATION for r in distinct if not r.generation_token_ids
            }
        self.calls, twins = collapse_twins(sorted(with_tokens, key=call_order))
        self.call_ids = [call.model_call_id for call in self.calls]
        self.early.update(dict.fromkeys(twins, IDENTICAL_DUPLICATE))
        if not self.calls:
            raise _Unsafe("the capture holds no call with generated tokens")
        self.forest = forest = CallForest(self.calls, known, collapse=True)
        if forest.contradicted:
            bad = sorted(self.calls[i].model_call_id for i in forest.contradicted)
            raise _Unsafe(
                f"writer lineage contradicted by the tokens for calls {bad}: a recorded parent "
                "is missing from the snapshot or denied by the tokens, or a cum_len or digest "
                "does not describe the call (a lost call or an edited capture)"
            )
        terminal = self._scored_call(distinct, twins)
        if terminal is not None:
            self._exclude_after(terminal)
        unsettled = settle_retry_groups(
            self.calls, forest, self.excluded, terminal, self.reader, self._response()
        )
        if unsettled:
            raise _Unsafe(
                f"unsettled retry groups {unsettled}: nothing extends or names one of their "
                "tries and no scored call is attributed, so any of them may be abandoned"
            )
        excluded = self.excluded
        everything = range(len(self.calls))
        self._kept = kept = (
            [i for i in everything if i not in excluded] if excluded else [*everything]
        )
        if not kept:
            raise _Unsafe("no call is left to train once the excluded calls are left out")
        # Calls are in call order, shortest prompt first: an empty prompt is the first kept.
        if not self.calls[kept[0]].prompt_token_ids:
            raise _Unsafe(
                "a call with an empty prompt cannot train: its first token has no context"
            )

    def refuse_unproven_attempt(self) -> None:
        """Raise `_Unsafe` when the kept calls form more than one trace (root-to-leaf path).

        One trace is one prefix chain: a call of an earlier attempt is on it only with the
        tokens this attempt was served, so it cannot add another attempt's samples. Several
        traces may be sub-agents, forks or an earlier attempt; only the marker tells.
        """
        assert self.forest is not None
        children, excluded = self.forest.children, self.excluded
        leaves = sum(
            1 for i in self._kept if not any(kid not in excluded for kid in children.get(i, ()))
        )
        if leaves > 1:
            raise _Unsafe(
                f"{NO_ATTEMPT_MARKER}: the capture holds {leaves} traces and no attempt "
                "marker, so an earlier attempt of this rollout id left in it cannot be told "
                "from independent traces; run the dispatch-time clear (tokcap clear, or "
                "clear_token_captures_for_rollouts) before every dispatch, re-dispatches "
                "included, into a tokcap store (NeMo Gym's file store keeps no marker)"
            )

    def _scored_call(self, distinct: list[TokenEntry], twins: dict[str, str]) -> int | None:
        """The position of the attributed scored call; a disputed attribution is unsafe."""
        self.attribution = attribute_terminal(distinct, self.terminal, self.reader)
        if self.attribution.must_mask:
            raise _Unsafe(f"the record's scored call is disputed: {self.attribution.reason}")
        call_id = self.attribution.call_id
        if call_id is None:
            return None
        assert self.forest is not None
        position = self.forest.position(twins.get(call_id, call_id))  # ids are distinct here
        if position is None:
            raise _Unsafe(f"the scored call {call_id!r} generated no tokens in the capture")
        return position

    def _exclude_after(self, terminal: int) -> None:
        """Leave out calls made after the scored response: they extend it or hold its answer."""
        assert self.forest is not None
        after = set(self.forest.descendants(terminal))
        if len(self.calls[terminal].generation_token_ids) >= MIN_SEEN_GENERATION:
            self._exclude_seen(terminal, after)
        for i in after:
            self.excluded.setdefault(i, AFTER_SCORED)

    def _exclude_seen(self, terminal: int, after: set[int]) -> None:
        """Add to `after` the calls whose prompt holds the scored call's whole generation, and
        the calls built on them. A call captured before the scored one cannot have seen it."""
        assert self.forest is not None
        scored = self.calls[terminal]
        size, scored_at = len(scored.generation_token_ids), scored.created_at
        candidates = [
            i
            for i, call in enumerate(self.calls)
            if not 0 < call.created_at < scored_at
            and len(call.prompt_token_ids) >= size
            and i not in after
            and i != terminal
        ]
        if not candidates:
            return
        needle = array("q", scored.generation_token_ids).tobytes()
        on_path = set(self.forest.path_to(terminal))
        for i in candidates:
            if i in after or i in on_path:
                continue
            if _holds(self.calls[i].prompt_token_ids, needle):
                after.add(i)
                after.update(self.forest.descendants(i))

    def _response(self) -> Any:
        """The scored response the record gives, or `None`."""
        return self.terminal.response if self.terminal is not None else None

    def envelope(self, builder: str) -> dict[str, Any]:
        """The envelope of the kept calls: rows in a deterministic order, each call owned once."""
        ids, kept = self.call_ids, self._kept
        if builder == "prefix_merging":
            assert self.forest is not None
            parent, excluded = self.forest.parent, self.excluded
            if excluded and any(parent[i] is not None and parent[i] in excluded for i in kept):
                raise _Unsafe("a kept call extends a call that was left out")
            rows = merged_rows(self.forest, kept, excluded)
        else:
            rows = [([i], [i]) for i in kept]
        return {
            "schema_version": SCHEMA_VERSION,
            "rollout_id": self.rollout_id,
            "builder": builder,
            "traces": [trace_row(self.rollout_id, self.calls, ids, row) for row in rows],
        }


def _distinct_by_id(records: list[TokenEntry]) -> tuple[list[TokenEntry], frozenset[str]]:
    """One record per call id, and the ids; two different records under one id are unsafe."""
    ids = frozenset([record.model_call_id for record in records])
    if len(ids) == len(records):
        return records, ids  # the usual case: every id once
    by_id: dict[str, TokenEntry] = {}
    for record in records:
        seen = by_id.setdefault(record.model_call_id, record)
        if seen is not record and seen != record:
            _raise_conflict(record.model_call_id)
    return list(by_id.values()), ids


def _raise_conflict(call_id: str) -> None:
    raise _Unsafe(
        f"call {call_id!r} was captured twice with different content; which one the policy "
        "sampled cannot be told"
    )


def _holds(tokens: list[int], needle: bytes) -> bool:
    """Whether `tokens` holds the int64 token bytes `needle` at a token boundary."""
    hay = array("q", tokens).tobytes()
    at = hay.find(needle)
    while at >= 0:
        if at % 8 == 0:
            return True
        at = hay.find(needle, at + 1)
    return False
