"""Weight-version provenance through the stores: stored compactly, sealed, read back exactly.

tokcap's store keeps per-token versions as runs under short names; the seal covers them, so an
edited version masks the rollout like an edited token. NeMo Gym's file store writes them under
their names as plain JSON. Both read back exactly what was put. With one version per call the
stored bytes of a seeded workload grow by at most 2%.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from capture_core.consumer import trajectories_from_source
from capture_core.errors import UnreadableCaptureError
from capture_core.records import TokenEntry
from capture_core.records.provenance import PROVENANCE_FIELDS, generated_versions
from capture_core.store import TokenCaptureStore
from capture_core.store.capture_layout import call_key
from capture_core.store.nemo_gym_store import NemoGymFileStore
from capture_core.testing.agent_captures import agent_rollouts
from tests.store.test_compact import stored_bytes
from tests.store.test_store_attacks import edit_one_digit, replace_object
from tests.support.backends import PROCESS_SHARED_BACKENDS, store_location
from tests.support.reliability_figures import record_case


def call(call_id: str, prompt: list[int], gen: list[int], **provenance: Any) -> TokenEntry:
    return TokenEntry(
        rollout_id="r1",
        model_call_id=call_id,
        prompt_token_ids=prompt,
        generation_token_ids=gen,
        generation_log_probs=[-0.5 - i / 16 for i in range(len(gen))],
        output_items=[{"type": "message", "role": "assistant", "content": []}],
        **provenance,
    )


def across_an_update() -> list[TokenEntry]:
    """Three calls: before an update, one whose generation spans updates 3 -> 4 -> 5, after."""
    first = call("turn-0", [11, 12, 13], [21, 22], start_weight_version=3, end_weight_version=3)
    spanning = call(
        "turn-1",
        [11, 12, 13, 21, 22, 31],
        [41, 42, 43, 44, 45, 46, 47],
        start_weight_version=3,
        end_weight_version=5,
        generation_weight_versions=[3, 3, 4, 4, 4, 5, 5],
        weight_version_label="step-5",
        replica="replica-2",
    )
    last = call(
        "turn-2", [11, 12, 13, 21, 22, 31, 41, 42, 43, 44, 45, 46, 47, 51], [61], replica="r-0"
    )
    return [first, spanning, last]


@pytest.fixture(params=PROCESS_SHARED_BACKENDS)
def root(request: pytest.FixtureRequest, tmp_path) -> tuple[str, dict[str, object]]:
    return store_location(request.param, request, tmp_path)


def by_call(entries: Any) -> list[TokenEntry]:
    return sorted(entries, key=lambda e: e.model_call_id)


def test_per_token_versions_across_an_update_survive_put_and_freeze_exactly(root) -> None:
    url, options = root
    calls = across_an_update()
    for entry in calls:
        TokenCaptureStore(url, options).put_now(entry)
    snapshot = TokenCaptureStore(url, options).freeze_now("r1")
    assert not snapshot.incomplete
    assert by_call(snapshot.entries) == calls
    read = by_call(snapshot.entries)
    assert read[1].generation_weight_versions == [3, 3, 4, 4, 4, 5, 5]
    assert [generated_versions(e) for e in read] == [[3, 3], [3, 3, 4, 4, 4, 5, 5], None]
    assert [e.wire_dump() for e in read] == [e.wire_dump() for e in calls]


def test_stored_provenance_is_runs_under_short_names(tmp_path) -> None:
    store = TokenCaptureStore(tmp_path / "store")
    for entry in across_an_update():
        store.put_now(entry)
    stored = orjson.loads(store.byte_store.get(f"r1/e/{call_key('turn-1')}") or b"")
    assert stored["ws"] == 3 and stored["we"] == 5
    assert stored["wv"] == [[3, 2], [4, 3], [5, 2]]
    assert stored["wl"] == "step-5" and stored["rp"] == "replica-2"
    assert "e" not in stored, "no provenance among the extras"
    plain = orjson.loads(store.byte_store.get(f"r1/e/{call_key('turn-2')}") or b"")
    assert {"ws", "we", "wv", "wl"}.isdisjoint(plain) and plain["rp"] == "r-0"


def test_nemo_gym_file_store_writes_provenance_as_plain_json_under_its_names(tmp_path) -> None:
    store = NemoGymFileStore(tmp_path)
    calls = across_an_update()
    for entry in calls:
        store.put_now(entry)
    lines = (tmp_path / "r1.tokens.jsonl").read_bytes().splitlines()
    spanning = orjson.loads(lines[1])
    assert spanning["generation_weight_versions"] == [3, 3, 4, 4, 4, 5, 5]
    assert {name: spanning[name] for name in PROVENANCE_FIELDS} == {
        "start_weight_version": 3,
        "end_weight_version": 5,
        "generation_weight_versions": [3, 3, 4, 4, 4, 5, 5],
        "weight_version_label": "step-5",
        "replica": "replica-2",
    }
    assert lines[1] == orjson.dumps(calls[1].wire_dump(), option=orjson.OPT_SORT_KEYS)
    assert "start_weight_version" not in orjson.loads(lines[2])
    snapshot = store.freeze_now("r1")
    assert not snapshot.incomplete and list(snapshot.entries) == calls


EDITS = [
    ("start version", b'"ws":'),
    ("end version", b'"we":'),
    ("a per-token run's version", b'"wv":[['),
    ("a per-token run's count", b'"wv":[[3,'),
]


@pytest.mark.integrity
@pytest.mark.parametrize(("what", "field"), EDITS, ids=[e[0] for e in EDITS])
def test_an_edited_stored_version_masks_the_rollout_like_an_edited_token(
    root, what: str, field: bytes
) -> None:
    url, options = root
    store = TokenCaptureStore(url, options)
    for entry in across_an_update():
        store.put_now(entry)
    key = f"r1/e/{call_key('turn-1')}"
    original = store.byte_store.get(key) or b""
    edited = edit_one_digit(original, field)
    assert edited != original and len(edited) == len(original)
    replace_object(store, key, edited)
    with pytest.raises(UnreadableCaptureError, match=f"object {key}.*fail their digest check"):
        TokenCaptureStore(url, options).freeze_now("r1")
    built = asyncio.run(trajectories_from_source("r1", TokenCaptureStore(url, options)))
    assert built["mask_sample"] and "digest check" in built["error"]
    assert built["rebuilt_response"] is None
    record_case(f"one-digit edit: stored weight version ({what})", wrong_tokens_delivered=0)


def one_version_per_call(entries: list[TokenEntry], step: int, fields: tuple) -> list[TokenEntry]:
    """The entries with one version per call in `fields`, the weights updated every 3 calls."""
    return [
        entry.model_copy(update=dict.fromkeys(fields, 1_000 + (step + i) // 3))
        for i, entry in enumerate(entries)
    ]


@pytest.mark.parametrize(
    "fields",
    [("end_weight_version",), ("start_weight_version", "end_weight_version")],
    ids=["stamped end", "start and end"],
)
def test_one_version_per_call_grows_stored_bytes_by_at_most_two_percent(
    tmp_path, fields: tuple
) -> None:
    """Bytes, not time: the seeded workload stores the same bytes on every machine."""
    rollouts = agent_rollouts(48, seed=5)
    without = TokenCaptureStore(tmp_path / "without")
    with_versions = TokenCaptureStore(tmp_path / "with")
    for index, rollout in enumerate(rollouts):
        for entry in rollout.entries:
            without.put_now(entry)
        for entry in one_version_per_call(rollout.entries, index, fields):
            with_versions.put_now(entry)
    ratio = stored_bytes(with_versions) / stored_bytes(without)
    assert 1.0 < ratio <= 1.02, ratio
    read = with_versions.freeze_now(rollouts[7].rollout_id).entries
    assert all(entry.end_weight_version is not None for entry in read)
