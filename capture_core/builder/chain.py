"""What a builder returns: chains of calls, the quarantined call ids and the notes of a build.

These are NeMo Gym's builder types (`BuildOutput`, `BuildNotes`, `Chain`, `ChainLink`), with
its field names; `capture_core.builder` re-exports them.
This module imports only `records`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from capture_core.records import TokenEntry


@dataclass
class ChainLink:
    """One call in a chain and the prompt tokens added since the previous link (loss mask 0).

    The first link's `interstitial` is empty: its prompt is the chain's `root_prompt`.
    """

    entry: TokenEntry
    interstitial: list[int]


@dataclass
class Chain:
    """A path of calls from a root to a leaf; `chain_id` is `main`, `branch-<n>` or `req-<n>`."""

    chain_id: str
    links: list[ChainLink] = field(default_factory=list)
    root_prompt: list[int] = field(default_factory=list)

    @property
    def generated_tokens(self) -> int:
        return sum(len(link.entry.generation_token_ids) for link in self.links)

    def validate(self) -> None:
        """Raise `ValueError` unless every call has one log prob per generated token."""
        for link in self.links:
            entry = link.entry
            if len(entry.generation_token_ids) != len(entry.generation_log_probs):
                raise ValueError(
                    f"call {entry.model_call_id!r} has {len(entry.generation_token_ids)} tokens "
                    f"but {len(entry.generation_log_probs)} log probs; the chain is invalid"
                )


@dataclass
class BuildNotes:
    """What the builder saw; typed so a renamed metric fails loudly instead of reading as zero.

    NeMo Gym's fields come first, in its order and with its defaults (only `builder` is
    required). `unresolved_retries` and `empty_generation_calls` are call ids.
    `contradicted_calls` are the calls whose writer-recorded lineage the tokens contradict
    (quarantined: evidence of a lost or misrecorded call, which the strict policy must not
    drop silently). `lost_parents` maps each call whose recorded parent is missing from the
    snapshot to that parent: a lost call, on the delivered path or not.
    `ambiguous_calls` are the calls quarantined because several calls with one token sequence
    could be their parent: a strict build never delivers a chain without them.
    """

    builder: str
    roots: int = 0
    chains: int = 0
    generated_tokens_captured: int = 0
    generated_tokens_delivered: int = 0
    delivered_fraction: float = 0.0
    unresolved_retries: list[str] = field(default_factory=list)
    empty_generation_calls: list[str] = field(default_factory=list)
    terminal_chain: str = ""
    excluded_calls: list[str] = field(default_factory=list)
    contradicted_calls: list[str] = field(default_factory=list)
    lost_parents: dict[str, str] = field(default_factory=dict)
    ambiguous_calls: list[str] = field(default_factory=list)


@dataclass
class BuildOutput:
    """Chains of one build (main first), the quarantined call ids, and the notes."""

    chains: list[Chain]
    quarantined: list[str] = field(default_factory=list)
    notes: BuildNotes = field(default_factory=lambda: BuildNotes(builder=""))

    @property
    def main_chain(self) -> Chain:
        """The chain named `main`, else the first; the build must have a chain."""
        return next((c for c in self.chains if c.chain_id == "main"), self.chains[0])
