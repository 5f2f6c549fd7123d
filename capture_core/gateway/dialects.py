"""The captured dialects and what the gateway adds to their requests (and removes again).

An engine returns exact ids only when asked: vLLM needs `logprobs` (`true` for chat, a count
for completions) and `return_token_ids: true`. The gateway sets what the client did not ask
for, and takes the values those settings add out of the answer, so the client gets back what
the engine would have given it directly. Fields the client asked for are left as they are.
An added field comes back as the engine gives it to a client that did not ask: null in an
answer, null (log probs) or absent (ids) in a stream chunk.
`/inference/v1/generate` (vLLM's token-in, token-out path) takes its prompt as ids and
returns generated ids always; only its log probs are asked for.
This module imports only `errors`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from capture_core.errors import InvalidInputError

CHAT = "chat"
COMPLETIONS = "completions"
GENERATE = "generate"
PATHS = {
    "/v1/chat/completions": CHAT,
    "/v1/completions": COMPLETIONS,
    "/inference/v1/generate": GENERATE,
}
"""Engine path (after the correlation prefix) -> captured dialect. Any other path is not
observed: it is forwarded and its rollout marked incomplete."""
MAX_CALLS = 1024
"""The most calls (choices: `n`, times the prompts of a completions batch) one request may
ask for: each is an intent written before forwarding and an id held while the call runs,
so an unbounded `n` would let one request exhaust the store and the gateway's memory."""


@dataclass(frozen=True)
class Prepared:
    """A request ready to forward: its body, the answer fields to remove before the client
    sees them (`top`: on the answer or chunk, `choice`: on each choice), how many choices
    (calls) it asks for, whether it streams, and the prompt ids it carries (generate)."""

    body: dict[str, Any]
    top: tuple[str, ...]
    choice: tuple[str, ...]
    choices: int
    stream: bool
    prompt_ids: list[int] | None = None


def _count(value: Any, name: str) -> int:
    if value is None:
        return 1
    if type(value) is not int or value < 1:
        raise InvalidInputError(f"{name} must be a positive integer, got {value!r}")
    return value


def prepare(dialect: str, body: Mapping[str, Any]) -> Prepared:
    """The request to forward for `dialect`, with the fields that return exact ids set.

    Raises `InvalidInputError` (a 400 to the client) for a request whose ids cannot be
    captured exactly: a `stream` that is not a boolean, completions with `echo` (its log
    probs would cover the prompt too), chat with `echo` or with `top_logprobs` but no
    `logprobs` (`_refuse_uncapturable_chat`), a generate request without a list of prompt
    ids.
    """
    forward = dict(body)
    stream = forward.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise InvalidInputError(
            f"stream must be true or false, got {stream!r}: the engine may read it either "
            "way, and the gateway must know whether the answer streams"
        )
    stream = stream is True
    if dialect == GENERATE:
        return _prepare_generate(forward, stream)
    top: list[str] = []
    choice: list[str] = []
    if not forward.get("return_token_ids"):
        forward["return_token_ids"] = True
        top.append("prompt_token_ids")
        choice.append("token_ids")
    if dialect == CHAT:
        _refuse_uncapturable_chat(forward)
        if forward.get("logprobs") is not True:
            forward["logprobs"] = True
            forward["top_logprobs"] = 0
            choice.append("logprobs")
        choices = _count(forward.get("n"), "n")
    else:
        if forward.get("echo"):
            raise InvalidInputError(
                "echo: true cannot be captured exactly (its log probs and ids would mix the "
                "prompt into the generation); send the request without echo"
            )
        if forward.get("logprobs") is None:
            forward["logprobs"] = 0
            choice.append("logprobs")
        if top:  # completions carry the prompt's ids on each choice
            top.clear()
            choice.append("prompt_token_ids")
        choices = _count(forward.get("n"), "n") * _prompts(forward.get("prompt"))
    return Prepared(forward, tuple(top), tuple(choice), _bounded(choices), stream)


def _refuse_uncapturable_chat(body: Mapping[str, Any]) -> None:
    """A chat request the gateway cannot pass on as the client sent it: `echo: true` puts
    the last message's text before the generation in the answer's content, so the captured
    message would hold text the generated ids never said; `top_logprobs` above 0 without
    `logprobs: true` is one the engine refuses (vLLM answers 400), and the gateway, which
    sets `logprobs` itself, would answer it instead."""
    if body.get("echo"):
        raise InvalidInputError(
            "echo: true is not supported for capture (the answer's content would begin with "
            "the last message's text, which the generated token ids do not say); send the "
            "request without echo"
        )
    top = body.get("top_logprobs")
    if top not in (None, 0) and body.get("logprobs") is not True:
        raise InvalidInputError(
            f"top_logprobs ({top!r}) needs logprobs: true, as the engine requires; set "
            "logprobs: true or leave top_logprobs out"
        )


def _bounded(calls: int) -> int:
    if calls > MAX_CALLS:
        raise InvalidInputError(
            f"the request asks for {calls} choices (n, times the prompts of a batch), past "
            f"the gateway's limit of {MAX_CALLS} calls per request; send it in smaller parts"
        )
    return calls


def _prompts(prompt: Any) -> int:
    """How many prompts a completions request holds: a list of strings or of id lists is a
    batch, anything else one prompt."""
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        return len(prompt)
    return 1


def _prepare_generate(forward: dict[str, Any], stream: bool) -> Prepared:
    prompt = forward.get("token_ids")
    if not isinstance(prompt, list) or not prompt or not all(type(t) is int for t in prompt):
        raise InvalidInputError(
            "a generate request needs token_ids, the prompt as a non-empty list of integer "
            "token ids"
        )
    params = dict(forward.get("sampling_params") or {})
    choice: tuple[str, ...] = ()
    if params.get("logprobs") is None:
        params["logprobs"] = 0
        choice = ("logprobs",)
    forward["sampling_params"] = params
    choices = _bounded(_count(params.get("n"), "sampling_params.n"))
    return Prepared(forward, (), choice, choices, stream, prompt_ids=list(prompt))


NULLED_IN_CHUNKS = frozenset({"logprobs"})
"""Of the added fields, those a stream chunk carries as null when the client did not ask
(vLLM sets `logprobs` on every chunk; the id fields are left unset)."""


def strip_added(answer: dict[str, Any], prepared: Prepared, chunk: bool = False) -> dict[str, Any]:
    """The answer (or, with `chunk`, one streamed chunk) as the engine gives it when the
    client's own request reaches it: each added field null, as the engine leaves a field
    nobody asked for, except the id fields of a chunk, which are left out.

    Modifies and returns `answer`.
    """
    _clear(answer, prepared.top, chunk)
    if prepared.choice:
        for choice in answer.get("choices") or ():
            if isinstance(choice, dict):
                _clear(choice, prepared.choice, chunk)
    return answer


def _clear(part: dict[str, Any], names: tuple[str, ...], chunk: bool) -> None:
    for name in names:
        if name not in part:
            continue
        if chunk and name not in NULLED_IN_CHUNKS:
            del part[name]
        else:
            part[name] = None
