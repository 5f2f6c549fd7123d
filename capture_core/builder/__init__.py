"""Building trajectories from a frozen snapshot: parent links, chains, projection, terminal.

Everything here is pure: it reads a snapshot's entries and returns typed results, no I/O.
It imports only capture_core's vocabulary (`records`, `ids`, `protocols`, `errors`).
This package exports NeMo Gym's builder API (`run_builder`, `BuildOutput`, `Chain`...).
"""

from capture_core.builder.chain import BuildNotes, BuildOutput, Chain, ChainLink
from capture_core.builder.projection import (
    TOKEN_ONLY_ITEM,
    assert_prefix_contiguity,
    project_chain_to_output_items,
    project_main_chain_response,
)
from capture_core.builder.registry import BUILDERS, per_request, prefix_merging, run_builder

__all__ = [
    "BUILDERS",
    "TOKEN_ONLY_ITEM",
    "BuildNotes",
    "BuildOutput",
    "Chain",
    "ChainLink",
    "assert_prefix_contiguity",
    "per_request",
    "prefix_merging",
    "project_chain_to_output_items",
    "project_main_chain_response",
    "run_builder",
]
