"""Faults: each leaves the store saying what happened, and no client takes an uncaptured or
partial generation for a whole one. A real `tokcap gateway` in front of a fake engine with
fault switches (tests/support/fake_engine.py), over real local and S3 (moto) stores.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import psutil
import pytest

from capture_core.store import TokenCaptureStore
from tests.support.fake_engine import FakeEngine
from tests.support.gateway_process import GatewayProcess, post, stream_events
from tests.support.servers import FAKE_AWS_ENV, free_port, wait_until

pytestmark = pytest.mark.integrity
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}


@pytest.fixture(scope="module")
def engine() -> Iterator[FakeEngine]:
    fake = FakeEngine(free_port()).start()
    yield fake
    fake.stop()


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("fault-store"))


@pytest.fixture(scope="module")
def gateway(engine: FakeEngine, root: str) -> Iterator[GatewayProcess]:
    with GatewayProcess(engine.url, root, "--engine-timeout", "2") as running:
        yield running


@pytest.fixture(autouse=True)
def _healthy_engine(engine: FakeEngine) -> None:
    engine.set()


@pytest.fixture()
def rollout() -> str:
    return f"ro-{uuid.uuid4().hex[:12]}"


def frozen(root: str, rollout_id: str) -> Any:
    store = TokenCaptureStore(root)
    try:
        return store.freeze_now(rollout_id)
    finally:
        store.close_now()


def assert_lost(root: str, rollout_id: str, cause: str) -> None:
    """The rollout holds no entry and is incomplete for `cause`."""
    snapshot = frozen(root, rollout_id)
    assert snapshot.entries == ()
    assert snapshot.incomplete
    assert any(cause in reason for reason in snapshot.incomplete_reasons), snapshot


def streamed(url: str, body: dict[str, Any]) -> list[str]:
    return list(stream_events(url, {**body, "stream": True}))


@pytest.mark.parametrize(
    ("missing", "setting"),
    [
        ("prompt_token_ids", "return_token_ids: true"),
        ("token_ids", "return_token_ids: true"),
        ("logprobs", "logprobs: true"),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
def test_an_answer_without_an_id_field_fails_the_call_naming_it(
    gateway: GatewayProcess,
    engine: FakeEngine,
    root: str,
    rollout: str,
    missing: str,
    setting: str,
    stream: bool,
) -> None:
    engine.set(missing=missing)
    url = gateway.session(rollout) + "/chat/completions"
    if stream:
        events = streamed(url, CHAT)
        assert "[DONE]" not in events
        message = json.loads(events[-1])["error"]["message"]
    else:
        answer = post(url, CHAT)
        assert answer.status_code == 502
        assert "choices" not in answer.json()
        message = answer.json()["error"]["message"]
    assert missing in message and setting in message
    assert_lost(root, rollout, "unusable_answer")


@pytest.mark.parametrize("stream", [False, True])
def test_an_engine_error_reaches_the_client_with_its_status_and_the_call_is_lost(
    gateway: GatewayProcess, engine: FakeEngine, root: str, rollout: str, stream: bool
) -> None:
    engine.set(status=503)
    answer = post(gateway.session(rollout) + "/chat/completions", {**CHAT, "stream": stream})
    assert answer.status_code == 503
    assert answer.json()["error"]["message"] == "engine fault"
    assert_lost(root, rollout, "engine_error")


def test_an_engine_that_does_not_answer_in_time_times_the_call_out(
    gateway: GatewayProcess, engine: FakeEngine, root: str, rollout: str
) -> None:
    engine.set(delay=6)
    answer = post(gateway.session(rollout) + "/chat/completions", CHAT)
    assert answer.status_code == 504
    assert_lost(root, rollout, "engine_timeout")


def test_a_stream_that_stalls_past_the_timeout_ends_in_an_error(
    gateway: GatewayProcess, engine: FakeEngine, root: str, rollout: str
) -> None:
    engine.set(chunk_delay=6, reply_tokens=10)
    events = streamed(gateway.session(rollout) + "/chat/completions", CHAT)
    assert "[DONE]" not in events and "error" in json.loads(events[-1])
    assert_lost(root, rollout, "engine_timeout")


def test_a_client_that_hangs_up_mid_stream_aborts_the_engine_and_loses_the_call(
    gateway: GatewayProcess, engine: FakeEngine, root: str, rollout: str
) -> None:
    engine.set(chunk_delay=0.1, reply_tokens=400)
    url = gateway.session(rollout) + "/chat/completions"
    with httpx.stream("POST", url, json={**CHAT, "stream": True}, timeout=60) as response:
        lines = response.iter_lines()
        got = [line for line, _ in zip(lines, range(6), strict=False) if line]
    assert len(got) >= 2
    wait_until(lambda: engine.seen()["aborted"] == 1, 60, "the engine's request to be aborted")
    assert engine.seen()["completed"] == 0
    wait_until(lambda: f"rollout={rollout}" in gateway.stderr(), 30, "the lost-call log line")
    assert_lost(root, rollout, "client_disconnected")
    line = next(x for x in gateway.stderr().splitlines() if f"rollout={rollout}" in x)
    assert "lost call:" in line and "call=gw-" in line and "cause=client_disconnected" in line


def test_a_stream_the_engine_breaks_off_ends_in_an_error_never_done(
    gateway: GatewayProcess, engine: FakeEngine, root: str, rollout: str
) -> None:
    engine.set(drop_after=4)
    events = streamed(gateway.session(rollout) + "/chat/completions", CHAT)
    assert "[DONE]" not in events
    assert "broke off" in json.loads(events[-1])["error"]["message"]
    assert_lost(root, rollout, "engine_dropped")


def test_an_engine_restarted_mid_call_loses_that_call_and_serves_the_next(
    tmp_path: Any, rollout: str
) -> None:
    port = free_port()
    first = FakeEngine(port).start()
    root = str(tmp_path / "store")
    try:
        with GatewayProcess(first.url, root) as gateway:
            first.set(chunk_delay=0.2, reply_tokens=200)
            events: list[str] = []
            url = gateway.session(rollout) + "/chat/completions"
            reader = threading.Thread(target=lambda: events.extend(streamed(url, CHAT)))
            reader.start()
            wait_until(lambda: len(events) >= 0 and first.seen()["requests"], 30, "the call")
            first.stop()  # the engine process dies mid-generation
            reader.join(timeout=60)
            assert events and "[DONE]" not in events and "error" in json.loads(events[-1])
            second = FakeEngine(port).start()  # restarted on the same address
            try:
                after = post(gateway.session(rollout + "-next") + "/chat/completions", CHAT)
                assert after.status_code == 200
            finally:
                second.stop()
        assert_lost(root, rollout, "engine_dropped")
        assert len(frozen(root, rollout + "-next").entries) == 1
    finally:
        first.stop()


def test_a_store_that_fails_the_write_withholds_the_answer(
    gateway: GatewayProcess, engine: FakeEngine, root: str, rollout: str
) -> None:
    engine.set(delay=1.0)
    answers: list[httpx.Response] = []
    url = gateway.session(rollout) + "/chat/completions"
    call = threading.Thread(target=lambda: answers.append(post(url, CHAT)))
    call.start()
    wait_until(lambda: engine.seen()["requests"], 30, "the engine to get the call")
    entries = os.path.join(root, rollout, "e")
    open(entries, "w").close()  # the entry folder cannot be made: every entry write fails
    call.join(timeout=60)
    assert answers[0].status_code == 503
    assert "choices" not in answers[0].json()
    assert "could not store" in answers[0].json()["error"]["message"]
    os.remove(entries)
    assert_lost(root, rollout, "store_failed")


def test_an_unreachable_store_gets_the_client_an_error_never_an_answer(
    engine: FakeEngine, tmp_path: Any, rollout: str
) -> None:
    import s3fs

    port = free_port()
    moto = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **FAKE_AWS_ENV},
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        options = {"endpoint_url": endpoint, "key": "testing", "secret": "testing"}

        def up() -> bool:
            try:
                s3fs.S3FileSystem(**options, skip_instance_cache=True).mkdir("captures")
                return True
            except Exception:
                return False

        wait_until(up, 60, "the moto server")
        with GatewayProcess(
            engine.url, "s3://captures/run", f"--storage-option=endpoint_url={endpoint}",
            env=FAKE_AWS_ENV,
        ) as gateway:  # fmt: skip
            url = gateway.session(rollout) + "/chat/completions"
            assert post(url, CHAT).status_code == 200  # the store works
            engine.set(delay=1.0)
            answers: list[httpx.Response] = []
            call = threading.Thread(target=lambda: answers.append(post(url, CHAT)))
            call.start()
            wait_until(lambda: engine.seen()["requests"], 30, "the engine to get the call")
            moto.kill()  # the store goes away mid-call
            moto.wait()
            call.join(timeout=120)
            assert answers[0].status_code == 503
            assert "choices" not in answers[0].json()
            refused = post(gateway.session(rollout + "-b") + "/chat/completions", CHAT)
            assert refused.status_code == 503 and "not forwarded" in refused.text
    finally:
        moto.kill()
        moto.wait()


def test_a_retried_request_is_a_new_call(gateway: GatewayProcess, root: str, rollout: str) -> None:
    url = gateway.session(rollout) + "/chat/completions"
    first, again = post(url, CHAT).json(), post(url, CHAT).json()
    assert first == again
    entries = frozen(root, rollout).entries
    assert len(entries) == 2 and entries[0].model_call_id != entries[1].model_call_id
    assert entries[0].prompt_token_ids == entries[1].prompt_token_ids


@pytest.mark.parametrize("bad", ["bad$id", ".starts-with-dot", "x" * 201, "two%20words"])
def test_a_rollout_id_that_is_not_an_id_is_refused_before_anything_is_written(
    gateway: GatewayProcess, engine: FakeEngine, root: str, bad: str
) -> None:
    before = sorted(os.listdir(root))
    answer = post(
        f"{gateway.url}/ng-rollout/{bad}/training-token-capture/v1/chat/completions", CHAT
    )
    assert answer.status_code == 400
    assert "malformed rollout id" in answer.json()["error"]["message"]
    assert engine.seen()["requests"] == []
    assert sorted(os.listdir(root)) == before


def test_hundreds_of_concurrent_sessions_are_captured_in_bounded_memory(
    gateway: GatewayProcess, root: str
) -> None:
    assert gateway.proc is not None
    process = psutil.Process(gateway.proc.pid)

    async def session(client: httpx.AsyncClient, rollout_id: str) -> None:
        messages: list[dict[str, Any]] = [{"role": "user", "content": "go " * 50}]
        for _turn in range(2):
            url = gateway.session(rollout_id) + "/chat/completions"
            answer = (await client.post(url, json={"model": "m", "messages": messages})).json()
            assert "choices" in answer, answer
            messages += [answer["choices"][0]["message"], {"role": "user", "content": "more"}]

    async def wave(prefix: str, count: int) -> None:
        limits = httpx.Limits(max_connections=count)
        async with httpx.AsyncClient(timeout=120, limits=limits) as client:
            await asyncio.gather(*(session(client, f"{prefix}-{i}") for i in range(count)))

    asyncio.run(wave("warm", 200))
    settled = process.memory_info().rss
    for number in range(3):
        asyncio.run(wave(f"wave{number}", 200))
    grown = process.memory_info().rss - settled
    assert grown < 40 * 2**20, f"the gateway grew by {grown / 2**20:.1f} MiB over 600 sessions"
    for rollout_id in ("warm-0", "wave2-199"):
        assert len(frozen(root, rollout_id).entries) == 2


@pytest.mark.parametrize("n", [1, 2])
def test_a_stream_that_says_done_before_a_choice_finished_is_lost_never_captured(
    gateway: GatewayProcess, engine: FakeEngine, root: str, rollout: str, n: int
) -> None:
    engine.set(no_finish=True)
    events = streamed(gateway.session(rollout) + "/chat/completions", {**CHAT, "n": n})
    assert "[DONE]" not in events
    assert "finish_reason" in json.loads(events[-1])["error"]["message"]
    assert_lost(root, rollout, "engine_dropped")


def test_an_unobserved_call_whose_loss_cannot_be_stored_still_masks_its_rollout(
    gateway: GatewayProcess, engine: FakeEngine, root: str, rollout: str
) -> None:
    markers = os.path.join(root, rollout, "x")
    os.makedirs(os.path.dirname(markers), exist_ok=True)
    open(markers, "w").close()  # the marker folder cannot be made: every loss report fails
    post(gateway.session(rollout) + "/responses", {"model": "m", "input": "hi"})
    os.remove(markers)
    assert post(gateway.session(rollout) + "/chat/completions", CHAT).status_code == 200
    snapshot = frozen(root, rollout)
    assert snapshot.incomplete, "a call the gateway could not observe left the rollout whole"


def test_an_unobserved_call_the_store_cannot_record_is_not_forwarded(
    gateway: GatewayProcess, engine: FakeEngine, root: str, rollout: str
) -> None:
    open(os.path.join(root, rollout), "w").close()  # nothing can be written for the rollout
    try:
        answer = post(gateway.session(rollout) + "/responses", {"model": "m", "input": "hi"})
        assert answer.status_code == 503
        assert "not forwarded" in answer.json()["error"]["message"]
        assert engine.seen()["requests"] == []
    finally:
        os.remove(os.path.join(root, rollout))


@pytest.mark.parametrize("stream", [False, True])
def test_an_answer_whose_generated_ids_are_blanked_is_never_captured_as_empty(
    gateway: GatewayProcess, engine: FakeEngine, root: str, rollout: str, stream: bool
) -> None:
    engine.set(emptied=True)  # ids and log probs blanked to [] by something in between
    url = gateway.session(rollout) + "/chat/completions"
    if stream:
        events = streamed(url, CHAT)
        assert "[DONE]" not in events
        message = json.loads(events[-1])["error"]["message"]
    else:
        answer = post(url, CHAT)
        assert answer.status_code == 502 and "choices" not in answer.json()
        message = answer.json()["error"]["message"]
    assert "token_ids" in message and "empty" in message
    assert_lost(root, rollout, "unusable_answer")


def test_a_stream_in_a_shape_nothing_reads_is_lost_as_unusable_with_an_error_event(
    gateway: GatewayProcess, engine: FakeEngine, root: str, rollout: str
) -> None:
    engine.set(bad_index=True)  # a choice index that is not a number, mid-stream
    events: list[str] = []
    url = gateway.session(rollout) + "/chat/completions"
    with contextlib.suppress(httpx.HTTPError):  # a stream cut instead of an error event
        events.extend(stream_events(url, {**CHAT, "stream": True}))
    assert events and "error" in json.loads(events[-1])
    assert_lost(root, rollout, "unusable_answer")


def test_a_rollout_frozen_while_its_call_is_in_flight_withholds_the_answer(
    gateway: GatewayProcess, engine: FakeEngine, root: str, rollout: str
) -> None:
    engine.set(delay=1.0)
    answers: list[httpx.Response] = []
    url = gateway.session(rollout) + "/chat/completions"
    call = threading.Thread(target=lambda: answers.append(post(url, CHAT)))
    call.start()
    wait_until(lambda: engine.seen()["requests"], 30, "the engine to get the call")
    snapshot = frozen(root, rollout)  # finalized mid-call: the intent masks it
    call.join(timeout=60)
    assert snapshot.incomplete and snapshot.entries == ()
    assert answers[0].status_code == 503 and "choices" not in answers[0].json()
    assert frozen(root, rollout).entries == ()
