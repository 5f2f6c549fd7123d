"""An engine's complete answer, read into one captured call per choice, from id fields only.

Ids come from the fields that carry ids (`prompt_token_ids`, `token_ids`), never from text:
a log-prob entry's `token` is decoded text (or `token_id:<int>` text) and is never parsed.
An answer without a field the capture needs fails the call, naming the field and the engine
setting that returns it: an empty list would train on nothing, a guess on the wrong tokens.
An id field that is there but empty fails it too (a sampled call always has ids).
Each choice of an `n` > 1 answer is its own call (its own prompt, generation and log probs).
A choice's `routed_experts` (vLLM's, for mixture-of-experts models) is kept when set.
This module imports only `errors`, `records` and `gateway.dialects`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from capture_core.errors import EngineAnswerError
from capture_core.gateway.dialects import CHAT, COMPLETIONS, GENERATE
from capture_core.records import response_to_output_items
from capture_core.records.token_values import are_token_ids

IDS_SETTING = "return_token_ids: true (vLLM 0.10.2 or later)"
LOGPROBS_SETTING = {
    CHAT: "logprobs: true",
    COMPLETIONS: "logprobs: 0",
    GENERATE: "sampling_params.logprobs: 0",
}
ROUTER_HINT = (
    "; the gateway asks for it, so the engine does not support the setting or something "
    "between the gateway and the engine removes it"
)


@dataclass(frozen=True)
class ChoiceCall:
    """One choice of an answer, as the call it records."""

    index: int
    prompt_ids: list[int]
    generation_ids: list[int]
    log_probs: list[float]
    output_items: list[dict[str, Any]]
    version_spans: list[Any] | None
    routed_experts: Any = None


def _missing(field: str, setting: str) -> EngineAnswerError:
    return EngineAnswerError(
        f"the engine's answer has no {field}, so the call's exact token ids cannot be "
        f"captured; the engine returns it when the request sets {setting}{ROUTER_HINT}"
    )


def _ids(value: Any, field: str, setting: str) -> list[int]:
    if value is None:
        raise _missing(field, setting)
    if not isinstance(value, list) or not are_token_ids(value):
        raise EngineAnswerError(f"the engine's {field} is not a list of token ids")
    if not value:
        raise EngineAnswerError(
            f"the engine's {field} is empty, but a sampled call has a prompt and at least one "
            f"generated token: something between the gateway and the engine blanked it"
        )
    return value


def message_item(message: Any) -> list[dict[str, Any]]:
    """The output item of a chat message, as NeMo Gym's model server converts a chat
    completion (`records.response_to_output_items`): the message with `type` and `role`;
    fields the engine left null or empty are dropped, so a streamed and an unstreamed answer
    record the same item."""
    if not isinstance(message, Mapping):
        return []
    kept = {k: v for k, v in message.items() if v is not None and v != [] and v != ""}
    return response_to_output_items({"choices": [{"message": kept}]})


def _log_probs(choice: Mapping[str, Any], dialect: str, index: int) -> list[float]:
    field = f"choices[{index}].logprobs"
    logprobs = choice.get("logprobs")
    if not isinstance(logprobs, Mapping):
        raise _missing(field, LOGPROBS_SETTING[dialect])
    if dialect == COMPLETIONS:
        values = logprobs.get("token_logprobs")
        field += ".token_logprobs"
    else:
        content = logprobs.get("content")
        field += ".content"
        values = (
            None
            if not isinstance(content, list)
            else [e.get("logprob") if isinstance(e, Mapping) else None for e in content]
        )
    if values is None:
        raise _missing(field, LOGPROBS_SETTING[dialect])
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        raise EngineAnswerError(f"the engine's {field} holds a value that is not a log prob")
    return [float(v) for v in values]


def choice_calls(
    dialect: str, answer: Mapping[str, Any], prompt_ids: list[int] | None = None
) -> list[ChoiceCall]:
    """Every choice of a complete answer as a call, in choice order. `prompt_ids` is the
    request's own prompt (generate). Raises `EngineAnswerError` naming a missing field."""
    choices = answer.get("choices")
    if not isinstance(choices, list) or not choices:
        raise EngineAnswerError(
            "the engine's answer has no choices, so there is nothing to capture"
        )
    top_prompt = answer.get("prompt_token_ids")
    calls = []
    for position, choice in enumerate(choices):
        if not isinstance(choice, Mapping):
            raise EngineAnswerError(f"the engine's choices[{position}] is not an object")
        index = choice.get("index", position)
        if dialect == GENERATE:
            prompt = prompt_ids or []
        elif dialect == CHAT:
            prompt = _ids(top_prompt, "prompt_token_ids", IDS_SETTING)
        else:
            prompt = _ids(
                choice.get("prompt_token_ids"), f"choices[{index}].prompt_token_ids", IDS_SETTING
            )
        generated = _ids(choice.get("token_ids"), f"choices[{index}].token_ids", IDS_SETTING)
        log_probs = _log_probs(choice, dialect, index)
        if len(log_probs) != len(generated):
            raise EngineAnswerError(
                f"the engine's choices[{index}] has {len(generated)} token ids but "
                f"{len(log_probs)} log probs; a capture needs one log prob per generated token"
            )
        if dialect == CHAT:
            items = message_item(choice.get("message"))
        elif dialect == COMPLETIONS:
            items = message_item({"content": choice.get("text")})
        else:
            items = []
        spans = choice.get("weight_versions")
        experts = choice.get("routed_experts")
        calls.append(ChoiceCall(index, prompt, generated, log_probs, items, spans, experts))
    return calls
