"""Prefect's temporary API server, with the server's own output kept out of the console.

The server is a child process that dies with the command: on Linux the kernel sends it
SIGTERM when the command's process ends, however it ends (SIGKILL included), and while it
runs the command turns SIGTERM and SIGHUP into `SystemExit`, so its `finally` stops the
server; neither its port nor its database is left held by an orphan.
Left alone, the server writes its error logs and tracebacks (its
database busy on a loaded machine, a request cut short when it stops) onto the user's
terminal, in the middle of the command's output. Here they go to a log file under
`PREFECT_HOME`, and a command whose server logged an error ends with one line naming it.
"""

from __future__ import annotations

import ctypes
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any, NamedTuple

LOG_NAME = "tokcap-temporary-server.log"
ERROR_MARKERS = ("Traceback", "ERROR")
LOG_ROTATE_BYTES = 5_000_000
_EXCEPTION_LINE = re.compile(r"[A-Za-z_][\w.]*(Error|Exception): ")
# Prefect restarts a server process that exits at startup (exit code 3, meant for a port
# taken meanwhile) without counting the time; more starts than this are a crash, not a clash.
MAX_STARTS = 5


class StartupCrashError(RuntimeError):
    """The server process kept exiting at startup; its log says why."""


def server_log_path() -> str:
    """Where the temporary server's output goes: `<PREFECT_HOME>/tokcap-temporary-server.log`."""
    from prefect.settings import PREFECT_HOME

    return os.path.join(str(PREFECT_HOME.value()), LOG_NAME)


@contextmanager
def child_output_to(path: str) -> Iterator[bool]:
    """Processes started inside write their stdout and stderr to `path` (appended).

    Yields whether they do: a log that cannot be opened, or a console with stdout or stderr
    closed, leaves the child as Prefect starts it. The command's own console is restored
    on exit; keep the block to the child's start.
    """
    for stream in (sys.stdout, sys.stderr):
        with suppress(OSError, ValueError, AttributeError):
            stream.flush()  # type: ignore[union-attr]
    try:
        os.fstat(1), os.fstat(2)  # a closed one could be taken by the log or a saved copy
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    except OSError:
        yield False
        return
    saved = os.dup(1), os.dup(2)
    try:
        os.dup2(log, 1)
        os.dup2(log, 2)
        yield True
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, log):
            os.close(fd)


def rotate_log(path: str) -> None:
    """Keep the log bounded: past `LOG_ROTATE_BYTES` it moves to `<path>.1`, replacing that."""
    with suppress(OSError):
        if os.path.getsize(path) > LOG_ROTATE_BYTES:
            os.replace(path, path + ".1")


class LogPosition(NamedTuple):
    """A point in the log: its file (inode; 0 for whatever file is there) and an offset.

    The file is kept so that a log another command rotated meanwhile is still read."""

    inode: int
    offset: int


LOG_START = LogPosition(0, 0)


def log_position(path: str) -> LogPosition:
    """Where the log ends now, so a command reads only what came after."""
    try:
        stat = os.stat(path)
    except OSError:
        return LOG_START
    return LogPosition(stat.st_ino, stat.st_size)


def last_error(path: str, since: LogPosition) -> str:
    """The last exception line (`SomeError: why`) written to the log since `since`, else
    its last non-blank line: what a user needs to fix a server that will not start."""
    lines = [line.strip() for line in _read_since(path, since).splitlines() if line.strip()]
    exceptions = [line for line in lines if _EXCEPTION_LINE.match(line)]
    return (exceptions or lines or [""])[-1]


def error_lines(path: str, since: LogPosition) -> list[str]:
    """The lines written to the log since `since` that report an error."""
    text = _read_since(path, since)
    return [line for line in text.splitlines() if any(m in line for m in ERROR_MARKERS)]


def _read_since(path: str, since: LogPosition) -> str:
    for candidate in (path, path + ".1"):
        try:
            if since.inode and os.stat(candidate).st_ino != since.inode:
                continue
            with open(candidate, "rb") as log:
                log.seek(since.offset)
                return log.read().decode("utf-8", "replace")
        except OSError:
            continue
    return ""


class TemporaryServer:
    """Prefect's temporary API server as a child process, started as Prefect starts it
    (`prefect.server.api.server.SubprocessASGIServer`: uvicorn on a free port, the UI off,
    the settings passed on) but without importing Prefect's server into the CLI, which cost
    about 3.5 s of CPU before any work. `launch` returns at once, so the CLI imports its flows
    while the server starts; `wait_ready` then waits for its health check. The process writes
    to `log_path`; a start that exits with code 3 (meant for a port taken meanwhile) is
    retried on a new port, at most `MAX_STARTS` times. `redirected` says whether its output
    went to the log."""

    def __init__(self, log_path: str = "") -> None:
        self.log_path, self.redirected, self.starts = log_path, False, 0
        self.port: int | None = None
        self.process: subprocess.Popen[Any] | None = None

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def launch(self) -> None:
        """Start the process on a free port; `StartupCrashError` past `MAX_STARTS` starts."""
        self.starts += 1
        if self.starts > MAX_STARTS:
            raise StartupCrashError(f"its process exited at startup {MAX_STARTS} times")
        self.port = free_port()
        with child_output_to(self.log_path or server_log_path()) as redirected:
            self.redirected = redirected
            self.process = popen_dying_with_parent(_uvicorn_command(self.port), env=_server_env())

    def wait_ready(self, timeout: float) -> None:
        """Return once the API answers its health check; `TimeoutError` after `timeout` s."""
        import httpx

        deadline = time.monotonic() + timeout
        with httpx.Client(timeout=5) as client:
            while time.monotonic() < deadline:
                assert self.process is not None
                code = self.process.poll()
                if code == 3:
                    self.launch()
                    continue
                if code is not None:
                    raise StartupCrashError(f"its process exited with code {code}")
                with suppress(httpx.HTTPError):
                    if client.get(f"{self.api_url}/health").status_code == 200:
                        return
                time.sleep(0.1)
        raise TimeoutError("timed out waiting for its health check")

    def start(self, timeout: float) -> None:
        self.launch()
        self.wait_ready(timeout)

    def stop(self) -> None:
        """Stop the process (terminate, then kill after 5 s); safe to call twice."""
        process, self.process = self.process, None
        if process is None:
            return
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


PR_SET_PDEATHSIG = 1  # prctl(2): the signal a child gets when its parent dies
ENDING_SIGNALS = ("SIGTERM", "SIGHUP")


def popen_dying_with_parent(command: list[str], **options: Any) -> subprocess.Popen[bytes]:
    """Start `command` as a child that Linux ends when this process dies (`die_with_parent`)."""
    return subprocess.Popen(command, preexec_fn=die_with_parent(), **options)


def die_with_parent() -> Callable[[], None] | None:
    """A `preexec_fn` that has Linux send the child SIGTERM when this process dies; `None`
    where there is no `prctl` (other systems: the command's `finally` still stops it).

    The request is made in the child before it runs the server; a parent that died before
    it took effect is caught by the child seeing a new parent, and ends it the same way.
    Linux ties it to the thread that started the child: start it from the main thread.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def request() -> None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGTERM)

    return request


@contextmanager
def ending_signals_exit() -> Iterator[None]:
    """While the block runs, SIGTERM and SIGHUP end the command with `SystemExit` (exit
    128 + the signal), so `finally` blocks run and stop the temporary server. A signal with
    a handler of its own or ignored (`nohup`) keeps it; outside the main thread nothing
    changes (only it may set handlers). The previous handlers come back on exit."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def end(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    saved: dict[int, Any] = {}
    for name in ENDING_SIGNALS:
        number = getattr(signal, name, None)
        if number is not None and signal.getsignal(number) is signal.SIG_DFL:
            saved[number] = signal.signal(number, end)
    try:
        yield
    finally:
        for number, handler in saved.items():
            signal.signal(number, handler)


def _uvicorn_command(port: int) -> list[str]:
    import prefect

    app_dir = str(prefect.__module_path__.parent)
    factory = "prefect.server.api.server:create_app"
    where = ["--host", "127.0.0.1", "--port", str(port)]
    quiet = ["--log-level", "error", "--lifespan", "on"]
    return [
        sys.executable,
        "-m",
        "uvicorn",
        "--app-dir",
        app_dir,
        "--factory",
        factory,
        *where,
        *quiet,
    ]


def _server_env() -> dict[str, str]:
    from prefect.settings import get_current_settings

    ours = {
        "PREFECT_UI_ENABLED": "0",
        "PREFECT__SERVER_EPHEMERAL": "1",
        "PREFECT__SERVER_FINAL": "1",
    }
    settings = get_current_settings().to_environment_variables(exclude_unset=True)
    return {**os.environ, **ours, **settings}


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
