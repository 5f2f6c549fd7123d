"""Real servers the tests start themselves: a moto S3 server on 127.0.0.1."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

FAKE_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(predicate, timeout: float, what: str, interval: float = 0.05) -> None:
    """Poll `predicate` until it is true; fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1):
            return True
    except Exception:
        return False


@contextmanager
def moto_server() -> Iterator[str]:
    """Run `moto.server` in a subprocess on a free loopback port; yield its endpoint URL."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **FAKE_AWS_ENV},
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _answers(endpoint + "/moto-api/"), 60, "the moto server to answer")
        yield endpoint
    finally:
        proc.terminate()
        proc.wait(timeout=30)


class PrefectServer:
    """`prefect server start` in its own process, session and `PREFECT_HOME`, on a free port:
    a real server that a test stops (SIGTERM, as `systemctl stop` does) and starts again."""

    def __init__(self, home: str) -> None:
        self.home, self.port = home, free_port()
        self.api_url = f"http://127.0.0.1:{self.port}/api"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 300) -> None:
        """Start it and wait until its API answers (a fresh database migrates first)."""
        os.makedirs(self.home, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
        env.update({"PREFECT_HOME": self.home, "PREFECT_SERVER_ANALYTICS_ENABLED": "false"})
        command = ["server", "start", "--host", "127.0.0.1", "--port", str(self.port)]
        with open(os.path.join(self.home, "server.log"), "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "prefect", *command, "--no-services", "--no-ui"],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_until(self.answers, timeout, f"prefect server start on port {self.port}", 0.2)

    def answers(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"prefect server start exited with {self.proc.returncode}")
        return _answers(self.api_url + "/health")

    def stop(self) -> None:
        """Stop it and everything it started; returns once nothing of it runs."""
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
