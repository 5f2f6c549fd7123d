"""A run id claimed at a destination with a stand-in manifest, for tests of what reads runs."""

from __future__ import annotations

from typing import Any

from capture_core.run.run_layout import RunLayout, RunManifest
from capture_core.storage.base import ByteStore

STAND_IN = {
    "rollouts": "/in.jsonl",
    "rollouts_sha256": "0" * 64,
    "store": "/store",
    "builder": "prefix_merging",
    "batch_size": 2,
    "batches": 1,
}
"""The manifest fields a claim needs, for an input no test reads."""


def claimed_layout(dest: ByteStore, run_id: str, **fields: Any) -> RunLayout:
    """The run's layout after claiming `run_id` with the stand-in manifest and `fields`."""
    layout = RunLayout(dest, run_id)
    assert layout.claim(RunManifest(run_id=run_id, **{**STAND_IN, **fields}))
    return layout
