"""Prefect's temporary API server, with the server's own output kept out of the console.

The server is a child process. Left alone, it writes its error logs and tracebacks (its
database busy on a loaded machine, a request cut short when it stops) onto the user's
terminal, in the middle of the command's output. Here they go to a log file under
`PREFECT_HOME`, and a command whose server logged an error ends with one line naming it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any, NamedTuple

from prefect.server.api.server import SubprocessASGIServer
from prefect.settings import PREFECT_HOME

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


class TemporaryServer(SubprocessASGIServer):
    """`SubprocessASGIServer` whose process writes to `log_path`, started at most
    `MAX_STARTS` times.

    Prefect's clients find the running server by its class registry, so flows use this
    one as they would Prefect's own. `redirected` says whether its output went to the log.
    """

    log_path: str = ""
    redirected: bool = False
    starts: int = 0

    def _run_uvicorn_command(self) -> subprocess.Popen[Any]:
        self.starts += 1
        if self.starts > MAX_STARTS:
            raise StartupCrashError(f"its process exited at startup {MAX_STARTS} times")
        with child_output_to(self.log_path or server_log_path()) as redirected:
            self.redirected = redirected
            return super()._run_uvicorn_command()
