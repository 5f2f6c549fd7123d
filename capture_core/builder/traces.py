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
This module imports only `errors`, `forest`, `prefix`, `records`, `terminal` and
`trace_envelope`; nothing here recurses.
"""

from __future__ import annotations

from array import array
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from capture_core.builder.forest import CallForest, call_order
from capture_core.builder.prefix import joined_key, prefix_key
from capture_core.builder.terminal import (
    NOT_ATTRIBUTED,
    ContentReader,
    TerminalAttribution,
    TerminalInputs,
    attribute_terminal,
)
from capture_core.builder.trace_envelope import (
    ENVELOPE_BUILDERS,
    SCHEMA_VERSION,
    ZERO_LOG_PROB,
    TraceEnvelopeError,
    check_envelope,
)
from capture_core.errors import InvalidInputError
from capture_core.records import TokenEntry, coerce_token_entry

EMPTY_GENERATION = "empty_generation"
IDENTICAL_DUPLICATE = "identical_duplicate"
ABANDONED_TRY = "abandoned_try"
ON_ABANDONED_TRY = "built_on_abandoned_try"
AFTER_SCORED = "after_scored_response"
UNSETTLED_TRY = "unsettled_try"
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
_ZERO, _OFF, _ON = [ZERO_LOG_PROB], [0], [1]


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

    def kept(self) -> list[int]:
        """The owned calls' positions, once `settle` has decided them."""
        return self._kept

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
        self.calls, twins = _collapse_identical(sorted(with_tokens, key=call_order))
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
        self._settle_groups(terminal)
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

    def _subtree(self, root: int) -> list[int]:
        """`root`'s descendants, without `root`, without recursion."""
        assert self.forest is not None
        found, todo = [], list(self.forest.children.get(root, ()))
        while todo:
            node = todo.pop()
            found.append(node)
            todo.extend(self.forest.children.get(node, ()))
        return found

    def _exclude_after(self, terminal: int) -> None:
        """Leave out calls made after the scored response: they extend it or hold its answer."""
        after = set(self._subtree(terminal))
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
                after.update(self._subtree(i))

    def _own(self, i: int) -> tuple:
        """Call `i`'s own model-authored items, read once per build."""
        return self.reader.own(self.calls[i])

    def _abandon(self, i: int) -> None:
        self.excluded[i] = ABANDONED_TRY
        for j in self._subtree(i):
            self.excluded.setdefault(j, ON_ABANDONED_TRY)

    def _settle_groups(self, terminal: int | None) -> None:
        """Tell used tries from abandoned ones in every group of calls with one prompt.

        Deepest groups first, so whether a try was extended is final when it is read.
        """
        assert self.forest is not None
        children = self.forest.children
        groups = _same_prompt_groups(self.calls)
        reading = self._transcript_reading() if groups else ()
        unsettled: list[list[str]] = []
        for group in groups:
            live = [i for i in group if i not in self.excluded]
            if len(live) < 2:
                continue
            if terminal in live:
                used = [terminal]
            elif _tied(self._own, live, reading):
                used = [i for i in live if self._continues(i, reading)]
            else:
                used = [i for i in live if children.get(i) or _named(self._own, i, live, reading)]
            if used:
                for i in live:
                    if i not in used:
                        self._abandon(i)
            elif terminal is not None:
                self.excluded.update(dict.fromkeys(live, UNSETTLED_TRY))
            else:
                unsettled.append(sorted(self.calls[i].model_call_id for i in live))
        if unsettled:
            raise _Unsafe(
                f"unsettled retry groups {unsettled}: nothing extends or names one of their "
                "tries and no scored call is attributed, so any of them may be abandoned"
            )

    def _transcript_reading(self) -> tuple:
        """The scored response's model-authored items, in order; empty when there is none."""
        response = self.terminal.response if self.terminal is not None else None
        if response is None:
            return ()
        try:
            return self.reader.readings(response)[0]
        except Exception:  # an unreadable transcript names nothing
            return ()

    def _continues(self, i: int, reading: tuple) -> bool:
        """Whether a later turn of the scored transcript was made on top of call `i`."""
        for j in self._subtree(i):
            own = self._own(j)
            if own and _runs_in(own, reading):
                return True
        return False

    def envelope(self, builder: str) -> dict[str, Any]:
        """The envelope of the kept calls: rows in a deterministic order, each call owned once."""
        ids = self.call_ids
        if builder == "prefix_merging":
            traces = [self._trace(path, owners, ids) for path, owners in self._rows()]
        else:
            traces = [self._trace([i], [i], ids) for i in self.kept()]
        return {
            "schema_version": SCHEMA_VERSION,
            "rollout_id": self.rollout_id,
            "builder": builder,
            "traces": traces,
        }

    def _rows(self) -> list[tuple[list[int], list[int]]]:
        """Every root-to-leaf path of the kept calls, depth first, children in call order, each
        with its owners: the calls no earlier row holds (the path below where it branches)."""
        assert self.forest is not None
        parent, children, excluded = self.forest.parent, self.forest.children, self.excluded
        kept = self.kept()
        if excluded and any(parent[i] is not None and parent[i] in excluded for i in kept):
            raise _Unsafe("a kept call extends a call that was left out")
        # Positions are in call order and children are linked in position order: no sort.
        stack = [(root, 0) for root in reversed(kept) if parent[root] is None]
        rows: list[tuple[list[int], list[int]]] = []
        path: list[int] = []
        owned = 0  # how much of `path` an earlier row holds
        while stack:
            node, depth = stack.pop()
            del path[depth:]
            if depth < owned:
                owned = depth
            while True:  # down the first child to a leaf; later children wait on the stack
                path.append(node)
                below = children.get(node)
                if below and excluded:
                    below = [kid for kid in below if kid not in excluded]
                if not below:
                    break
                if len(below) > 1:
                    stack += [(kid, len(path)) for kid in reversed(below[1:])]
                node = below[0]
            rows.append((path.copy(), path[owned:]))
            owned = len(path)
        return rows

    def _trace(self, path: list[int], owners: list[int], ids: list[str]) -> dict[str, Any]:
        """One row: the path's tokens, with the owners' generations as its spans (`ids`: the
        call ids by position)."""
        calls = self.calls
        # Each prompt on a path extends the call before it, so the row is the leaf's
        # prompt plus generation (`check_envelope` verifies every span against its call).
        leaf_call = calls[path[-1]]
        tokens = leaf_call.prompt_token_ids + leaf_call.generation_token_ids
        n = len(tokens)
        logprobs, mask = _ZERO * n, _OFF * n
        spans = []
        for i in owners:  # in path order, so spans come in position order
            call = calls[i]
            start = len(call.prompt_token_ids)
            end = start + len(call.generation_token_ids)
            logprobs[start:end] = call.generation_log_probs
            mask[start:end] = _ON * (end - start)
            spans.append({"model_call_id": ids[i], "start": start, "end": end})
        return {
            "trace_id": f"{self.rollout_id}:{ids[path[-1]]}",
            "model_call_ids": list(map(ids.__getitem__, path)),
            "token_ids": tokens,
            "generation_logprobs": logprobs,
            "loss_mask": mask,
            "sampled_spans": spans,
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


def _same_tokens(a: TokenEntry, b: TokenEntry) -> bool:
    return a.prompt_token_ids == b.prompt_token_ids and (
        a.generation_token_ids == b.generation_token_ids
    )


def _collapse_identical(calls: list[TokenEntry]) -> tuple[list[TokenEntry], dict[str, str]]:
    """Calls with pairwise different tokens (the smallest id of each identical set), and each
    left-out twin's representative. Twins train the same tokens: one of them is owned."""
    sizes = [(len(call.prompt_token_ids), len(call.generation_token_ids)) for call in calls]
    if len(set(sizes)) == len(sizes):
        return calls, {}  # twins have equal sizes: the usual case reads no token
    keys = [
        (len(call.prompt_token_ids), joined_key(call.prompt_token_ids, call.generation_token_ids))
        for call in calls
    ]
    twins: dict[str, str] = {}
    for members in _clashes(keys, calls):
        for group in _partition(members, _same_tokens):
            keep = min(group, key=lambda c: c.model_call_id)
            twins.update((c.model_call_id, keep.model_call_id) for c in group if c is not keep)
    return [c for c in calls if c.model_call_id not in twins], twins


def _clashes(keys: list[Any], items: list[Any]) -> list[list[Any]]:
    """The items sharing a key with another item, grouped by key in first-seen order.

    Keys are necessary for equality, never sufficient; the usual case (every key distinct)
    costs one set of the keys and no grouping.
    """
    if len(set(keys)) == len(keys):
        return []
    by_key: dict[Any, list[Any]] = defaultdict(list)
    for key, item in zip(keys, items, strict=True):
        by_key[key].append(item)
    return [members for members in by_key.values() if len(members) > 1]


def _partition(members: Sequence[Any], same: Any) -> list[list[Any]]:
    """Members grouped by the equivalence `same`, in first-seen order."""
    groups: list[list[Any]] = []
    for member in members:
        for group in groups:
            if same(group[0], member):
                group.append(member)
                break
        else:
            groups.append([member])
    return groups


def _same_prompt_groups(calls: list[TokenEntry]) -> list[list[int]]:
    """Positions of calls sharing one prompt (two or more), deepest prompts first.

    Calls are in call order, shortest prompt first, and one prompt has one length: only runs
    of calls with equal prompt lengths are read, and distinct lengths (the usual case) read
    no token.
    """
    lengths = [len(c.prompt_token_ids) for c in calls]
    if len(set(lengths)) == len(lengths):
        return []
    groups: list[list[int]] = []
    start = 0
    for end in range(1, len(calls) + 1):
        if end < len(calls) and lengths[end] == lengths[start]:
            continue
        if end - start > 1:
            groups += _identical_prompts(calls, list(range(start, end)))
        start = end
    groups.sort(key=lambda g: (-lengths[g[0]], g[0]))
    return groups


def _identical_prompts(calls: list[TokenEntry], members: list[int]) -> list[list[int]]:
    """The groups (two or more, in call order) of `members`, calls of one prompt length, whose
    prompts are identical; more than two members are first told apart by their prefix keys."""
    same = lambda i, j: calls[i].prompt_token_ids == calls[j].prompt_token_ids  # noqa: E731
    if len(members) == 2:
        return [members] if same(*members) else []
    length = len(calls[members[0]].prompt_token_ids)
    keys = [prefix_key(calls[i].prompt_token_ids, length) if length else (0,) for i in members]
    clashes = _clashes(keys, members)
    return [group for clash in clashes for group in _partition(clash, same) if len(group) > 1]


def _named(own_of: Callable[[int], tuple], i: int, group: list[int], reading: tuple) -> bool:
    """Whether the scored transcript holds this try's own items, and no other try's."""
    own = own_of(i)
    if not own or not _runs_in(own, reading):
        return False
    return all(own_of(j) != own for j in group if j != i)


def _tied(own_of: Callable[[int], tuple], group: list[int], reading: tuple) -> bool:
    """Whether two tries said the same thing and the scored transcript holds it.

    Then either may be the one the transcript shows, and a later call extending one (a
    summary of the kept try, or a judge of a rejected one) says nothing about which.
    """
    seen: set[tuple] = set()
    for i in group:
        own = own_of(i)
        if own and own in seen and _runs_in(own, reading):
            return True
        seen.add(own)
    return False


def _runs_in(part: tuple, whole: tuple) -> bool:
    """Whether `part` occurs in `whole` as a contiguous run."""
    n = len(part)
    return any(whole[k : k + n] == part for k in range(len(whole) - n + 1))


def _holds(tokens: list[int], needle: bytes) -> bool:
    """Whether `tokens` holds the int64 token bytes `needle` at a token boundary."""
    hay = array("q", tokens).tobytes()
    at = hay.find(needle)
    while at >= 0:
        if at % 8 == 0:
            return True
        at = hay.find(needle, at + 1)
    return False
