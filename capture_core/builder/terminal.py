"""The terminal call's vocabulary: what a record says about it, the verdict and its metric.

A finished record may name its scored call (`TerminalInputs`: an explicit call id, a
declared response id, the scored response); `terminal_witnesses` weighs that evidence into
a `TerminalAttribution`. A build reports the verdict as its `terminal_attribution` metric
(`TerminalMetric`), and ledgers and reports read it back here: why an unattributed verdict
masks (`blocking_reason`) and which abstentions it holds (`abstention_reasons`).
This module imports nothing from the project.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

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
            explicit_call_id=nonempty_str(record.get(TERMINAL_CALL_KEY)),
            declared_response_id=nonempty_str(record.get(DECLARED_RESPONSE_KEY)),
            response=response if isinstance(response, Mapping) else None,
        )


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


NOT_ATTRIBUTED = TerminalAttribution()


def nonempty_str(value: Any) -> str | None:
    """The value when it is a non-empty string, else `None`: anything else testifies to nothing."""
    return value if isinstance(value, str) and value else None


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
