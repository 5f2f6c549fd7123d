"""The `token_provenance` key a build delivers: exactly the captured version of every token.

Builds run in memory (`assemble`), on synthetic rollouts whose calls carry versions, one of
them across a weight update in the middle of its generation, one with none.
"""

from __future__ import annotations

import pytest

from capture_core.builder.snapshot import assemble, build_from_snapshot
from capture_core.builder.token_provenance import SCHEMA_VERSION, call_versions
from capture_core.builder.trace_envelope import ALL_TRACES, MAIN_CHAIN, check_envelope
from capture_core.protocols import TokenCaptureSnapshot
from capture_core.records import TokenEntry
from capture_core.records.provenance import call_provenance, expand_runs, generated_versions
from capture_core.testing.synthetic import RolloutShape, synthetic_rollout
from tests.support.weight_versions import SPANNING_CALL, UNVERSIONED_CALL, versioned_rollout


def built_key(entries: list[TokenEntry], delivery: str) -> dict:
    built = assemble("7-0", entries, "prefix_merging", "", delivery=delivery)
    assert not built.mask_sample, built.error
    assert built.token_provenance is not None
    return built.token_provenance


def delivered_versions(key: dict, entries: list[TokenEntry]) -> dict[str, list[int] | None]:
    """Each delivered call's per-token versions as the key gives them."""
    by_id = {e.model_call_id: e for e in entries}
    return {
        call_id: call_versions(call, len(by_id[call_id].generation_token_ids))
        for call_id, call in key["calls"].items()
    }


@pytest.mark.parametrize("seed", range(6))
def test_a_main_chain_delivers_the_captured_version_of_every_token(seed: int) -> None:
    shape = RolloutShape(turns=3 + seed, generated_tokens=8 + 5 * seed)
    entries = versioned_rollout("7-0", base=10 * seed, shape=shape, seed=seed)
    key = built_key(entries, MAIN_CHAIN)
    assert key["schema_version"] == SCHEMA_VERSION and "traces" not in key
    assert key["chain"] == [e.model_call_id for e in entries]
    assert delivered_versions(key, entries) == {
        e.model_call_id: generated_versions(e) for e in entries
    }
    spanning = key["calls"][entries[SPANNING_CALL].model_call_id]
    assert len(spanning["generation_weight_versions"]) == 2, "one run per version"
    assert key["calls"][entries[UNVERSIONED_CALL].model_call_id] is None
    counts: dict[str, int] = {}
    for entry in entries:
        for version in generated_versions(entry) or []:
            counts[str(version)] = counts.get(str(version), 0) + 1
    unknown = len(entries[UNVERSIONED_CALL].generation_token_ids)
    assert key["versions"]["tokens"] == dict(sorted(counts.items(), key=lambda kv: int(kv[0])))
    assert key["versions"]["unknown_tokens"] == unknown
    assert (key["versions"]["min"], key["versions"]["max"]) == (
        min(map(int, counts)),
        max(map(int, counts)),
    )


def test_all_traces_gives_every_span_its_calls_versions_as_runs() -> None:
    entries = versioned_rollout("7-0", base=4, shape=RolloutShape(turns=5, generated_tokens=30))
    built = assemble("7-0", entries, "prefix_merging", "", delivery=ALL_TRACES)
    key, envelope = built.token_provenance, built.training_traces
    assert key is not None and envelope is not None and "chain" not in key
    by_id = {e.model_call_id: e for e in entries}
    assert set(key["traces"]) == {t["trace_id"] for t in envelope["traces"]}
    for trace in envelope["traces"]:
        given = key["traces"][trace["trace_id"]]
        spans = [by_id[s["model_call_id"]] for s in trace["sampled_spans"]]
        assert [expand_runs(runs) for runs in given["spans"]] == [
            generated_versions(e) or [] for e in spans
        ]
        known = [v for e in spans for v in generated_versions(e) or []]
        assert (given["min_weight_version"], given["max_weight_version"]) == (
            min(known),
            max(known),
        )
    assert key["calls"] == {e.model_call_id: call_provenance(e) for e in entries}
    check_envelope(envelope, "7-0")  # the envelope itself is untouched v1


@pytest.mark.parametrize("delivery", [MAIN_CHAIN, ALL_TRACES])
def test_a_rollout_without_provenance_says_so_and_invents_nothing(delivery: str) -> None:
    entries = synthetic_rollout("7-0", RolloutShape(turns=3))
    key = built_key(entries, delivery)
    assert set(key["calls"]) == {e.model_call_id for e in entries}
    assert all(value is None for value in key["calls"].values())
    generated = sum(len(e.generation_token_ids) for e in entries)
    assert key["versions"] == {"min": None, "max": None, "tokens": {}, "unknown_tokens": generated}
    if delivery == ALL_TRACES:
        for trace in key["traces"].values():
            assert trace["min_weight_version"] is None and trace["max_weight_version"] is None
            assert all(runs == [] for runs in trace["spans"])


def test_a_masked_main_chain_carries_no_provenance() -> None:
    shape = RolloutShape(turns=3, auxiliary_call=True)  # two roots: masked
    built = assemble("7-0", versioned_rollout("7-0", base=1, shape=shape), "prefix_merging", "")
    assert built.mask_sample and built.token_provenance is None


@pytest.mark.parametrize("delivery", [MAIN_CHAIN, ALL_TRACES])
def test_an_incomplete_capture_carries_no_provenance(delivery: str) -> None:
    entries = tuple(versioned_rollout("7-0", base=1))
    whole = TokenCaptureSnapshot("7-0", entries, False, "s", 1)
    assert build_from_snapshot(whole, "prefix_merging", "", delivery=delivery).token_provenance
    lost = TokenCaptureSnapshot("7-0", entries, True, "s", 1)
    built = build_from_snapshot(lost, "prefix_merging", "", delivery=delivery)
    assert built.mask_sample and built.token_provenance is None


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"start_weight_version": 3},
        {"end_weight_version": 5},
        {"start_weight_version": 3, "end_weight_version": 5},
        {"start_weight_version": 3, "end_weight_version": 5, "replica": "r"},
        {"generation_weight_versions": [3, 3, 4, 5], "end_weight_version": 5},
        {"weight_version_label": "v-abc"},
    ],
)
def test_the_key_reads_back_to_the_rule_of_generated_versions(fields: dict) -> None:
    (entry,) = synthetic_rollout("7-0", RolloutShape(turns=1, generated_tokens=4))
    stamped = TokenEntry.model_validate({**entry.model_dump(), **fields})
    generated = len(stamped.generation_token_ids)
    assert call_versions(call_provenance(stamped), generated) == generated_versions(stamped)
