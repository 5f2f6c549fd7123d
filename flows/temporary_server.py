"""Prefect's temporary API server, with the server's own output kept out of the console.

The server is a child process. Left alone, it writes its error logs and tracebacks (its
database busy on a loaded machine, a request cut short when it stops) onto the user's
terminal, in the middle of the command's output. Here they go to a log file under
`PREFECT_HOME`, and a command whose server logged an error ends with one line naming it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from prefect.server.api.server import SubprocessASGIServer
from prefect.settings import PREFECT_HOME

LOG_NAME = "tokcap-temporary-server.log"
ERROR_MARKERS = ("Traceback", "ERROR")


def server_log_path() -> str:
    """Where the temporary server's output goes: `<PREFECT_HOME>/tokcap-temporary-server.log`."""
    return os.path.join(str(PREFECT_HOME.value()), LOG_NAME)


@contextmanager
def child_output_to(path: str) -> Iterator[None]:
    """Processes started inside write their stdout and stderr to `path` (appended).

    The command's own console is restored on exit; keep the block to the child's start.
    A log that cannot be opened leaves the child on the console, as Prefect starts it.
    """
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    except OSError:
        yield
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    try:
        os.dup2(log, 1)
        os.dup2(log, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, log):
            os.close(fd)


def log_size(path: str) -> int:
    """The log's size now, so a command reads only what its own server wrote."""
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def error_lines(path: str, offset: int) -> list[str]:
    """The lines written to the log after `offset` that report an error."""
    try:
        with open(path, "rb") as log:
            log.seek(offset)
            text = log.read().decode("utf-8", "replace")
    except OSError:
        return []
    return [line for line in text.splitlines() if any(m in line for m in ERROR_MARKERS)]


class TemporaryServer(SubprocessASGIServer):
    """`SubprocessASGIServer` whose process writes to `server_log_path()`.

    Prefect's clients find the running server by its class registry, so flows use this
    one as they would Prefect's own.
    """

    log_path: str = ""

    def _run_uvicorn_command(self) -> subprocess.Popen[Any]:
        with child_output_to(self.log_path or server_log_path()):
            return super()._run_uvicorn_command()
