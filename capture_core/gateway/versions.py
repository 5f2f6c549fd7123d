"""Which weights sampled a captured call: the trainer's version at admission and at
completion, and the engine's own per-token version spans where it reports them.

`start_weight_version` is read from the version source when the gateway admits the call,
`end_weight_version` when the engine's answer is complete (docs/async.md: the start is the
oldest weights that may have sampled a token). vLLM's `/inference/v1/generate` reports
`weight_versions: [{"version", "start", "end"}]` per range of generated tokens; those are
the engine's labels. When the operator says the labels are trainer versions (integers)
they become `generation_weight_versions`, one per token; otherwise the label (the spans'
labels joined by "," when a generation spans several) is `weight_version_label`.
This module imports only `errors`, `store.version_source` and the standard library.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from capture_core.errors import EngineAnswerError
from capture_core.store.version_source import WeightVersionSource

UNSET = "start the gateway without --weight-version-source"
"""How a gateway goes without a version source, for the message naming an unreadable one."""


class VersionReader:
    """The trainer's current version from a source, read off the event loop; `None` when the
    gateway has no source. A source that cannot say raises `InvalidRecordError` naming it."""

    def __init__(self, location: str | None) -> None:
        self.source = None if location is None else WeightVersionSource(location, unset=UNSET)

    async def current(self) -> int | None:
        if self.source is None:
            return None
        return await asyncio.to_thread(self.source.current)


def _span(value: Any) -> tuple[Any, int, int]:
    if not isinstance(value, Mapping):
        raise EngineAnswerError("the engine's weight_versions holds an entry that is not an object")
    start, end = value.get("start"), value.get("end")
    if type(start) is not int or type(end) is not int or start < 0 or end < start:
        raise EngineAnswerError(
            f"the engine's weight_versions span {dict(value)!r} has no valid start and end"
        )
    return value.get("version"), start, end


def span_labels(spans: Any, generated: int) -> list[Any]:
    """One engine label per generated token from spans that tile the generation (ends
    exclusive, or inclusive: whichever tiles it). Raises `EngineAnswerError` otherwise."""
    if not isinstance(spans, list) or not spans:
        raise EngineAnswerError("the engine's weight_versions is not a list of spans")
    parsed = sorted((_span(s) for s in spans), key=lambda s: s[1])
    for inclusive in (0, 1):
        position, labels = 0, []
        for label, start, end in parsed:
            if start != position:
                break
            labels.extend([label] * (end + inclusive - start))
            position = end + inclusive
        else:
            if position == generated:
                return labels
    raise EngineAnswerError(
        f"the engine's weight_versions spans {[(s, e) for _, s, e in parsed]} do not cover the "
        f"{generated} generated tokens exactly once, so no token's version can be trusted"
    )


def engine_provenance(spans: Any, generated: int, labels_are_versions: bool) -> dict[str, Any]:
    """The provenance fields the engine's spans give a call (none without spans)."""
    if spans is None or generated == 0:
        return {}
    labels = span_labels(spans, generated)
    if labels_are_versions:
        versions = []
        for label in labels:
            text = str(label)
            if isinstance(label, bool) or not text.isdigit():
                raise EngineAnswerError(
                    f"the engine's weight version {label!r} is not a trainer version (an "
                    "integer 0 or more); start the gateway without the option that says the "
                    "engine's labels are trainer versions, to keep it as a label"
                )
            versions.append(int(text))
        return {"generation_weight_versions": versions}
    distinct = list(dict.fromkeys(str(label) for label in labels))
    return {"weight_version_label": ",".join(distinct)}
