"""The gateway captures every call exactly: what the engine saw and sampled, written before
the client has the answer, the client's answer as the engine would have given it.

A real `tokcap gateway` subprocess in front of a fake engine in vLLM's shapes
(tests/support/fake_engine.py), over a real local store.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from capture_core.store import TokenCaptureStore
from tests.support.fake_engine import FakeEngine, render
from tests.support.gateway_process import GatewayProcess, chunks_of, post, stream_events
from tests.support.servers import free_port

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}
TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def engine() -> Iterator[FakeEngine]:
    fake = FakeEngine(free_port()).start()
    yield fake
    fake.stop()


@pytest.fixture(scope="module")
def store_root(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("gateway-store"))


@pytest.fixture(scope="module")
def gateway(engine: FakeEngine, store_root: str) -> Iterator[GatewayProcess]:
    with GatewayProcess(engine.url, store_root, "--replica", "r-1") as running:
        yield running


@pytest.fixture()
def rollout() -> str:
    return f"ro-{uuid.uuid4().hex[:12]}"


@pytest.fixture(autouse=True)
def _healthy_engine(engine: FakeEngine) -> None:
    engine.set()


def entries(store_root: str, rollout_id: str) -> list[Any]:
    store = TokenCaptureStore(store_root)
    try:
        return sorted(store.read_entries(rollout_id), key=lambda e: e.model_call_id)
    finally:
        store.close_now()


def direct(engine: FakeEngine, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """What the engine answers the client's own request, straight."""
    return post(f"{engine.url}/v1{path}", body).json()


def test_chat_answer_is_the_engines_and_its_capture_holds_the_engines_ids(
    gateway: GatewayProcess, engine: FakeEngine, store_root: str, rollout: str
) -> None:
    answer = post(gateway.session(rollout) + "/chat/completions", CHAT)
    assert answer.status_code == 200
    assert answer.json() == direct(engine, "/chat/completions", CHAT)
    forwarded = engine.seen()["requests"][0]["body"]
    assert forwarded["logprobs"] is True and forwarded["top_logprobs"] == 0
    assert forwarded["return_token_ids"] is True
    (entry,) = entries(store_root, rollout)
    full = direct(engine, "/chat/completions", {**CHAT, "logprobs": True, "return_token_ids": True})
    choice = full["choices"][0]
    assert entry.prompt_token_ids == full["prompt_token_ids"] == render(CHAT["messages"])
    assert entry.generation_token_ids == choice["token_ids"]
    assert entry.generation_log_probs == [c["logprob"] for c in choice["logprobs"]["content"]]
    assert entry.output_items == [
        {"type": "message", "role": "assistant", "content": choice["message"]["content"]}
    ]
    assert entry.token_item_index == 0
    assert (entry.model, entry.replica, entry.response_id) == ("m", "r-1", "chatcmpl-fake")
    assert entry.created_at > 0


def test_fields_the_client_asked_for_come_back(
    gateway: GatewayProcess, engine: FakeEngine, rollout: str
) -> None:
    body = {**CHAT, "logprobs": True, "top_logprobs": 0, "return_token_ids": True}
    answer = post(gateway.session(rollout) + "/chat/completions", body).json()
    assert answer == direct(engine, "/chat/completions", body)
    assert answer["prompt_token_ids"] and answer["choices"][0]["logprobs"]["content"]


def test_a_streamed_chat_relays_every_chunk_and_stores_the_capture_before_done(
    gateway: GatewayProcess, engine: FakeEngine, store_root: str, rollout: str
) -> None:
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    events: list[str] = []
    stored_at_done = None
    for data in stream_events(gateway.session(rollout) + "/chat/completions", body):
        if data == "[DONE]":
            stored_at_done = entries(store_root, rollout)
        events.append(data)
    assert events[-1] == "[DONE]"
    with httpx.stream("POST", f"{engine.url}/v1/chat/completions", json=body) as straight:
        expected = [json.loads(line[6:]) for line in straight.iter_lines() if line[6:7] == "{"]
    assert chunks_of(events) == expected
    assert stored_at_done is not None and len(stored_at_done) == 1
    (entry,) = stored_at_done
    unstreamed = post(
        gateway.session(rollout + "-u") + "/chat/completions", CHAT
    ).json()  # the same call unstreamed, in another rollout
    (whole,) = entries(store_root, rollout + "-u")
    assert entry.prompt_token_ids == whole.prompt_token_ids
    assert entry.generation_token_ids == whole.generation_token_ids
    assert entry.generation_log_probs == whole.generation_log_probs
    assert entry.output_items == whole.output_items
    assert unstreamed["choices"][0]["message"]["content"] == entry.output_items[0]["content"]


@pytest.mark.parametrize("stream", [False, True])
def test_tool_calls_are_captured_as_the_message_that_made_them(
    gateway: GatewayProcess, store_root: str, rollout: str, stream: bool
) -> None:
    body = {**CHAT, "tools": TOOLS, "stream": stream}
    url = gateway.session(rollout) + "/chat/completions"
    if stream:
        assert list(stream_events(url, body))[-1] == "[DONE]"
    else:
        assert post(url, body).status_code == 200
    (entry,) = entries(store_root, rollout)
    call = {"id": "call_0", "type": "function",
            "function": {"name": "lookup", "arguments": '{"x": 0}'}}  # fmt: skip
    assert entry.output_items == [{"type": "message", "role": "assistant", "tool_calls": [call]}]
    assert entry.generation_token_ids[-1] == 2  # the engine's end token, from its ids


@pytest.mark.parametrize("stream", [False, True])
def test_each_of_n_choices_is_its_own_call(
    gateway: GatewayProcess, store_root: str, rollout: str, stream: bool
) -> None:
    body = {**CHAT, "n": 3, "stream": stream}
    url = gateway.session(rollout) + "/chat/completions"
    if stream:
        chunks = chunks_of(list(stream_events(url, body)))
        assert {c["index"] for chunk in chunks for c in chunk["choices"]} == {0, 1, 2}
    else:
        assert len(post(url, body).json()["choices"]) == 3
    captured = entries(store_root, rollout)
    assert len(captured) == 3
    assert len({e.model_call_id for e in captured}) == 3
    texts = sorted(e.output_items[0]["content"] for e in captured)
    assert texts == ["reply 1.0", "reply 1.1", "reply 1.2"]
    assert all(e.response_id is None for e in captured)  # n calls share one answer id


@pytest.mark.parametrize("stream", [False, True])
def test_completions_capture_each_prompt_of_a_batch(
    gateway: GatewayProcess, engine: FakeEngine, store_root: str, rollout: str, stream: bool
) -> None:
    body = {"model": "m", "prompt": ["ab", [40, 41, 42]], "max_tokens": 8, "stream": stream}
    url = gateway.session(rollout) + "/completions"
    if stream:
        chunks = chunks_of(list(stream_events(url, body)))
        assert all("token_ids" not in c and c["logprobs"] is None
                   for chunk in chunks for c in chunk["choices"])  # fmt: skip
    else:
        answer = post(url, body).json()
        assert answer == direct(engine, "/completions", body)
    captured = sorted(entries(store_root, rollout), key=lambda e: len(e.prompt_token_ids))
    assert [e.prompt_token_ids for e in captured] == [[107, 108], [40, 41, 42]]
    full = direct(engine, "/completions", {**body, "stream": False, "logprobs": 0,
                                            "return_token_ids": True})  # fmt: skip
    by_prompt = {tuple(c["prompt_token_ids"]): c for c in full["choices"]}
    for entry in captured:
        choice = by_prompt[tuple(entry.prompt_token_ids)]
        assert entry.generation_token_ids == choice["token_ids"]
        assert entry.generation_log_probs == choice["logprobs"]["token_logprobs"]


def test_a_path_outside_the_prefix_is_forwarded_and_nothing_is_captured(
    gateway: GatewayProcess, engine: FakeEngine, store_root: str
) -> None:
    answer = post(gateway.url + "/v1/chat/completions", CHAT)
    assert answer.json() == direct(engine, "/chat/completions", CHAT)
    assert "return_token_ids" not in engine.seen()["requests"][0]["body"]


def test_an_unobserved_path_under_the_prefix_marks_its_rollout_incomplete(
    gateway: GatewayProcess, store_root: str, rollout: str
) -> None:
    models = httpx.get(gateway.session(rollout) + "/models", timeout=30)
    assert models.json()["data"][0]["id"] == "fake"  # a read samples nothing: not a loss
    post(gateway.session(rollout) + "/responses", {"model": "m", "input": "hi"})
    store = TokenCaptureStore(store_root)
    snapshot = store.freeze_now(rollout)
    assert snapshot.incomplete
    assert any("unobserved_path" in reason for reason in snapshot.incomplete_reasons)


def test_health_names_the_engine_when_it_is_down(
    gateway: GatewayProcess, engine: FakeEngine
) -> None:
    assert httpx.get(gateway.url + "/health", timeout=30).status_code == 200
    engine.set(unhealthy=True)
    down = httpx.get(gateway.url + "/health", timeout=30)
    assert down.status_code == 503 and engine.url in down.json()["error"]["message"]


def test_metrics_count_calls_and_capture_writes(gateway: GatewayProcess, rollout: str) -> None:
    post(gateway.session(rollout) + "/chat/completions", CHAT)
    text = httpx.get(gateway.url + "/metrics", timeout=30).text
    assert 'tokcap_gateway_calls_total{dialect="chat",outcome="captured"}' in text
    assert "tokcap_gateway_capture_write_seconds_count" in text
    assert 'tokcap_gateway_lost_calls_total{cause="client_disconnected"}' in text
    written = [
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith("tokcap_gateway_captured_bytes_total")
    ]
    assert written and written[0] > 0


@pytest.mark.integrity
@pytest.mark.parametrize("stream", ["true", 1, "false"])
def test_a_stream_flag_that_is_not_a_boolean_is_refused_naming_it(
    gateway: GatewayProcess, engine: FakeEngine, store_root: str, rollout: str, stream: Any
) -> None:
    answer = post(gateway.session(rollout) + "/chat/completions", {**CHAT, "stream": stream})
    assert answer.status_code == 400
    assert "stream" in answer.json()["error"]["message"]
    assert engine.seen()["requests"] == []
    assert TokenCaptureStore(store_root).read_entries(rollout) == []


def test_metrics_list_every_lost_call_cause_the_gateway_reports(gateway: GatewayProcess) -> None:
    text = httpx.get(gateway.url + "/metrics", timeout=30).text
    listed = {
        line.split('cause="')[1].split('"')[0]
        for line in text.splitlines()
        if line.startswith("tokcap_gateway_lost_calls_total{")
    }
    assert "unusable_answer" in listed  # an answer without ids: the commonest engine fault
    assert "missing_ids" not in listed  # no cause that nothing reports


@pytest.mark.integrity
@pytest.mark.parametrize(
    "body",
    [
        {**CHAT, "n": 1025},
        {"model": "m", "prompt": ["a"] * 513, "n": 2},  # 1026 calls: prompts times n
    ],
)
def test_a_request_for_more_calls_than_the_limit_is_refused_naming_it(
    gateway: GatewayProcess, engine: FakeEngine, store_root: str, rollout: str, body: Any
) -> None:
    path = "/chat/completions" if "messages" in body else "/completions"
    answer = post(gateway.session(rollout) + path, body)
    assert answer.status_code == 400
    assert "1024" in answer.json()["error"]["message"]
    assert engine.seen()["requests"] == []
    assert TokenCaptureStore(store_root).freeze_now(rollout).version == 0  # nothing written


@pytest.mark.integrity
@pytest.mark.parametrize("stream", [False, True])
def test_a_chat_request_with_echo_is_refused_naming_it(
    gateway: GatewayProcess, engine: FakeEngine, store_root: str, rollout: str, stream: bool
) -> None:
    body = {**CHAT, "echo": True, "stream": stream}
    answer = post(gateway.session(rollout) + "/chat/completions", body)
    assert answer.status_code == 400
    assert "echo" in answer.json()["error"]["message"]
    assert engine.seen()["requests"] == []
    assert TokenCaptureStore(store_root).read_entries(rollout) == []


@pytest.mark.integrity
def test_top_logprobs_without_logprobs_is_refused_as_the_engine_refuses_it(
    gateway: GatewayProcess, engine: FakeEngine, store_root: str, rollout: str
) -> None:
    body = {**CHAT, "top_logprobs": 3}
    straight = post(f"{engine.url}/v1/chat/completions", body)
    engine.set()  # forget the direct request
    answer = post(gateway.session(rollout) + "/chat/completions", body)
    assert answer.status_code == straight.status_code == 400
    assert "top_logprobs" in answer.json()["error"]["message"]
    assert engine.seen()["requests"] == []
    assert TokenCaptureStore(store_root).read_entries(rollout) == []


def test_top_logprobs_the_client_asked_for_come_back_and_the_capture_is_the_sampled_ones(
    gateway: GatewayProcess, engine: FakeEngine, store_root: str, rollout: str
) -> None:
    for body in ({**CHAT, "top_logprobs": 0}, {**CHAT, "logprobs": True, "top_logprobs": 3}):
        engine.set()
        answer = post(gateway.session(rollout) + "/chat/completions", body)
        assert answer.status_code == 200
        assert answer.json() == direct(engine, "/chat/completions", body)
    forwarded = engine.seen()["requests"][0]["body"]
    assert forwarded["logprobs"] is True and forwarded["top_logprobs"] == 3
    full = direct(engine, "/chat/completions", {**body, "return_token_ids": True})
    content = full["choices"][0]["logprobs"]["content"]
    assert all(len(c["top_logprobs"]) == 3 for c in content)
    assert [e.generation_log_probs for e in entries(store_root, rollout)] == [
        [c["logprob"] for c in content]
    ] * 2
