"""The real-engine harness: the engine answers with exact ids and one log prob per sampled id;
its environment is built beside its cache folder and used only once whole."""

from __future__ import annotations

import os

import pytest

from tests.support.vllm_engine import VllmEngine, build_atomically

EXACT = {"logprobs": True, "top_logprobs": 0, "return_token_ids": True}


def test_a_chat_call_returns_prompt_ids_sampled_ids_and_their_log_probs(
    engine: VllmEngine,
) -> None:
    body = {
        "model": engine.model,
        "messages": [{"role": "user", "content": "What is the weather in Paris today?"}],
        "max_tokens": 8,
        "seed": 7,
        **EXACT,
    }
    answer = engine.post("/v1/chat/completions", body)
    prompt = answer["prompt_token_ids"]
    choice = answer["choices"][0]
    sampled, entries = choice["token_ids"], choice["logprobs"]["content"]
    assert len(prompt) > 5 and all(isinstance(i, int) for i in prompt)
    assert 0 < len(sampled) == len(entries) <= 8
    assert all(isinstance(i, int) and 0 <= i < 2048 for i in sampled)
    assert all(e["logprob"] <= 0.0 for e in entries)
    assert answer["usage"]["completion_tokens"] == len(sampled)
    assert answer["usage"]["prompt_tokens"] == len(prompt)
    again = engine.post("/v1/chat/completions", body)
    assert again["choices"][0]["token_ids"] == sampled, "a fixed seed repeats the sampled ids"


def test_an_interrupted_build_is_never_used_and_a_finished_one_is_reused(tmp_path) -> None:
    final = str(tmp_path / "engine-x")
    os.makedirs(final + ".partial-1-dead")  # a build killed earlier
    builds: list[str] = []

    def interrupted(folder: str) -> None:
        os.makedirs(folder)
        builds.append(folder)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        build_atomically(final, interrupted, "x", lambda _message: None)
    assert not os.path.exists(final) and not os.path.exists(builds[0])

    def whole(folder: str) -> None:
        os.makedirs(folder)
        builds.append(folder)
        with open(os.path.join(folder, "done"), "w"):
            pass

    for _ in range(2):
        assert build_atomically(final, whole, "x", lambda _message: None) == final
    assert len(builds) == 2, "built once, then reused"
    assert sorted(os.listdir(tmp_path)) == ["engine-x", "engine-x.lock"]
