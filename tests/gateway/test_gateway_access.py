"""Who may write and how much: keys, limits, and a clean stop. A real `tokcap gateway` in
front of the fake engine (tests/support/fake_engine.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from capture_core.errors import InvalidInputError
from capture_core.store import TokenCaptureStore
from tests.support.fake_engine import FakeEngine
from tests.support.gateway_process import ROOT, GatewayProcess, post, stream_events
from tests.support.servers import free_port, wait_until

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}
GATEWAY_KEY = "gw-secret-" + uuid.uuid4().hex
ENGINE_KEY = "engine-secret-" + uuid.uuid4().hex


@pytest.fixture(scope="module")
def engine() -> Iterator[FakeEngine]:
    fake = FakeEngine(free_port()).start()
    yield fake
    fake.stop()


@pytest.fixture(autouse=True)
def _healthy_engine(engine: FakeEngine) -> None:
    engine.set()


@pytest.fixture()
def rollout() -> str:
    return f"ro-{uuid.uuid4().hex[:12]}"


def listed(root: str) -> list[str]:
    return sorted(name for name in os.listdir(root) if not name.startswith("."))


@pytest.mark.integrity
def test_a_gateway_beyond_loopback_without_a_key_does_not_start(
    engine: FakeEngine, tmp_path: Any
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TOKCAP_GATEWAY_API_KEY"}
    command = [sys.executable, "-m", "tokcap.flows.cli", "gateway", "--engine", engine.url,
               "--store", str(tmp_path), "--host", "0.0.0.0", "--port", "0"]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "--host" in done.stderr and "--api-key" in done.stderr
    assert done.stdout == ""


@pytest.mark.integrity
def test_every_call_needs_the_key_and_nothing_is_recorded_without_it(
    engine: FakeEngine, tmp_path: Any, rollout: str
) -> None:
    root = str(tmp_path / "store")
    env = {"TOKCAP_GATEWAY_API_KEY": GATEWAY_KEY, "TOKCAP_ENGINE_API_KEY": ENGINE_KEY}
    with GatewayProcess(engine.url, root, "--host", "0.0.0.0", env=env) as gateway:
        assert gateway.url.startswith("http://0.0.0.0:")
        url = gateway.url.replace("0.0.0.0", "127.0.0.1")
        session = f"{url}/ng-rollout/{rollout}/training-token-capture/v1/chat/completions"
        for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": GATEWAY_KEY}):
            refused = post(session, CHAT, headers=headers)
            assert refused.status_code == 401
            assert "API key" in refused.json()["error"]["message"]
        assert httpx.get(url + "/metrics", timeout=30).status_code == 401
        assert engine.seen()["requests"] == []
        assert not os.path.exists(root) or listed(root) == []
        engine.set(require_key=ENGINE_KEY)
        answer = post(session, CHAT, headers={"authorization": f"Bearer {GATEWAY_KEY}"})
        assert answer.status_code == 200
        (seen,) = engine.seen()["requests"]
        assert seen["headers"]["authorization"] == f"Bearer {ENGINE_KEY}"
        assert len(TokenCaptureStore(root).read_entries(rollout)) == 1
    assert GATEWAY_KEY not in gateway.stderr() and ENGINE_KEY not in gateway.stderr()


def test_without_a_gateway_key_the_clients_key_is_the_engines(
    engine: FakeEngine, tmp_path: Any, rollout: str
) -> None:
    engine.set(require_key=ENGINE_KEY)
    with GatewayProcess(engine.url, str(tmp_path / "store")) as gateway:
        url = gateway.session(rollout) + "/chat/completions"
        answer = post(url, CHAT, headers={"authorization": f"Bearer {ENGINE_KEY}"})
        assert answer.status_code == 200
        assert post(url, CHAT).status_code == 401  # the engine's refusal, passed on


@pytest.fixture(scope="module")
def bounded(
    engine: FakeEngine, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[GatewayProcess, str]]:
    root = str(tmp_path_factory.mktemp("bounded"))
    args = ("--max-body-bytes", "2000", "--max-answer-bytes", "4000")
    with GatewayProcess(engine.url, root, *args) as gateway:
        yield gateway, root


@pytest.mark.integrity
def test_a_body_past_the_limit_is_refused_naming_it(
    bounded: tuple[GatewayProcess, str], engine: FakeEngine, rollout: str
) -> None:
    gateway, root = bounded
    body = {"model": "m", "messages": [{"role": "user", "content": "x" * 3000}]}
    refused = post(gateway.session(rollout) + "/chat/completions", body)
    assert refused.status_code == 413
    assert "2000 bytes" in refused.json()["error"]["message"]
    assert engine.seen()["requests"] == []
    assert rollout not in listed(root)


@pytest.mark.integrity
@pytest.mark.parametrize("stream", [False, True])
def test_a_generation_past_the_limit_fails_the_call_naming_it(
    bounded: tuple[GatewayProcess, str], engine: FakeEngine, rollout: str, stream: bool
) -> None:
    gateway, root = bounded
    engine.set(reply_tokens=3000)
    url = gateway.session(rollout) + "/chat/completions"
    if stream:
        events = list(stream_events(url, {**CHAT, "stream": True}))
        assert "[DONE]" not in events
        message = json.loads(events[-1])["error"]["message"]
    else:
        refused = post(url, CHAT)
        assert refused.status_code == 413
        message = refused.json()["error"]["message"]
    assert "4000 bytes" in message
    snapshot = TokenCaptureStore(root).freeze_now(rollout)
    assert snapshot.incomplete and not snapshot.entries
    assert any("answer_too_large" in reason for reason in snapshot.incomplete_reasons)


@pytest.mark.integrity
def test_a_streamed_line_that_never_ends_fails_the_call_at_the_limit(
    bounded: tuple[GatewayProcess, str], engine: FakeEngine, rollout: str
) -> None:
    """An engine event without a newline is counted as its bytes arrive: the call fails at
    the limit, naming it, rather than the gateway holding the line until it ends (never)."""
    gateway, root = bounded
    engine.set(endless_line=True)
    url = gateway.session(rollout) + "/chat/completions"
    started = time.monotonic()
    with httpx.stream("POST", url, json={**CHAT, "stream": True}, timeout=20) as response:
        events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert time.monotonic() - started < 20
    assert "[DONE]" not in events
    assert "4000 bytes" in json.loads(events[-1])["error"]["message"]
    snapshot = TokenCaptureStore(root).freeze_now(rollout)
    assert snapshot.incomplete and not snapshot.entries
    assert any("answer_too_large" in reason for reason in snapshot.incomplete_reasons)


def test_sigterm_lets_the_call_in_flight_finish_then_exits_0(
    engine: FakeEngine, tmp_path: Any, rollout: str
) -> None:
    root = str(tmp_path / "store")
    gateway = GatewayProcess(engine.url, root).start()
    engine.set(chunk_delay=0.05, reply_tokens=40)
    events: list[str] = []
    url = gateway.session(rollout) + "/chat/completions"
    reader = threading.Thread(
        target=lambda: events.extend(stream_events(url, {**CHAT, "stream": True}))
    )
    reader.start()
    wait_until(lambda: engine.seen()["requests"], 30, "the engine to get the call")
    assert gateway.proc is not None
    gateway.proc.send_signal(signal.SIGTERM)
    reader.join(timeout=60)
    assert gateway.proc.wait(timeout=60) == 0
    assert events[-1] == "[DONE]"
    (entry,) = TokenCaptureStore(root).freeze_now(rollout).entries
    assert len(entry.generation_token_ids) == 40


@pytest.mark.integrity
@pytest.mark.parametrize("stream", [False, True])
def test_calls_a_sigterm_cuts_after_its_grace_are_recorded_lost_to_the_shutdown(
    engine: FakeEngine, tmp_path: Any, rollout: str, stream: bool
) -> None:
    root = str(tmp_path / "store")
    gateway = GatewayProcess(engine.url, root, "--shutdown-grace", "1").start()
    engine.set(chunk_delay=0.5, reply_tokens=100) if stream else engine.set(delay=60)
    url = gateway.session(rollout) + "/chat/completions"
    body = {**CHAT, "stream": stream}
    answers: list[Any] = []

    def call() -> None:
        try:
            with httpx.stream("POST", url, json=body, timeout=90) as response:
                answers.append([line for line in response.iter_lines() if line])
        except httpx.HTTPError as exc:  # the cut connection
            answers.append(exc)

    caller = threading.Thread(target=call)
    caller.start()
    wait_until(lambda: engine.seen()["requests"], 30, "the engine to get the call")
    assert gateway.proc is not None
    gateway.proc.send_signal(signal.SIGTERM)
    assert gateway.proc.wait(timeout=60) == 0
    caller.join(timeout=60)
    assert answers and "data: [DONE]" not in (answers[0] if isinstance(answers[0], list) else [])
    snapshot = TokenCaptureStore(root).freeze_now(rollout)
    assert snapshot.incomplete and not snapshot.entries
    reasons = " ".join(snapshot.incomplete_reasons)
    assert "gateway_shutdown" in reasons and "client_disconnected" not in reasons
    assert "cause=gateway_shutdown" in gateway.stderr()


@pytest.mark.integrity
def test_credentials_in_the_engine_url_reach_no_answer_log_or_capture(
    tmp_path: Any, rollout: str
) -> None:
    secret = "pw-" + uuid.uuid4().hex
    fake = FakeEngine(free_port()).start()
    root = str(tmp_path / "store")
    engine_url = fake.url.replace("http://", f"http://operator:{secret}@")
    try:
        with GatewayProcess(engine_url, root) as gateway:
            url = gateway.session(rollout) + "/chat/completions"
            assert post(url, CHAT).status_code == 200
            fake.stop()  # now every message names the engine
            down = [post(url, CHAT), httpx.get(gateway.url + "/health", timeout=30)]
            down.append(post(gateway.url + "/v1/chat/completions", CHAT))
            for answer in down:
                assert answer.status_code in (502, 503) and "127.0.0.1" in answer.text
                assert secret not in answer.text
        store = TokenCaptureStore(root)
        captured = [entry.model_dump_json() for entry in store.read_entries(rollout)]
        store.close_now()
        assert captured and all(secret not in text for text in captured)
        assert secret not in gateway.stderr()
    finally:
        fake.stop()


@pytest.mark.integrity
@pytest.mark.parametrize(
    "url",
    ["ftp://user:s3cret@engine:8000", "user:s3cret@engine:8000", "http://user:s3cret@engine/v1"],
)
def test_a_refused_engine_url_is_named_without_its_credentials(url: str) -> None:
    from capture_core.gateway.settings import GatewaySettings

    with pytest.raises(InvalidInputError) as refused:
        GatewaySettings(engine=url)
    assert "s3cret" not in str(refused.value) and "engine" in str(refused.value)
