"""A real `tokcap gateway` subprocess for tests, started through the CLI as an operator
would, on a free port (`--port 0`), with its listening line parsed; and small HTTP helpers.

Fixtures built from these live in the test modules that use them (tests/gateway/conftest.py
belongs to the real-engine harness).
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx

LISTENING = "tokcap gateway: listening on "
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class GatewayProcess:
    """`tokcap gateway --engine ENGINE --store STORE --port 0 ARGS...` in a subprocess."""

    def __init__(self, engine: str, store: str, *args: str, env: dict[str, str] | None = None):
        self.command = [
            sys.executable, "-m", "tokcap.flows.cli", "gateway",
            "--engine", engine, "--store", store, "--port", "0", *args,
        ]  # fmt: skip
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""
        self.stderr_lines: list[str] = []
        self._stdout: queue.Queue[str] = queue.Queue()

    def start(self, timeout: float = 120) -> GatewayProcess:
        self.proc = subprocess.Popen(
            self.command,
            cwd=ROOT,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        pump = threading.Thread(target=self._pump, args=(self.proc.stdout, self._stdout))
        pump.daemon = True
        pump.start()
        threading.Thread(target=self._collect, daemon=True).start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self._stdout.get(timeout=0.2)
            except queue.Empty:
                if self.proc.poll() is not None:
                    raise RuntimeError(
                        f"the gateway exited with {self.proc.returncode}: {self.stderr()}"
                    ) from None
                continue
            if line.startswith(LISTENING):
                self.url = line[len(LISTENING) :].strip()
                return self
        raise TimeoutError(f"the gateway did not print its listening line: {self.stderr()}")

    @staticmethod
    def _pump(stream: Any, into: queue.Queue[str]) -> None:
        for line in stream:
            into.put(line)

    def _collect(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr_lines.append(line)

    def stderr(self) -> str:
        return "".join(self.stderr_lines)

    def session(self, rollout_id: str) -> str:
        """The base URL a harness gives its OpenAI client for one rollout."""
        return f"{self.url}/ng-rollout/{rollout_id}/training-token-capture/v1"

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM, then the exit status."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise

    def __enter__(self) -> GatewayProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def post(url: str, body: dict[str, Any], **kwargs: Any) -> httpx.Response:
    """POST a JSON body (generous timeout: a loaded machine is slow)."""
    return httpx.post(url, json=body, timeout=kwargs.pop("timeout", 60), **kwargs)


def stream_events(url: str, body: dict[str, Any], **kwargs: Any) -> Iterator[str]:
    """The `data` of each event of a streamed POST, in order."""
    with httpx.stream("POST", url, json=body, timeout=60, **kwargs) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("data: "):
                yield line[6:]


def chunks_of(events: list[str]) -> list[dict[str, Any]]:
    """The JSON events of a stream, `[DONE]` left out."""
    return [json.loads(e) for e in events if e != "[DONE]"]
