"""Weight versions stamped by the gateway, and a captured session finalized as a harness's
rollout record: unmasked, with exactly the engine's ids.
"""

from __future__ import annotations

import asyncio
import copy
import os
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from capture_core.delivery import finalize_rollout_token_capture
from capture_core.store import TokenCaptureStore
from tests.support.fake_engine import FakeEngine
from tests.support.gateway_process import GatewayProcess, post
from tests.support.servers import free_port, wait_until


@pytest.fixture(scope="module")
def engine() -> Iterator[FakeEngine]:
    fake = FakeEngine(free_port()).start()
    yield fake
    fake.stop()


@pytest.fixture(autouse=True)
def _healthy_engine(engine: FakeEngine) -> None:
    engine.set()


def publish(path: str, version: int) -> None:
    """Write the trainer's version as a trainer does: a temporary file renamed over it."""
    with open(path + ".tmp", "w") as handle:
        handle.write(f"{version}\n")
    os.replace(path + ".tmp", path)


@pytest.fixture(scope="module")
def version_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("trainer") / "weight_version")
    publish(path, 3)
    return path


@pytest.fixture(scope="module")
def stamped(
    engine: FakeEngine, version_file: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[GatewayProcess, str]]:
    root = str(tmp_path_factory.mktemp("stamped"))
    with GatewayProcess(engine.url, root, "--weight-version-source", version_file) as running:
        yield running, root


@pytest.fixture(scope="module")
def labelled(
    engine: FakeEngine, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[GatewayProcess, str]]:
    root = str(tmp_path_factory.mktemp("labelled"))
    with GatewayProcess(engine.url, root, "--engine-labels-are-versions") as running:
        yield running, root


def only_entry(root: str, rollout_id: str) -> Any:
    store = TokenCaptureStore(root)
    (entry,) = store.read_entries(rollout_id)
    store.close_now()
    return entry


def test_start_is_read_at_admission_and_end_at_completion(
    stamped: tuple[GatewayProcess, str], engine: FakeEngine, version_file: str
) -> None:
    gateway, root = stamped
    rollout = f"v-{uuid.uuid4().hex[:8]}"
    engine.set(delay=1.0)
    publish(version_file, 3)
    answers: list[Any] = []
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    call = threading.Thread(
        target=lambda: answers.append(post(gateway.session(rollout) + "/chat/completions", body))
    )
    call.start()
    wait_until(lambda: engine.seen()["requests"], 30, "the engine to get the call")
    publish(version_file, 4)  # the trainer updates its weights while the call runs
    call.join(timeout=60)
    assert answers and answers[0].status_code == 200
    entry = only_entry(root, rollout)
    assert (entry.start_weight_version, entry.end_weight_version) == (3, 4)
    assert entry.replica == engine.url  # --replica defaults to the engine URL


def test_engine_spans_are_a_label_unless_the_operator_says_they_are_versions(
    stamped: tuple[GatewayProcess, str],
    labelled: tuple[GatewayProcess, str],
    engine: FakeEngine,
) -> None:
    engine.set(versions=["7", "8"])
    body = {"token_ids": [11, 12, 13], "sampling_params": {"max_tokens": 8}}
    for gateway, root in (stamped, labelled):
        rollout = f"g-{uuid.uuid4().hex[:8]}"
        answer = post(gateway.session(rollout).removesuffix("/v1") + "/inference/v1/generate", body)
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["logprobs"] is None  # not asked for: not given
        entry = only_entry(root, rollout)
        assert entry.prompt_token_ids == [11, 12, 13]
        assert entry.generation_token_ids == answer.json()["choices"][0]["token_ids"]
        half = len(entry.generation_token_ids) // 2
        if gateway is labelled[0]:
            assert entry.generation_weight_versions == [7] * half + [8] * (
                len(entry.generation_token_ids) - half
            )
            assert entry.weight_version_label is None
        else:
            assert entry.generation_weight_versions is None
            assert entry.weight_version_label == "7,8"


def test_a_label_that_is_no_version_fails_the_call_when_labels_are_versions(
    labelled: tuple[GatewayProcess, str], engine: FakeEngine
) -> None:
    gateway, root = labelled
    engine.set(versions=["default"])
    rollout = f"g-{uuid.uuid4().hex[:8]}"
    answer = post(
        gateway.session(rollout).removesuffix("/v1") + "/inference/v1/generate", {"token_ids": [11]}
    )
    assert answer.status_code == 502
    assert "'default' is not a trainer version" in answer.json()["error"]["message"]
    snapshot = TokenCaptureStore(root).freeze_now(rollout)
    assert snapshot.incomplete and not snapshot.entries


def test_a_session_through_the_gateway_finalizes_with_exactly_the_engines_ids(
    stamped: tuple[GatewayProcess, str], engine: FakeEngine
) -> None:
    gateway, root = stamped
    rollout = f"f-{uuid.uuid4().hex[:8]}"
    url = gateway.session(rollout) + "/chat/completions"
    messages: list[dict[str, Any]] = [{"role": "user", "content": "start"}]
    turns = []
    for turn in range(3):
        body = {"model": "m", "messages": messages, "logprobs": True, "return_token_ids": True}
        answer = post(url, body).json()  # the client asks for ids: it gets the engine's
        turns.append(answer)
        messages = [*messages, answer["choices"][0]["message"]]
        messages.append({"role": "user", "content": f"turn {turn}"})
    final = copy.deepcopy(turns[-1])
    for choice in final["choices"]:
        for name in ("token_ids", "logprobs"):
            choice.pop(name)
    final.pop("prompt_token_ids")
    record = {"_ng_rollout_id": rollout, "reward": 1.0, "response": final}
    store = TokenCaptureStore(root)
    built = asyncio.run(finalize_rollout_token_capture(record, store))
    assert built is not None and not built["mask_sample"], built
    assert not record.get("mask_sample")
    items = [i for i in record["response"]["output"] if i.get("generation_token_ids")]
    assert [i["generation_token_ids"] for i in items] == [
        t["choices"][0]["token_ids"] for t in turns
    ]
    assert [i["generation_log_probs"] for i in items] == [
        [c["logprob"] for c in t["choices"][0]["logprobs"]["content"]] for t in turns
    ]
    assert items[-1]["prompt_token_ids"] == turns[-1]["prompt_token_ids"]
    assert record["reward"] == 1.0


def test_the_versions_stamped_by_the_gateway_reach_the_delivered_token_provenance(
    stamped: tuple[GatewayProcess, str], version_file: str
) -> None:
    gateway, root = stamped
    publish(version_file, 5)
    rollout = f"p-{uuid.uuid4().hex[:8]}"
    url = gateway.session(rollout) + "/chat/completions"
    messages: list[dict[str, Any]] = [{"role": "user", "content": "start"}]
    answer: dict[str, Any] = {}
    for turn in range(2):
        answer = post(url, {"model": "m", "messages": messages}).json()
        messages = [*messages, answer["choices"][0]["message"], {"role": "user", "content": "n"}]
        publish(version_file, 6 + turn)
    record = {"_ng_rollout_id": rollout, "reward": 0.5, "response": answer}
    store = TokenCaptureStore(root)
    built = asyncio.run(finalize_rollout_token_capture(record, store, delivery="all_traces"))
    assert built is not None and not built["mask_sample"], built
    provenance = record["token_provenance"]
    calls = [provenance["calls"][call] for call in provenance["calls"]]
    assert sorted((c["start_weight_version"], c["end_weight_version"]) for c in calls) == [
        (5, 5),
        (6, 6),
    ]
    assert {c["replica"] for c in calls} == {gateway_engine_url(gateway)}
    assert (provenance["versions"]["min"], provenance["versions"]["max"]) == (5, 6)


def gateway_engine_url(gateway: GatewayProcess) -> str:
    return gateway.command[gateway.command.index("--engine") + 1]
