"""The engine's own weight-version spans through `tokcap gateway`: vLLM's
`/inference/v1/generate` answers with `weight_versions` after `/update_weight_version`, and the
gateway stores them as a label, or as per-token versions when the operator says the labels
are trainer versions.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from capture_core.store import TokenCaptureStore
from tests.support.gateway_process import GatewayProcess, post
from tests.support.vllm_engine import VllmEngine


def generate_through(gateway: GatewayProcess, rollout: str) -> dict[str, Any]:
    body = {
        "token_ids": [1, 300, 301, 302],
        "sampling_params": {"max_tokens": 6, "seed": 5, "logprobs": 0},
    }
    url = gateway.session(rollout).removesuffix("/v1") + "/inference/v1/generate"
    answer = post(url, body, timeout=300)
    assert answer.status_code == 200, answer.text
    return answer.json()


def only_entry(root: str, rollout: str) -> Any:
    store = TokenCaptureStore(root)
    (entry,) = store.read_entries(rollout)
    return entry


@pytest.mark.parametrize(
    ("label", "args", "expected"),
    [
        ("v9", (), {"weight_version_label": "v9", "generation_weight_versions": None}),
        ("12", ("--engine-labels-are-versions",), {"generation_weight_versions": [12] * 6}),
    ],
)
def test_the_engines_version_spans_are_stored_with_its_exact_tokens(
    engine: VllmEngine, tmp_path, label: str, args: tuple[str, ...], expected: dict[str, Any]
) -> None:
    assert engine.post("/update_weight_version", {"new_version": label})["success"]
    assert engine.get("/weight_info") == {"weight_version": label}
    root = str(tmp_path / "store")
    rollout = f"gen-{uuid.uuid4().hex[:8]}"
    with GatewayProcess(engine.url, root, *args) as gateway:
        answer = generate_through(gateway, rollout)
    choice = answer["choices"][0]
    assert choice["weight_versions"] == [{"version": label, "start": 0, "end": 6}]
    entry = only_entry(root, rollout)
    assert entry.prompt_token_ids == [1, 300, 301, 302]
    assert entry.generation_token_ids == choice["token_ids"]
    assert entry.generation_log_probs == [e["logprob"] for e in choice["logprobs"]["content"]]
    for name, value in expected.items():
        assert getattr(entry, name) == value, name
