"""A chain projected into a Responses payload, and the prefix-contiguity check of a response.

Each call's content items are emitted without any token arrays they hold; the item that
carried the token arrays gets the whole cumulative prompt so far, the generated ids and log
probs (and routed experts), all from the call. A call without content items yields one
token-only item.
This module imports only `chain`, `records` and `errors`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from capture_core.builder.chain import BuildOutput, Chain
from capture_core.errors import InvalidRecordError, PrefixContiguityError, WrongTypeError
from capture_core.records import TokenEntry
from capture_core.records.token_values import TOKEN_FIELDS

TOKEN_ONLY_ITEM = {"type": "message"}


def _carrier_index(entry: TokenEntry) -> int:
    items = entry.output_items
    if entry.token_item_index is not None:
        return entry.token_item_index
    for i, item in enumerate(items):
        if any(f in item for f in TOKEN_FIELDS):
            return i
    return len(items) - 1


def _content(item: dict[str, Any]) -> dict[str, Any]:
    """A copy of a captured content item without any token arrays it holds: every delivered
    array is a call's own prompt, generation and log probs, never one an item brought."""
    return {key: value for key, value in item.items() if key not in TOKEN_FIELDS}


def project_chain_to_output_items(chain: Chain) -> list[dict[str, Any]]:
    """Emit each call's content items; the carrier item gets the cumulative prompt and tokens.

    Token arrays inside content items are dropped (`_content`), so the carrier's, set from
    the call, are the only ones. A link's prompt is the cumulative prefix so far (the
    builder verified it), so the entry's own list is reused rather than copied. An invalid
    chain raises `ValueError`.
    """
    chain.validate()
    output: list[dict[str, Any]] = []
    for link in chain.links:
        entry = link.entry
        items = [_content(item) for item in entry.output_items] or [dict(TOKEN_ONLY_ITEM)]
        carrier = items[_carrier_index(entry) if entry.output_items else 0]
        carrier["prompt_token_ids"] = entry.prompt_token_ids
        carrier["generation_token_ids"] = entry.generation_token_ids
        carrier["generation_log_probs"] = entry.generation_log_probs
        if entry.routed_experts is not None:
            carrier["routed_experts"] = entry.routed_experts
        output.extend(items)
    return output


def project_main_chain_response(rollout_id: str, out: BuildOutput, model: str = "") -> dict:
    """The main chain as a Responses payload `{id, model, object, output, usage}`.

    `model` is used as given, also when empty. Raises `ValueError` when there is no chain,
    when `per_request` produced several, or when no token was generated.
    """
    if not out.chains:
        raise InvalidRecordError("capture produced no safe trainable chain")
    if out.notes.builder == "per_request" and len(out.chains) > 1:
        raise InvalidRecordError(
            f"per_request built {len(out.chains)} chains; a single response needs exactly one"
        )
    main = out.main_chain
    if main.generated_tokens == 0:
        raise InvalidRecordError("capture produced no trainable generated tokens")
    output = project_chain_to_output_items(main)
    generated = [item for item in output if item.get("generation_token_ids")]
    return {
        "id": f"proj-{rollout_id}",
        "model": model,
        "object": "response",
        "output": output,
        "usage": {
            "input_tokens": len(generated[0]["prompt_token_ids"]),
            "output_tokens": sum(len(item["generation_token_ids"]) for item in generated),
        },
    }


def assert_prefix_contiguity(response: Mapping[str, Any]) -> None:
    """Raise `AssertionError` unless every generated item's prompt extends all tokens before it.

    Takes the whole response; every output item with `generation_token_ids` is checked.
    """
    if not isinstance(response, Mapping):
        raise WrongTypeError(
            "assert_prefix_contiguity takes the whole response dict (with its `output` list), "
            f"not {type(response).__name__}"
        )
    seen_prompt: list[int] = []
    seen_generation: list[int] = []
    for position, item in enumerate(response.get("output") or []):
        if not isinstance(item, Mapping) or item.get("generation_token_ids") is None:
            continue
        generation = item["generation_token_ids"]
        prompt = item.get("prompt_token_ids") or []
        prompt = prompt if isinstance(prompt, list) else list(prompt)
        cut = len(seen_prompt)
        if (
            len(prompt) < cut + len(seen_generation)
            or prompt[:cut] != seen_prompt
            or prompt[cut : cut + len(seen_generation)] != seen_generation
        ):
            raise PrefixContiguityError(
                f"output item {position} breaks prefix contiguity: its prompt does not extend "
                "the tokens of the items before it"
            )
        seen_prompt = prompt
        seen_generation = generation if isinstance(generation, list) else list(generation)
