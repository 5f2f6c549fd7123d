"""Plain words for why rollouts were masked and for why terminal witnesses abstained.

A record's `error` and a ledger's `mask_reason` keep their exact text: NeMo Gym's tools,
older ledgers and tests read it. Reports, the CLI and the UI show these words beside it.
Each kind of reason has a section of the shipped page `tokcap docs mask-reasons`, named by
its anchor.
This module does not import Prefect.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from capture_core.builder.terminal import WITNESSES

DOCS = "tokcap docs mask-reasons"
"""The page that lists every kind of mask reason, what it means and what to do."""

NAME_CALL = (
    "have the harness name the scored call in the record (_ng_terminal_model_call_id or "
    "terminal_response_id) and finalize the file under a new run id"
)
COLLECT_AGAIN = "collect the rollout again and finalize the new file under a new run id"


RETRIGGER = "then complete the run with tokcap retrigger (its batches were not handed off)"


@dataclass(frozen=True)
class ReasonKind:
    """One kind of mask reason: a title, what happened, what to do, and its docs section
    (the section's heading is the title, so its anchor is the title with dashes).

    `infrastructure`: the store or the tokcap reading it is at fault, not the rollout, so
    many rollouts mask alike and fixing the cause delivers them (`run_outcome`).
    """

    title: str
    meaning: str
    action: str
    patterns: tuple[str, ...] = ()
    infrastructure: bool = False

    @property
    def anchor(self) -> str:
        return self.title.replace(" ", "-")

    @property
    def link(self) -> str:
        return f"{DOCS}#{self.anchor}"

    def matches(self, text: str) -> bool:
        return any(re.search(pattern, text) for pattern in self.patterns)

    def line(self) -> str:
        """`title: meaning; action (docs link)`: the one line reports give this kind."""
        return f"{self.title}: {self.meaning}; {self.action} ({self.link})"


VERSION_SKEW = ReasonKind(
    "version skew",
    "the capture was stored by a newer tokcap (or NeMo Gym sink) than the one finalizing, so "
    "this tokcap cannot read it",
    f"upgrade tokcap where runs finalize (the workers, the CLI), {RETRIGGER}",
    (r"schema_version \d+ is newer than this reader supports",),
    infrastructure=True,
)
UNREADABLE_STORE = ReasonKind(
    "unreadable store",
    "the store refused or failed to read the capture (permissions, credentials, a storage "
    "error), whatever the capture holds",
    f"fix the store's permissions or credentials (the reason names the error), {RETRIGGER}",
    (
        r"^local store (cannot|failed to) ",
        r"^storage at \S+ (refused|failed) to ",
        r"^no usable credentials for ",
    ),
    infrastructure=True,
)

KINDS: tuple[ReasonKind, ...] = (
    VERSION_SKEW,
    UNREADABLE_STORE,
    ReasonKind(
        "lost call",
        "a model call began but its tokens were never captured, or were captured twice "
        "differently or damaged",
        COLLECT_AGAIN,
        (r"^capture incomplete", r"^recorded parents missing", r"^writer lineage contradicted"),
    ),
    ReasonKind(
        "unresolved retry",
        "a call was retried and nothing says which try was scored",
        NAME_CALL + "; capturing again cannot resolve it",
        (r"^unresolved retries", r"^unsettled retry groups"),
    ),
    ReasonKind(
        "several conversations",
        "the calls form more than one conversation (several first calls, or branches such as "
        "sub-agents) and nothing says which one was scored",
        NAME_CALL,
        (r"^(\d+|None) roots and (\d+|None) chains",),
    ),
    ReasonKind(
        "ambiguous parent",
        "two calls produced the same tokens and a later call continues them, so which "
        "conversation it belongs to is unknown",
        NAME_CALL,
        (r"extend several calls with one token sequence",),
    ),
    ReasonKind(
        "scored call not found",
        "the record names the call it scored but the capture has no such call, or the "
        "witnesses name different calls",
        "check that _ng_terminal_model_call_id or terminal_response_id names a call of this "
        "attempt's capture (the id with its -aN suffix)",
        (r"^terminal not attributable",),
    ),
    ReasonKind(
        "scored call not deliverable",
        "the scored call was found but its conversation crosses an ambiguous or lost call, "
        "or it generated no tokens",
        "inspect the capture, kept as evidence; the ledger's mask_reason names the call",
        (r"^terminal chain",),
    ),
    ReasonKind(
        "capture already retired",
        "an earlier run handed this rollout off and retired its capture",
        "run tokcap clear before dispatching a new attempt under the same rollout id",
        (r"already retired",),
    ),
    ReasonKind(
        "nothing captured",
        "no model call was captured under this rollout id",
        "check that the model servers capture tokens into this store and that the record's "
        "ids match the capture's",
        (r"^capture contains no token records",),
    ),
    ReasonKind(
        "no usable rollout id",
        "the record names no rollout, or a malformed one, so its capture cannot be found",
        "give each record _ng_rollout_id, or _ng_task_index and _ng_rollout_index",
        (r"^no capture key", r"^malformed rollout id"),
    ),
    ReasonKind(
        "inconsistent token arrays",
        "a captured call's token ids and log probs do not fit together",
        "fix how the model server reports token ids and log probs, then collect again",
        (r"generation_log_probs", r"token arrays", r"non-finite", r"log prob"),
    ),
    ReasonKind(
        "no continuous conversation",
        "the calls cannot be rebuilt into one continuous token sequence",
        "inspect the capture, kept as evidence, and report it with the ledger line",
        (r"no safe trainable chain", r"contigu", r"no generated tokens"),
    ),
    ReasonKind(
        "unreadable capture",
        "the capture could not be read or frozen",
        "check the store (the reason names the error), then finalize again",
        (r"^unreadable snapshot", r"^freeze failed"),
    ),
    ReasonKind(
        "builder cannot deliver one response",
        "the per_request builder makes one trajectory per call",
        "finalize with --builder prefix_merging",
        (r"^per_request builds",),
    ),
)
OTHER = ReasonKind(
    "other reason",
    "the build refused the rollout for the reason the ledger gives",
    "read the rollout's mask_reason in the ledger",
)


def _plain(text: str) -> str:
    """The reason without a leading exception name or rollout id."""
    name, sep, rest = text.strip().partition(": ")
    if sep and rest and name.isidentifier() and name.endswith("Error"):
        text = rest
    return re.sub(r"^rollout \S+ ", "", text.strip())


def reason_kind(reason: str | None) -> ReasonKind:
    """The kind of a mask reason, or of a reason category (an infrastructure kind's category
    is its title); `OTHER` when none matches."""
    text = _plain(reason or "")
    return next((kind for kind in KINDS if text == kind.title or kind.matches(text)), OTHER)


def infrastructure_kind(reason: str | None) -> ReasonKind | None:
    """The infrastructure kind of a mask reason (version skew, an unreadable store), else
    `None`: such reasons are summed under their title, whatever rollout or object they name."""
    kind = reason_kind(reason)
    return kind if kind.infrastructure else None


def infrastructure_counts(reasons: Mapping[str, int]) -> list[tuple[ReasonKind, int]]:
    """The infrastructure kinds among counts by reason category, the largest first."""
    return [(kind, count) for kind, count in kinds_of(reasons) if kind.infrastructure]


def kinds_of(reasons: Mapping[str, int]) -> list[tuple[ReasonKind, int]]:
    """Counts by kind of counts by reason category, the largest first."""
    totals: dict[ReasonKind, int] = {}
    for reason, count in reasons.items():
        kind = reason_kind(reason)
        totals[kind] = totals.get(kind, 0) + count
    return sorted(totals.items(), key=lambda pair: (-pair[1], pair[0].title))


def kind_counts(reasons: Mapping[str, int]) -> str:
    """`lost call (2), unresolved retry (1)`: a reason tally in plain titles."""
    return ", ".join(f"{kind.title} ({count})" for kind, count in kinds_of(reasons))


ABSTENTIONS = {
    "explicit_terminal_not_captured": "the record's _ng_terminal_model_call_id names no "
    "captured call",
    "declared_terminal_not_captured": "the record's terminal_response_id matches no captured call",
    "declared_ambiguous": "terminal_response_id matches several different calls",
    "response_id_no_match": "the scored response's id matches no captured call (usual when "
    "the harness sets its own response ids)",
    "response_id_ambiguous": "the scored response's id matches several different calls",
    "response_has_no_id": "the scored response carries no id",
    "final_turn_without_content": "the scored response ends in a turn with no text to compare",
    "no_content_match": "the scored response's text matches no captured call",
    "content_ambiguous": "the scored response's text matches several different calls",
    "contradicts_strict_chain": "the scored response ends before the conversation's last call",
    "witness_disagreement": "the witnesses name different calls",
}


EVIDENCE = (
    "the record's _ng_terminal_model_call_id",
    "the record's terminal_response_id",
    "the scored response's id",
    "the scored response's text",
)
"""What each of the builder's terminal `WITNESSES` reads, in the same order."""
_EVIDENCE_OF = dict(zip(WITNESSES, EVIDENCE, strict=True))


def witness_words(method: str) -> str:
    """Which witness named the scored call (a terminal method), in plain words."""
    return _EVIDENCE_OF.get(method, method)


def abstention_words(code: str) -> str:
    """What a terminal witness's abstention code means, in plain words."""
    if code.startswith("attribution_error"):
        return "a witness could not read the record or response"
    return ABSTENTIONS.get(code, code.replace("_", " "))


def anchors(kinds: Iterable[ReasonKind] = (*KINDS, OTHER)) -> list[str]:
    """The docs anchors every kind links to."""
    return [kind.anchor for kind in kinds]
