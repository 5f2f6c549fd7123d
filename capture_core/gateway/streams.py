"""Streamed answers: server-sent events read one at a time and reassembled into the answer
an unstreamed call would have returned, so one reader (`answers`) captures both.

vLLM's streamed chat sends the prompt ids on the first chunk and, on every delta chunk,
that chunk's generated ids and their log probs; completions carry prompt and generated ids
per choice; generate sends its weight-version spans on the last chunk. Text, reasoning and
tool-call fragments are joined per choice; a tool call's fragments are joined by their
`index`, as OpenAI's clients do.
This module imports only `gateway.dialects`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

from capture_core.gateway.dialects import CHAT, COMPLETIONS

DONE = "[DONE]"
TEXT_FIELDS = ("content", "reasoning_content", "reasoning", "refusal")


async def sse_events(lines: AsyncIterator[str]) -> AsyncIterator[str]:
    """The `data` of each server-sent event, in order (multi-line data joined by newlines)."""
    data: list[str] = []
    async for line in lines:
        if line == "":
            if data:
                yield "\n".join(data)
                data = []
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
    if data:
        yield "\n".join(data)


class _Choice:
    """One choice's fragments so far."""

    def __init__(self) -> None:
        self.message: dict[str, Any] = {}
        self.tool_calls: dict[int, dict[str, Any]] = {}
        self.token_ids: list[int] | None = None
        self.prompt_ids: Any = None
        self.log_probs: list[Any] = []
        self.logprob_key: str | None = None
        self.text: list[str] = []
        self.finish_reason: Any = None
        self.malformed = False
        self.spans: Any = None

    def add_ids(self, ids: Any) -> None:
        if ids is None:
            return
        if not isinstance(ids, list):
            self.malformed = True
            return
        if self.token_ids is None:
            self.token_ids = []
        self.token_ids.extend(ids)

    def add_delta(self, delta: Mapping[str, Any]) -> None:
        for key, value in delta.items():
            if key == "tool_calls" and isinstance(value, list):
                for part in value:
                    self._add_tool_call(part)
            elif key in TEXT_FIELDS and isinstance(value, str):
                self.message[key] = self.message.get(key, "") + value
            elif value is not None and key not in self.message:
                self.message[key] = value

    def _add_tool_call(self, part: Any) -> None:
        if not isinstance(part, Mapping):
            return
        call = self.tool_calls.setdefault(int(part.get("index", len(self.tool_calls))), {})
        for key in ("id", "type"):
            if part.get(key) is not None:
                call[key] = part[key]
        function = part.get("function")
        if isinstance(function, Mapping):
            target = call.setdefault("function", {})
            if function.get("name"):
                target["name"] = target.get("name", "") + function["name"]
            if function.get("arguments") is not None:
                target["arguments"] = target.get("arguments", "") + function["arguments"]

    def add_log_probs(self, logprobs: Any, key: str) -> None:
        if not isinstance(logprobs, Mapping):
            return
        values = logprobs.get(key)
        if isinstance(values, list):
            self.logprob_key = key
            self.log_probs.extend(values)

    def as_choice(self, index: int, chat: bool) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": index, "finish_reason": self.finish_reason}
        if self.spans is not None:
            choice["weight_versions"] = self.spans
        if chat:
            message = dict(self.message)
            if self.tool_calls:
                message["tool_calls"] = [self.tool_calls[i] for i in sorted(self.tool_calls)]
            message.setdefault("role", "assistant")
            choice["message"] = message
        else:
            choice["text"] = "".join(self.text)
            if self.prompt_ids is not None:
                choice["prompt_token_ids"] = self.prompt_ids
        if self.malformed:
            choice["token_ids"] = "malformed"
        elif self.token_ids is not None:
            choice["token_ids"] = self.token_ids
        if self.logprob_key is not None:
            choice["logprobs"] = {self.logprob_key: self.log_probs}
        return choice


class StreamAssembly:
    """The chunks of one streamed answer, joined into the unstreamed answer's shape."""

    def __init__(self, dialect: str) -> None:
        self.chat = dialect == CHAT
        self.logprob_key = "token_logprobs" if dialect == COMPLETIONS else "content"
        self.top: dict[str, Any] = {}
        self.choices: dict[int, _Choice] = {}
        self.done = False

    def add(self, chunk: Mapping[str, Any]) -> None:
        """Take one parsed chunk."""
        for key in ("id", "model", "created", "prompt_token_ids", "usage"):
            if chunk.get(key) is not None and key not in self.top:
                self.top[key] = chunk[key]
        for position, part in enumerate(chunk.get("choices") or ()):
            if not isinstance(part, Mapping):
                continue
            choice = self.choices.setdefault(int(part.get("index", position)), _Choice())
            choice.add_ids(part.get("token_ids"))
            choice.add_log_probs(part.get("logprobs"), self.logprob_key)
            if part.get("weight_versions") is not None:
                choice.spans = part["weight_versions"]  # the last chunk carries them all
            if part.get("finish_reason") is not None:
                choice.finish_reason = part["finish_reason"]
            if self.chat and isinstance(part.get("delta"), Mapping):
                choice.add_delta(part["delta"])
            if not self.chat:
                if isinstance(part.get("text"), str):
                    choice.text.append(part["text"])
                if part.get("prompt_token_ids") is not None and choice.prompt_ids is None:
                    choice.prompt_ids = part["prompt_token_ids"]

    def unfinished(self) -> list[int]:
        """The choices no chunk gave a `finish_reason`: a stream that says `[DONE]` before a
        choice finished may have cut its generation short (vLLM finishes every choice)."""
        return [i for i in sorted(self.choices) if self.choices[i].finish_reason is None]

    def answer(self) -> dict[str, Any]:
        """The answer an unstreamed call would have returned, as far as the capture reads it."""
        choices = [self.choices[i].as_choice(i, self.chat) for i in sorted(self.choices)]
        return {**self.top, "choices": choices}
