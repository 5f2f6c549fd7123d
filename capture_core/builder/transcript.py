"""Model-authored content of a transcript: assistant text and tool calls, across dialects.

Responses items, Chat `choices[].message` (with `tool_calls`) and `tool_use` blocks read
the same way: assistant text, and tool calls as name plus canonical JSON arguments, so
re-serialised arguments still compare equal. Reasoning items are transparent; tool
results, user messages and anything else separate turns.
This module imports nothing from the project.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

_BREAK = None
# Results of the transcript's own tool calls: a transcript may end in them (the harness
# ran the final call's tool, a submit, say) without a later model turn.
TOOL_OUTPUT_TYPES = frozenset(
    {"function_call_output", "tool_result", "custom_tool_call_output", "computer_call_output"}
)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(part.get("text", ""))
            for part in content
            if isinstance(part, Mapping) and part.get("type") in ("output_text", "text")
        )
    return ""


def _canonical_arguments(arguments: Any) -> str:
    """Tool-call arguments as canonical JSON, so re-serialised arguments still compare equal."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return arguments
    return json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _tool_call(call: Any) -> tuple[str, str, str]:
    function = call.get("function", call) if isinstance(call, Mapping) else {}
    return ("call", str(function.get("name", "")), _canonical_arguments(function.get("arguments")))


def _message_keys(item: Mapping[str, Any]) -> list[tuple[str, ...]] | None:
    """An assistant message's text and tool calls; `None` for other roles (they break a block)."""
    if item.get("role", "assistant") != "assistant":
        return None
    keys: list[tuple[str, ...]] = []
    text = _text(item.get("content"))
    if text:
        keys.append(("text", text))
    keys.extend(_tool_call(call) for call in item.get("tool_calls") or ())
    return keys


_ITEM_READERS: dict[str, Callable[[Mapping[str, Any]], list[tuple[str, ...]] | None]] = {
    "message": _message_keys,
    "function_call": lambda item: [
        ("call", str(item.get("name", "")), _canonical_arguments(item.get("arguments")))
    ],
    "tool_use": lambda item: [
        ("call", str(item.get("name", "")), _canonical_arguments(item.get("input")))
    ],
    "reasoning": lambda item: [],
}


def _item_kind(item: Mapping[str, Any]) -> str:
    return str(item.get("type") or ("message" if "role" in item else ""))


def _item_keys(item: Any) -> list[tuple[str, ...]] | None:
    """Model-authored keys of one item; `[]` for transparent items, `None` for a break."""
    if not isinstance(item, Mapping):
        return _BREAK
    reader = _ITEM_READERS.get(_item_kind(item))
    return reader(item) if reader is not None else _BREAK


def is_tool_output(item: Any) -> bool:
    """Whether an item is the result of a tool call (a Responses output or a Chat tool turn)."""
    if not isinstance(item, Mapping):
        return False
    kind = _item_kind(item)
    return kind in TOOL_OUTPUT_TYPES or (kind == "message" and item.get("role") == "tool")


def transcript_readings(items: Sequence[Any]) -> tuple[tuple, tuple]:
    """The model-authored keys of a transcript: all of them, and its trailing block.

    The trailing block is the last run of model-authored items. Tool results after it are
    skipped (the harness ran the final call's tool and kept its output), but any other item
    after it, or a model turn after those results, starts over: the block is always the
    last model turn of the transcript.
    """
    full: list[tuple[str, ...]] = []
    trailing: list[tuple[str, ...]] = []
    after_tool_output = False
    for item in items:
        keys = _item_keys(item)
        if keys is _BREAK:
            after_tool_output = is_tool_output(item)
            if not after_tool_output:
                trailing = []
            continue
        if after_tool_output:
            trailing, after_tool_output = [], False
        full.extend(keys)
        trailing.extend(keys)
    return tuple(full), tuple(trailing)


def ends_in_silent_turn(items: Sequence[Any]) -> bool:
    """Whether the transcript's last model turn (after any trailing tool results) authored
    nothing readable: only reasoning, or an empty message (a call cut off while thinking).

    Such a turn was produced by a call the readings cannot see, so no call can be matched
    to the transcript's end by content.
    """
    seen_turn = False
    for item in reversed(items):
        keys = _item_keys(item)
        if keys is _BREAK:
            if seen_turn or not is_tool_output(item):
                break
            continue
        if keys:
            return False
        seen_turn = True
    return seen_turn


def own_items(output_items: Sequence[Any]) -> tuple:
    """A call's own model-authored keys, from its captured content items."""
    return transcript_readings(output_items)[0]
