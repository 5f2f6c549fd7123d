"""The real-engine harness: the engine answers with exact ids and one log prob per sampled id."""

from __future__ import annotations

from tests.support.vllm_engine import VllmEngine

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
