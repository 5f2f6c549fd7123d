"""The model-authored content of captured calls and of the scored response, read once a build.

A call's own content is the keys of its captured output items (`entry_fingerprint`); the
scored response's is its items and their readings (`transcript.transcript_readings`).
`ContentReader` remembers each with the object it was read from, so the witnesses and the
retry settling of one build read every call once. `path_items` reads the content along a
call's root-to-call path from the tokens alone, for a transcript merged across turns.
This module imports only `records` and `transcript`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from capture_core.builder.transcript import own_items, transcript_readings
from capture_core.records import TokenEntry
from capture_core.records.served import response_items


class ContentReader:
    """Model-authored content, read once per build: each call's own keys, and the scored
    response's items and readings. Each is remembered with the object it was read from, so a
    reader serves one build: content changed in place after it was read is not read again."""

    def __init__(self) -> None:
        self._own: dict[int, tuple[TokenEntry, tuple]] = {}
        self._response: Mapping[str, Any] | None = None
        self._items: list[Any] = []
        self._readings: tuple[tuple, tuple] | None = None

    def own(self, call: TokenEntry) -> tuple:
        """The call's own model-authored keys (`entry_fingerprint`)."""
        found = self._own.get(id(call))
        if found is None or found[0] is not call:
            found = self._own[id(call)] = (call, entry_fingerprint(call))
        return found[1]

    def items(self, response: Mapping[str, Any]) -> list[Any]:
        """The response's items (`response_items`)."""
        if self._response is not response:
            self._items, self._readings = response_items(response), None
            self._response = response
        return self._items

    def readings(self, response: Mapping[str, Any]) -> tuple[tuple, tuple]:
        """The readings of the response's items, all of them and the trailing block
        (`transcript_readings`); a malformed item raises, each time they are asked for."""
        items = self.items(response)
        if self._readings is None:
            self._readings = transcript_readings(items)
        return self._readings


def entry_fingerprint(entry: TokenEntry) -> tuple:
    """A call's own model-authored keys (from its captured content items)."""
    return own_items(entry.output_items)


def extends(prompt: Sequence[int], parent: TokenEntry) -> bool:
    """Whether `parent` generated tokens and its prompt plus generation begins `prompt`."""
    p, g = parent.prompt_token_ids, parent.generation_token_ids
    cut = len(p)
    return bool(g) and prompt[:cut] == p and prompt[cut : cut + len(g)] == g


def path_items(call: TokenEntry, entries: Sequence[TokenEntry], own: Mapping[int, tuple]) -> tuple:
    """The model-authored items along the root-to-`call` path, read from the tokens.

    The calls on the path are those whose sequence is a prefix of `call`'s prompt, one per
    length (identical retries are one call), in order of length.
    """
    ancestors: dict[int, TokenEntry] = {}
    for entry in entries:
        if entry is not call and extends(call.prompt_token_ids, entry):
            length = len(entry.prompt_token_ids) + len(entry.generation_token_ids)
            ancestors.setdefault(length, entry)
    path = [ancestors[n] for n in sorted(ancestors)]
    return tuple(key for entry in (*path, call) for key in own[id(entry)])
