"""A command killed while its temporary Prefect server runs leaves no server behind: on
Linux the kernel ends the server with the command (whatever killed it), and SIGTERM or
SIGHUP end the command through its `finally`, which stops the server. An orphaned server
would keep its port and the SQLite database under `PREFECT_HOME`."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tests.cli.test_first_run import fresh_prefect_env
from tests.support.pipeline_helpers import REPO

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")

PARENT = """
import sys, time
from tokcap.flows.temporary_server import popen_dying_with_parent
child = popen_dying_with_parent([sys.executable, "-c", "import time; time.sleep(600)"])
print(child.pid, flush=True)
time.sleep(600)
"""

ENDED = """
import os, signal, time
from tokcap.flows.temporary_server import ending_signals_exit
signal.signal(signal.{name}, signal.SIG_DFL)  # as on a terminal, even if run under nohup
with ending_signals_exit():
    try:
        os.kill(os.getpid(), signal.{name})
        time.sleep(60)
    finally:
        print("finally ran", flush=True)
"""


def gone(pid: int, deadline: float) -> bool:
    """Whether `pid` exits (or is left a zombie, nothing but an exit code) by `deadline`."""
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.2)
    return False


def end(pid: int) -> None:
    with contextlib.suppress(psutil.NoSuchProcess):
        psutil.Process(pid).kill()


@pytest.mark.integrity
def test_a_child_started_to_die_with_its_parent_dies_when_the_parent_is_killed() -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    child = 0
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert psutil.pid_exists(child)
        parent.kill()
        parent.wait(timeout=60)
        assert gone(child, time.monotonic() + 60), "the child outlived its killed parent"
    finally:
        if child:
            end(child)
        parent.kill()


@pytest.mark.integrity
@pytest.mark.parametrize("name", ["SIGTERM", "SIGHUP"])
def test_sigterm_and_sighup_end_the_command_through_its_finally(name: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", ENDED.format(name=name)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.stdout == "finally ran\n", done.stderr[-2000:]
    assert done.returncode == 128 + getattr(signal, name), done.stderr[-2000:]


def server_child(cli: subprocess.Popen, deadline: float) -> psutil.Process:
    """The command's temporary server process (uvicorn), once it exists."""
    while time.monotonic() < deadline:
        assert cli.poll() is None, "the command ended before its server started"
        for child in psutil.Process(cli.pid).children():
            try:
                if "uvicorn" in child.cmdline():
                    return child
            except psutil.NoSuchProcess:
                continue
        time.sleep(0.1)
    raise AssertionError("no temporary server started")


@pytest.mark.integrity
def test_a_killed_command_leaves_no_temporary_server(tmp_path) -> None:
    cli = subprocess.Popen(
        [sys.executable, "-m", "tokcap.flows.cli", "demo", "--workdir", "demo"],
        cwd=str(tmp_path),
        env=fresh_prefect_env(str(tmp_path / "prefect-home")),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    server = None
    try:
        server = server_child(cli, time.monotonic() + 120)
        os.kill(cli.pid, signal.SIGKILL)
        cli.wait(timeout=60)
        assert gone(server.pid, time.monotonic() + 60), "the temporary server outlived it"
    finally:
        cli.kill()
        if server is not None:
            end(server.pid)
