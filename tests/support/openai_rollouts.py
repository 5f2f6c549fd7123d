"""Multi-turn agent rollouts driven with the OpenAI Python SDK, as a harness drives them.

Each rollout has three turns with a tool defined: the agent writes, a tool result comes back,
the agent writes again, then it calls the tool by name (the engine forces the call's text, so
a random-weight model still returns a parsed tool call). Every call asks for exact ids and log
probs, and the harness keeps what its client received, call by call (`Call`).
Text turns sample only words the tokenizer holds as single tokens (`allowed_token_ids`): a
random model's byte soup does not re-tokenize to the ids it sampled, so the next turn's prompt
would not extend the previous call's ids, and a chain could not be built from it.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import openai

from tests.support.make_toy_model import WORDS

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city today.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
NAMED_TOOL = {"type": "function", "function": {"name": "get_weather"}}
EXACT = {"logprobs": True, "top_logprobs": 0}


@dataclass
class Call:
    """What the client received for one call: the engine's ids and log probs."""

    prompt_token_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    message: dict[str, Any]
    finish_reason: str | None
    version: int | None = None


@dataclass
class Rollout:
    rollout_id: str
    calls: list[Call] = field(default_factory=list)
    response: dict[str, Any] = field(default_factory=dict)

    def record(self, reward: float = 1.0) -> dict[str, Any]:
        """The harness's rollout record: id, reward, final chat completion."""
        return {"_ng_rollout_id": self.rollout_id, "reward": reward, "response": self.response}


def single_token_words(engine_url: str, model: str) -> list[int]:
    """Ids of the words (with their leading space) the tokenizer holds as one token each: any
    sequence of them re-tokenizes to the same ids."""
    ids = []
    for word in WORDS:
        body = {"model": model, "prompt": " " + word, "add_special_tokens": False}
        request = urllib.request.Request(
            engine_url + "/tokenize",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            tokens = json.loads(response.read())["tokens"]
        if len(tokens) == 1:
            ids.append(tokens[0])
    return ids


def _unstreamed(client: openai.OpenAI, body: dict[str, Any]) -> tuple[Call, dict[str, Any]]:
    answer = client.chat.completions.create(**body).model_dump(mode="json", exclude_unset=True)
    choice = answer["choices"][0]
    call = Call(
        prompt_token_ids=answer["prompt_token_ids"],
        token_ids=choice["token_ids"],
        logprobs=[entry["logprob"] for entry in choice["logprobs"]["content"]],
        message=_history_message(choice["message"]),
        finish_reason=choice["finish_reason"],
    )
    return call, answer


def _streamed(client: openai.OpenAI, body: dict[str, Any]) -> tuple[Call, dict[str, Any]]:
    stream = client.chat.completions.create(
        **body, stream=True, stream_options={"include_usage": True}
    )
    prompt: list[int] | None = None
    ids: list[int] = []
    logprobs: list[float] = []
    content: list[str] = []
    tool_calls: dict[int, dict[str, Any]] = {}
    finish, first, usage = None, None, None
    for chunk in stream:
        data = chunk.model_dump(mode="json", exclude_unset=True)
        first = first or data
        prompt = data.get("prompt_token_ids") or prompt
        usage = data.get("usage") or usage
        for choice in data["choices"]:
            ids.extend(choice.get("token_ids") or [])
            logprobs.extend(e["logprob"] for e in (choice.get("logprobs") or {}).get("content", []))
            delta = choice.get("delta") or {}
            content.append(delta.get("content") or "")
            for part in delta.get("tool_calls") or []:
                _merge_tool_call(tool_calls.setdefault(part["index"], {}), part)
            finish = choice.get("finish_reason") or finish
    assert prompt is not None and first is not None, "the stream carried no prompt ids"
    message: dict[str, Any] = {"role": "assistant", "content": "".join(content)}
    if tool_calls:
        message["tool_calls"] = [tool_calls[i] for i in sorted(tool_calls)]
    call = Call(prompt, ids, logprobs, _history_message(message), finish)
    answer = {
        "id": first["id"],
        "object": "chat.completion",
        "created": first["created"],
        "model": first["model"],
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": usage,
    }
    return call, answer


def _merge_tool_call(into: dict[str, Any], part: dict[str, Any]) -> None:
    for key in ("id", "type"):
        if part.get(key):
            into[key] = part[key]
    function = into.setdefault("function", {"name": "", "arguments": ""})
    for key in ("name", "arguments"):
        function[key] += (part.get("function") or {}).get(key) or ""


def _history_message(message: dict[str, Any]) -> dict[str, Any]:
    """The assistant message as a harness sends it back in the next turn."""
    kept = {"role": "assistant", "content": message.get("content") or ""}
    if message.get("tool_calls"):
        kept["tool_calls"] = [
            {"id": c["id"], "type": "function", "function": c["function"]}
            for c in message["tool_calls"]
        ]
    return kept


def run_rollout(
    base_url: str,
    rollout_id: str,
    model: str,
    words: list[int],
    seed: int,
    streamed: bool,
    before_turn: Callable[[int], int | None] = lambda _turn: None,
    max_tokens: int = 8,
) -> Rollout:
    """Three turns through `base_url` (a gateway session or the engine's /v1).
    `before_turn(t)` runs before turn t and returns the weight version it published."""
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=300)
    send = _streamed if streamed else _unstreamed
    rollout = Rollout(rollout_id)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are an agent. Use the tool when it helps."},
        {"role": "user", "content": "What is the weather in Paris today?"},
    ]
    for turn in range(3):
        version = before_turn(turn)
        body: dict[str, Any] = {
            "model": model,
            "messages": messages,
            "tools": [WEATHER_TOOL],
            "max_tokens": max_tokens,
            "seed": seed + turn,
            **EXACT,
            "extra_body": {"return_token_ids": True},
        }
        if turn < 2:
            body["extra_body"]["allowed_token_ids"] = words
        else:
            body.update(tool_choice=NAMED_TOOL, max_tokens=64)
        call, answer = send(client, body)
        call.version = version
        rollout.calls.append(call)
        rollout.response = answer
        messages = [*messages, call.message]
        if turn == 0:  # the harness ran the tool the agent asked about
            call_id = f"call_{rollout_id}"
            messages[-1] = {**call.message, "tool_calls": [_weather_call(call_id)]}
            messages.append({"role": "tool", "tool_call_id": call_id, "content": '{"sky": "rain"}'})
        elif turn == 1:
            messages.append({"role": "user", "content": "Now call the tool for Paris."})
    return rollout


def _weather_call(call_id: str) -> dict[str, Any]:
    arguments = '{"city": "Paris"}'
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": "get_weather", "arguments": arguments},
    }
