"""A small engine answering in vLLM's shapes, with switches for faults, run as a real server.

`python -m tests.support.fake_engine PORT` serves it on 127.0.0.1:PORT (uvicorn). It tokenizes
byte by byte with a chat template of its own, so a conversation's next prompt extends the
previous prompt and generation exactly (what prefix merging needs). It returns
`prompt_token_ids` and `token_ids` only when the request sets `return_token_ids`, and log
probs only when asked, as vLLM does. `POST /control` sets the faults (see `Faults`);
`GET /control` returns what it saw: the request bodies and headers, streams aborted by the
client, streams completed. `FakeEngine` starts and stops one from a test.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import urllib.request
from dataclasses import dataclass, field
from typing import Any

START, END, USER, ASSISTANT, SYSTEM, TOOL = 1, 2, 3, 4, 5, 6
ROLES = {"user": USER, "assistant": ASSISTANT, "system": SYSTEM, "tool": TOOL}
TOKEN_OFFSET = 10  # byte b is token b + 10, so the specials stay apart


def encode(text: str) -> list[int]:
    return [b + TOKEN_OFFSET for b in text.encode()]


def decode(ids: list[int]) -> str:
    return bytes(i - TOKEN_OFFSET for i in ids if i >= TOKEN_OFFSET).decode(errors="replace")


def render(messages: list[dict[str, Any]]) -> list[int]:
    """The chat template: each message as START role content END, then START assistant."""
    ids: list[int] = []
    for message in messages:
        content = message.get("content") or ""
        if message.get("tool_calls"):
            content += json.dumps(message["tool_calls"][0]["function"], sort_keys=True)
        ids += [START, ROLES.get(message.get("role", "user"), USER), *encode(str(content)), END]
    return [*ids, START, ASSISTANT]


def log_prob(token: int, position: int) -> float:
    return -((token * 31 + position) % 97) / 50.0 - 0.001


@dataclass
class Faults:
    """What the engine does wrong. `missing`: an id field left out (`prompt_token_ids`,
    `token_ids` or `logprobs`); `status`: answer with this error status; `delay`: seconds
    before answering; `chunk_delay`: seconds between streamed chunks; `drop_after`: break the
    stream off after this many chunks; `versions`: labels of `weight_versions` spans
    (generate), splitting the generation evenly; `reply_tokens`: pad replies to this many
    generated tokens; `endless_line`: a stream whose first event never ends (bytes without a
    newline until the client goes away); `require_key`: the engine's own key; `no_finish`: a
    stream whose chunks carry no `finish_reason` (it still ends in `[DONE]`); `emptied`:
    generated ids and log probs as empty lists (a router that blanks them) while the text
    stays; `bad_index`: streamed choices whose `index` is not a number."""

    missing: str | None = None
    status: int | None = None
    delay: float = 0.0
    chunk_delay: float = 0.0
    drop_after: int | None = None
    versions: list[Any] | None = None
    reply_tokens: int | None = None
    require_key: str | None = None
    unhealthy: bool = False
    no_finish: bool = False
    endless_line: bool = False
    emptied: bool = False
    bad_index: bool = False


@dataclass
class Seen:
    requests: list[dict[str, Any]] = field(default_factory=list)
    aborted: int = 0
    completed: int = 0


def reply_text(body: dict[str, Any], choice: int, faults: Faults) -> str:
    count = len(body.get("messages") or [body.get("prompt")])
    text = f"reply {count}.{choice}"
    if faults.reply_tokens:
        text = (text + " " + "x" * faults.reply_tokens)[: faults.reply_tokens - 1]
    return text


def generation(body: dict[str, Any], choice: int, faults: Faults) -> tuple[list[int], dict]:
    """Generated ids (ending in END) and the message they say."""
    if body.get("tools"):
        name = body["tools"][0]["function"]["name"]
        function = {"name": name, "arguments": json.dumps({"x": choice})}
        call = {"id": f"call_{choice}", "type": "function", "function": function}
        ids = [*encode(json.dumps(function, sort_keys=True)), END]
        return ids, {"role": "assistant", "content": None, "tool_calls": [call]}
    text = reply_text(body, choice, faults)
    return [*encode(text), END], {"role": "assistant", "content": text}


def chat_logprobs(ids: list[int], top: int = 0) -> dict[str, Any]:
    """vLLM's chat log probs: one entry per token, with `top` alternatives (the token itself
    first, then made-up ones less likely)."""
    content = []
    for i, t in enumerate(ids):
        token, value = decode([t]) or "<s>", log_prob(t, i)
        alternatives = [{"token": token, "logprob": value, "bytes": []}]
        alternatives += [
            {"token": f"alt{k}", "logprob": value - k, "bytes": []} for k in range(1, top)
        ]
        content.append(
            {"token": token, "logprob": value, "bytes": [], "top_logprobs": alternatives[:top]}
        )
    return {"content": content}


TOP_LOGPROBS_REFUSAL = {
    "error": {
        "message": "when using `top_logprobs`, `logprobs` must be set to true. "
        "(parameter=top_logprobs)",
        "type": "BadRequestError",
        "param": "top_logprobs",
        "code": 400,
    }
}
"""vLLM 0.32's answer to a chat request with `top_logprobs` above 0 and no `logprobs`."""


def chat_answer(body: dict[str, Any], faults: Faults) -> dict[str, Any]:
    prompt = render(body.get("messages") or [])
    choices = []
    for index in range(body.get("n") or 1):
        ids, message = generation(body, index, faults)
        choice: dict[str, Any] = {"index": index, "message": message, "finish_reason": "stop"}
        choice["message"].setdefault("tool_calls", [])
        choice["message"]["reasoning_content"] = None
        if body.get("logprobs") and faults.missing != "logprobs":
            choice["logprobs"] = chat_logprobs(ids, body.get("top_logprobs") or 0)
        else:
            choice["logprobs"] = None
        choice["token_ids"] = None  # vLLM's answers carry unrequested fields as null
        if body.get("return_token_ids") and faults.missing != "token_ids":
            choice["token_ids"] = ids
        if faults.missing == "token_ids":
            del choice["token_ids"]
        if faults.emptied and choice["token_ids"] is not None:
            choice["token_ids"] = []
            choice["logprobs"] = {"content": []}
        choices.append(choice)
    answer: dict[str, Any] = {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 1,
        "model": body.get("model", "fake"),
        "choices": choices,
        "usage": {"prompt_tokens": len(prompt)},
        "prompt_token_ids": None,
    }
    if body.get("return_token_ids"):
        answer["prompt_token_ids"] = prompt
    if faults.missing == "prompt_token_ids":
        del answer["prompt_token_ids"]
    return answer


def completion_prompts(prompt: Any) -> list[list[int]]:
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
        return [prompt]
    if isinstance(prompt, list):
        return [p if isinstance(p, list) else encode(p) for p in prompt]
    return [encode(str(prompt))]


def completion_answer(body: dict[str, Any], faults: Faults) -> dict[str, Any]:
    choices = []
    for prompt in completion_prompts(body.get("prompt")):
        for choice_n in range(body.get("n") or 1):
            ids = [*encode(f"done {len(prompt)}.{choice_n}"), END]
            choice: dict[str, Any] = {
                "index": len(choices),
                "text": decode(ids),
                "finish_reason": "stop",
                "logprobs": None,
            }
            if body.get("logprobs") is not None and faults.missing != "logprobs":
                choice["logprobs"] = {
                    "tokens": [decode([t]) for t in ids],
                    "token_logprobs": [log_prob(t, i) for i, t in enumerate(ids)],
                    "top_logprobs": None,
                    "text_offset": list(range(len(ids))),
                }
            choice["token_ids"] = choice["prompt_token_ids"] = None
            if body.get("return_token_ids"):
                choice["token_ids"], choice["prompt_token_ids"] = ids, prompt
            if faults.missing in ("token_ids", "prompt_token_ids"):
                del choice[faults.missing]
            choices.append(choice)
    return {"id": "cmpl-fake", "object": "text_completion", "model": "fake", "choices": choices}


def generate_answer(body: dict[str, Any], faults: Faults) -> dict[str, Any]:
    params = body.get("sampling_params") or {}
    choices = []
    for index in range(params.get("n") or 1):
        ids = [*encode(f"gen {len(body['token_ids'])}.{index}"), END]
        choice: dict[str, Any] = {"index": index, "token_ids": ids, "finish_reason": "stop"}
        choice["logprobs"] = chat_logprobs(ids) if params.get("logprobs") is not None else None
        if faults.versions:
            cut = len(ids) // len(faults.versions)
            bounds = [i * cut for i in range(len(faults.versions))] + [len(ids)]
            choice["weight_versions"] = [
                {"version": label, "start": bounds[i], "end": bounds[i + 1]}
                for i, label in enumerate(faults.versions)
            ]
        choices.append(choice)
    return {"request_id": "gen-fake", "choices": choices}


def chat_chunks(body: dict[str, Any], faults: Faults) -> list[dict[str, Any]]:
    """The streamed form of `chat_answer`: role chunk (with the prompt ids), one chunk per
    token, a finish chunk, and a usage chunk when asked."""
    whole = chat_answer({**body, "stream": False}, faults)
    chunks: list[dict[str, Any]] = []
    base = {"id": whole["id"], "object": "chat.completion.chunk", "model": whole["model"]}
    first: dict[str, Any] = {**base, "choices": []}
    if whole.get("prompt_token_ids") is not None:
        first["prompt_token_ids"] = whole["prompt_token_ids"]
    for choice in whole["choices"]:
        first["choices"].append(
            {
                "index": choice["index"],
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
        )
    chunks.append(first)
    for choice in whole["choices"]:
        index, message = choice["index"], choice["message"]
        ids, _ = generation(body, index, faults)
        fragments = _fragments(message, len(ids))
        for position, token in enumerate(ids):
            part: dict[str, Any] = {
                "index": index,
                "delta": fragments[position],
                "logprobs": None,
                "finish_reason": None,
            }
            if choice.get("token_ids") is not None:
                part["token_ids"] = [] if faults.emptied else [token]
            if choice.get("logprobs"):
                content = choice["logprobs"]["content"][position : position + 1]
                part["logprobs"] = {"content": content}
            chunks.append({**base, "choices": [part]})
        chunks.append(
            {
                **base,
                "choices": [
                    {"index": index, "delta": {}, "logprobs": None, "finish_reason": "stop"}
                ],
            }
        )
    if (body.get("stream_options") or {}).get("include_usage"):
        chunks.append({**base, "choices": [], "usage": whole["usage"]})
    return chunks


def _fragments(message: dict[str, Any], count: int) -> list[dict[str, Any]]:
    """The message cut into `count` deltas (text a character each; a tool call's id and name
    first, then its arguments)."""
    if message.get("tool_calls"):
        call = message["tool_calls"][0]
        args = call["function"]["arguments"]
        head = {
            "tool_calls": [
                {
                    "index": 0,
                    "id": call["id"],
                    "type": "function",
                    "function": {"name": call["function"]["name"], "arguments": ""},
                }
            ]
        }
        pieces = [head] + [
            {"tool_calls": [{"index": 0, "function": {"arguments": args[i : i + 3]}}]}
            for i in range(0, len(args), 3)
        ]
    else:
        text = message.get("content") or ""
        pieces = [{"content": ch} for ch in text]
    pieces += [{}] * (count - len(pieces))
    return [*pieces[: count - 1], _merge(pieces[count - 1 :])]


def _merge(deltas: list[dict[str, Any]]) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for delta in deltas:
        if "content" in delta:
            merged["content"] = merged.get("content", "") + delta["content"]
        if "tool_calls" in delta:
            merged.setdefault("tool_calls", []).extend(delta["tool_calls"])
    return merged


def completion_chunks(body: dict[str, Any], faults: Faults) -> list[dict[str, Any]]:
    whole = completion_answer({**body, "return_token_ids": True, "logprobs": 0}, Faults())
    want_ids = bool(body.get("return_token_ids"))
    chunks = []
    for choice in whole["choices"]:
        ids = choice["token_ids"]
        for position in range(len(ids)):
            part: dict[str, Any] = {
                "index": choice["index"],
                "finish_reason": "stop" if position == len(ids) - 1 else None,
                "text": decode(ids[position : position + 1]),
                "logprobs": None,
            }
            if want_ids and position == 0 and faults.missing != "prompt_token_ids":
                part["prompt_token_ids"] = choice["prompt_token_ids"]
            if want_ids and faults.missing != "token_ids":
                part["token_ids"] = ids[position : position + 1]
            if body.get("logprobs") is not None and faults.missing != "logprobs":
                part["logprobs"] = {
                    "tokens": choice["logprobs"]["tokens"][position : position + 1],
                    "token_logprobs": choice["logprobs"]["token_logprobs"][position : position + 1],
                }
            chunks.append({"id": whole["id"], "object": "text_completion", "choices": [part]})
    return chunks


def build_app() -> Any:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    state = {"faults": Faults(), "seen": Seen()}

    async def control(request: Request) -> JSONResponse:
        if request.method == "POST":
            state["faults"] = Faults(**(await request.json()))
            state["seen"] = Seen()
            return JSONResponse({"ok": True})
        seen = state["seen"]
        return JSONResponse(
            {"requests": seen.requests, "aborted": seen.aborted, "completed": seen.completed}
        )

    async def health(_request: Request) -> JSONResponse:
        return JSONResponse({}, 503 if state["faults"].unhealthy else 200)

    async def responses(request: Request) -> JSONResponse:
        body = await request.json()
        state["seen"].requests.append({"path": request.url.path, "body": body, "headers": {}})
        return JSONResponse({"object": "response", "output": [], "model": body.get("model")})

    async def models(_request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": "fake"}]})

    async def answer(request: Request) -> Any:
        faults: Faults = state["faults"]
        body = await request.json()
        seen: Seen = state["seen"]
        headers = {k: v for k, v in request.headers.items() if k in ("authorization",)}
        seen.requests.append({"path": request.url.path, "body": body, "headers": headers})
        if faults.require_key and request.headers.get("authorization") != (
            f"Bearer {faults.require_key}"
        ):
            return JSONResponse({"error": {"message": "bad engine key"}}, 401)
        if faults.delay:
            await asyncio.sleep(faults.delay)
        if faults.status:
            return JSONResponse(
                {"error": {"message": "engine fault", "code": faults.status}}, faults.status
            )
        path = request.url.path
        top = body.get("top_logprobs")
        if path.endswith("/chat/completions") and top not in (None, 0) and not body.get("logprobs"):
            return JSONResponse(TOP_LOGPROBS_REFUSAL, 400)
        if faults.endless_line and body.get("stream"):
            return StreamingResponse(endless_line(), media_type="text/event-stream")
        if not body.get("stream"):
            if path.endswith("/chat/completions"):
                return JSONResponse(chat_answer(body, faults))
            if path.endswith("/generate"):
                return JSONResponse(generate_answer(body, faults))
            return JSONResponse(completion_answer(body, faults))
        chunks = (chat_chunks if path.endswith("/chat/completions") else completion_chunks)(
            body, faults
        )
        return StreamingResponse(events(chunks, faults, seen), media_type="text/event-stream")

    async def endless_line():
        yield "data: "
        while True:  # 1.6 MB/s: enough to pass any test's limit, little for an unbounded reader
            yield "x" * 16384
            await asyncio.sleep(0.01)

    async def events(chunks: list[dict[str, Any]], faults: Faults, seen: Seen):
        finished = False
        try:
            for number, chunk in enumerate(chunks):
                if faults.drop_after is not None and number >= faults.drop_after:
                    raise ConnectionAbortedError("fake engine drops the stream")
                for part in chunk.get("choices") or ():
                    if faults.no_finish:
                        part["finish_reason"] = None
                    if faults.bad_index and number > 1:
                        part["index"] = "first"
                yield f"data: {json.dumps(chunk)}\n\n"
                if faults.chunk_delay:
                    await asyncio.sleep(faults.chunk_delay)
            yield "data: [DONE]\n\n"
            finished = True
        finally:
            if finished:
                seen.completed += 1
            else:
                seen.aborted += 1

    routes = [
        Route("/control", control, methods=["GET", "POST"]),
        Route("/health", health),
        Route("/v1/models", models),
        Route("/v1/responses", responses, methods=["POST"]),
        Route("/v1/chat/completions", answer, methods=["POST"]),
        Route("/v1/completions", answer, methods=["POST"]),
        Route("/inference/v1/generate", answer, methods=["POST"]),
    ]
    return Starlette(routes=routes)


class FakeEngine:
    """A fake engine subprocess on a port; `start`, `stop` (SIGKILL: a crash), `set`, `seen`."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> FakeEngine:
        from tests.support.servers import wait_until

        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.fake_engine", str(self.port)],
            cwd=root,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_until(self._answers, 60, "the fake engine to answer")
        return self

    def _answers(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"the fake engine exited with {self.proc.returncode}")
        try:
            with urllib.request.urlopen(self.url + "/control", timeout=1):
                return True
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)

    def set(self, **faults: Any) -> None:
        request = urllib.request.Request(
            self.url + "/control", json.dumps(faults).encode(), {"content-type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=10):
            pass

    def seen(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.url + "/control", timeout=10) as response:
            return json.loads(response.read())


if __name__ == "__main__":
    import uvicorn

    uvicorn.run(build_app(), host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
