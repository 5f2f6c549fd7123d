"""Record a real vLLM engine's answers as JSON files, for a fake engine to answer in its shapes.

`python -m tests.support.record_vllm_shapes [ENGINE_URL] OUT_DIR` sends each request in
`requests()` to the engine and writes `OUT_DIR/<name>.json` holding the request, the HTTP status
and the answer: a JSON body, or for a streamed call the list of SSE `data:` payloads (each
parsed as JSON, the closing `[DONE]` kept as the string). Without ENGINE_URL it starts the
engine of `tests/support/vllm_engine.py` (dev endpoints, scale-out, hermes tool-call parser).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import urllib.error
import urllib.request

MODEL = "tokcap-toy"
EXACT = {"logprobs": True, "top_logprobs": 0, "return_token_ids": True}
USER = [{"role": "user", "content": "What is the weather in Paris today?"}]
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city today.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
TOOL_TURNS = [
    {"role": "system", "content": "You are an agent. Use tools."},
    *USER,
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_0",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_0", "content": '{"sky": "rain", "celsius": 9}'},
]
NAMED_TOOL = {"type": "function", "function": {"name": "get_weather"}}
STREAM = {"stream": True, "stream_options": {"include_usage": True}}


def chat(**extra: object) -> dict:
    return {"model": MODEL, "messages": USER, "max_tokens": 8, "seed": 7, **EXACT, **extra}


def completion(**extra: object) -> dict:
    """A token-id prompt; `logprobs` is the legacy API's count of alternatives (0: none)."""
    prompt = [1, 300, 301, 302, 303, 304]
    exact = {"logprobs": 0, "return_token_ids": True}
    return {"model": MODEL, "prompt": prompt, "max_tokens": 8, "seed": 7, **exact, **extra}


def requests() -> list[tuple[str, str, str, dict | None]]:
    """(file name, method, path, body) for every recorded call, in order."""
    generate = {
        "model": MODEL,
        "token_ids": [1, 300, 301, 302, 303, 304],
        "sampling_params": {"max_tokens": 8, "seed": 7, "logprobs": 0},
    }
    tools = {"tools": [WEATHER_TOOL], "messages": TOOL_TURNS}
    return [
        ("chat", "POST", "/v1/chat/completions", chat()),
        ("chat_stream", "POST", "/v1/chat/completions", chat(**STREAM)),
        ("chat_n2", "POST", "/v1/chat/completions", chat(n=2)),
        ("chat_n2_stream", "POST", "/v1/chat/completions", chat(n=2, **STREAM)),
        ("completions", "POST", "/v1/completions", completion()),
        ("completions_stream", "POST", "/v1/completions", completion(**STREAM)),
        ("completions_logprobs_true", "POST", "/v1/completions", completion(logprobs=True)),
        ("chat_tools_auto", "POST", "/v1/chat/completions", chat(**tools)),
        ("chat_tools_auto_stream", "POST", "/v1/chat/completions", chat(**tools, **STREAM)),
        (
            "chat_tools_named",
            "POST",
            "/v1/chat/completions",
            chat(**tools, tool_choice=NAMED_TOOL, max_tokens=48),
        ),
        (
            "chat_tools_named_stream",
            "POST",
            "/v1/chat/completions",
            chat(**tools, tool_choice=NAMED_TOOL, max_tokens=48, **STREAM),
        ),
        ("weight_info_before", "GET", "/weight_info", None),
        ("update_weight_version", "POST", "/update_weight_version", {"new_version": "v7"}),
        ("weight_info_after", "GET", "/weight_info", None),
        ("generate", "POST", "/inference/v1/generate", generate),
        ("generate_stream", "POST", "/inference/v1/generate", {**generate, "stream": True}),
        ("chat_bad_model", "POST", "/v1/chat/completions", chat(model="no-such-model")),
        ("chat_too_long", "POST", "/v1/chat/completions", chat(max_tokens=4096)),
    ]


def _answer(raw: bytes, streamed: bool) -> object:
    if not streamed:
        try:
            return json.loads(raw or b"null")
        except ValueError:
            return raw.decode(errors="replace")
    payloads: list[object] = []
    for line in raw.decode().splitlines():
        if line.startswith("data:"):
            data = line[len("data:") :].strip()
            payloads.append(data if data == "[DONE]" else json.loads(data))
    return payloads


def call(url: str, method: str, path: str, body: dict | None) -> dict:
    """One call to the engine: its status, content type and answer."""
    data = None if body is None else json.dumps(body).encode()
    headers = {} if body is None else {"Content-Type": "application/json"}
    request = urllib.request.Request(url + path, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            status, raw = response.status, response.read()
            kind = response.headers.get("content-type")
    except urllib.error.HTTPError as error:
        status, kind, raw = error.code, error.headers.get("content-type"), error.read()
    streamed = bool(body and body.get("stream")) and status == 200
    return {"status": status, "content_type": kind, "answer": _answer(raw, streamed)}


def record(url: str, out_dir: str) -> list[str]:
    os.makedirs(out_dir, exist_ok=True)
    written = []
    for name, method, path, body in requests():
        answer = call(url, method, path, body)
        recorded = {"method": method, "path": path, "request": body, **answer}
        target = os.path.join(out_dir, f"{name}.json")
        with open(target, "w") as f:
            json.dump(recorded, f, indent=1)
            f.write("\n")
        written.append(target)
    return written


def main(argv: list[str]) -> None:
    """Record against ENGINE_URL, or against an engine started here for the purpose."""
    if len(argv) not in (1, 2):
        sys.exit("usage: python -m tests.support.record_vllm_shapes [ENGINE_URL] OUT_DIR")
    if len(argv) == 2:
        written = record(argv[0], argv[1])
    else:
        from tests.support.vllm_engine import vllm_engine

        with tempfile.TemporaryDirectory() as workdir, vllm_engine(workdir) as engine:
            written = record(engine.url, argv[0])
    print("\n".join(written))


if __name__ == "__main__":
    main(sys.argv[1:])
