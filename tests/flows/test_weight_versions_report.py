"""Weight versions reach the ledger, summary and status of a real run, local disk and S3.

The calls are captured with their versions (one generation across a weight update, one
call without any), finalized by the real flow, and the ledger, summary and status must show
exactly the captured versions. A record that arrives carrying token ids of its own gets no
versions (no capture vouches for them) and its ledger line is as before.
"""

from __future__ import annotations

from typing import Any

import pytest

from capture_core.operator.run_status import run_status
from capture_core.records import TokenEntry
from capture_core.run.run_layout import RunLayout, read_ledger
from capture_core.storage import open_byte_store
from capture_core.store import TokenCaptureStore
from capture_core.testing.synthetic import RolloutShape, rollout_record, synthetic_rollout
from tests.support.pipeline_helpers import batch_entries, finalize_locations, write_rollouts

pytestmark = pytest.mark.usefixtures("prefect_api")


def carrying(task: int, index: int, versions: list[int] | None) -> dict[str, Any]:
    """A record with its own generated tokens, sampled by `versions` (one per token) or by
    weights nobody recorded (`None`: three tokens of unknown version)."""
    record = rollout_record(task, index)
    count = 3 if versions is None else len(versions)
    record["response"]["output"][0].update(
        prompt_token_ids=[1, 2],
        generation_token_ids=list(range(10, 10 + count)),
        generation_log_probs=[-0.5] * count,
    )
    tokens: dict[str, int] = {}
    for v in versions or []:
        tokens[str(v)] = tokens.get(str(v), 0) + 1
    record["token_provenance"] = {
        "schema_version": 1,
        "calls": {f"c{task}-{index}": None},
        "chain": [f"c{task}-{index}"],
        "versions": {
            "min": min(versions) if versions else None,
            "max": max(versions) if versions else None,
            "tokens": tokens,
            "unknown_tokens": 0 if versions else count,
        },
    }
    return record


def captured(store: TokenCaptureStore, task: int, index: int, versions: list[int] | None) -> dict:
    """One call of `task`/`index` captured with `versions` (one per generated token) or,
    with `None`, three tokens of weights nobody recorded; its finished record."""
    count = 3 if versions is None else len(versions)
    shape = RolloutShape(turns=1, generated_tokens=count)
    (entry,) = synthetic_rollout(f"{task}-{index}", shape)
    if versions is not None:
        provenance: dict[str, Any] = {"start_weight_version": versions[0]}
        provenance["end_weight_version"] = versions[-1]
        if len(set(versions)) > 1:
            provenance["generation_weight_versions"] = versions
        entry = TokenEntry.model_validate({**entry.wire_dump(), **provenance})
    store.put_now(entry)
    return rollout_record(task, index)


def test_the_ledger_summary_and_status_show_the_versions_delivered(locations) -> None:
    options = locations["options"]
    store = TokenCaptureStore(locations["store"], options)
    records = [
        captured(store, 1, 0, [4, 4, 5]),
        captured(store, 1, 1, [6, 6]),
        captured(store, 2, 0, None),
    ]
    write_rollouts(locations["rollouts"], records, options)
    summary = finalize_locations(locations, "versions", batch_size=2)
    assert summary.ok and summary.handed_off == 3 and summary.masked == 0
    tally = summary.weight_versions
    assert tally is not None
    assert (tally.min, tally.max, tally.spanning, tally.rollouts) == (4, 6, 1, 3)
    assert tally.tokens == {"4": 2, "5": 1, "6": 2} and tally.unknown_tokens == 3
    dest = open_byte_store(locations["dest"], options)
    ledger = read_ledger(dest, "versions")
    assert ledger is not None
    assert [line.weight_versions for line in ledger] == [[4, 5], [6, 6], None]
    status = run_status(RunLayout(dest, "versions"), locations["dest"])
    assert status is not None and status.summary is not None
    assert status.summary.weight_versions == tally


def test_a_run_without_provenance_keys_has_unchanged_ledger_lines(locations) -> None:
    options = locations["options"]
    store = TokenCaptureStore(locations["store"], options)
    for entry in batch_entries("0-99"):  # a capture store holding none of these rollouts
        store.put_now(entry)
    records = [carrying(3, 0, [1])]
    del records[0]["token_provenance"]
    write_rollouts(locations["rollouts"], records, options)
    summary = finalize_locations(locations, "plain", batch_size=2)
    assert summary.ok and summary.weight_versions is None
    raw = open_byte_store(locations["dest"], options).get("plain/ledger.jsonl") or b""
    assert b"weight_version" not in raw
