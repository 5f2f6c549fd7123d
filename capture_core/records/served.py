"""Token arrays in served payloads: find, extract and strip them from Responses `output`
items and Chat Completions `choices[*].message`.

Exactly one item of a served response may carry a call's arrays (the capture could not tell
which call two carriers belong to). These functions read plain dicts; building the captured
record from them is `capture_core.records.token_entry_from_response`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from capture_core.errors import InvalidRecordError
from capture_core.records.token_values import REQUIRED_TOKEN_FIELDS, TOKEN_FIELDS


def response_items(response: Mapping[str, Any]) -> list[Any]:
    """The items that may carry token arrays: Responses `output` or Chat `choices[*].message`."""
    if isinstance(response.get("output"), list):
        return list(response["output"])
    if isinstance(response.get("choices"), list):
        return [c.get("message") if isinstance(c, Mapping) else None for c in response["choices"]]
    return []


def carries_tokens(item: Any) -> bool:
    """Whether an item carries token arrays: any required array present and not null."""
    return isinstance(item, Mapping) and any(
        item.get(field) is not None for field in REQUIRED_TOKEN_FIELDS
    )


def token_carriers(response: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """Every item of a response that may carry token arrays, each with where it sits:
    `response.output[i]` (Responses) and `response.choices[i].message` (Chat Completions).

    Both kinds are read, also when the response has an `output` list (even an empty one)
    beside its `choices`: a carrier finalize did not look at would go out unchecked.
    """
    output = response.get("output")
    found: list[tuple[str, Any]] = [
        (f"response.output[{i}]", item)
        for i, item in enumerate(output if isinstance(output, list) else [])
    ]
    choices = response.get("choices")
    for i, choice in enumerate(choices if isinstance(choices, list) else []):
        message = choice.get("message") if isinstance(choice, Mapping) else None
        found.append((f"response.choices[{i}].message", message))
    return found


def extract_token_fields(response_json: Mapping[str, Any]) -> dict[str, Any] | None:
    """Return the token arrays of a served response, or `None` when no item carries them.

    The result holds the three required arrays and `routed_experts` (possibly `None`),
    NeMo Gym's `TOKEN_FIELDS`. A carrier missing a required array, or two carriers, is an
    error: the capture could not tell which call the arrays belong to.
    """
    carriers = [item for _, item in token_carriers(response_json) if carries_tokens(item)]
    if not carriers:
        return None
    if len(carriers) > 1:
        raise InvalidRecordError(
            f"{len(carriers)} response items carry token arrays; exactly one item may carry "
            "them, so the capture cannot tell which call they belong to"
        )
    item = carriers[0]
    missing = [field for field in REQUIRED_TOKEN_FIELDS if item.get(field) is None]
    if missing:
        raise InvalidRecordError(
            f"a response item carries token arrays but lacks {missing}; a carrier needs "
            "prompt_token_ids, generation_token_ids and generation_log_probs"
        )
    return {field: item.get(field) for field in TOKEN_FIELDS}


def strip_token_fields(items: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int | None]:
    """Return the items without token arrays, and the position of the one that carried them.

    The arrays are kept once, on the entry; `None` when no item carried them. Two carriers
    are an error, as in `extract_token_fields`.
    """
    carriers = [position for position, item in enumerate(items) if carries_tokens(item)]
    if len(carriers) > 1:
        raise InvalidRecordError(
            f"output items {carriers} all carry token arrays; exactly one item may carry them"
        )
    stripped = [
        {key: value for key, value in item.items() if key not in TOKEN_FIELDS} for item in items
    ]
    return stripped, carriers[0] if carriers else None


def response_to_output_items(payload: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The served response's content items, in order, as Responses output items.

    A non-empty Responses `output` gives its mapping items; otherwise each Chat
    `choices[*].message` becomes a `message` item (`type` and `role` filled in when absent).
    Token arrays stay on the items: `strip_token_fields` removes them.
    """
    output = payload.get("output")
    if isinstance(output, list) and output:
        return [dict(item) for item in output if isinstance(item, Mapping)]
    items: list[dict[str, Any]] = []
    choices = payload.get("choices")
    for choice in choices if isinstance(choices, list) else []:
        message = choice.get("message") if isinstance(choice, Mapping) else None
        if isinstance(message, Mapping):
            item = dict(message)
            item.setdefault("type", "message")
            item.setdefault("role", "assistant")
            items.append(item)
    return items
