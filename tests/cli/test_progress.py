"""The progress of `tokcap finalize`: a `k/N` line per batch in a pipe, one line updated in
place on a terminal, the per-batch lines in the flow-run logs only.

Each run is a real `tokcap` subprocess against the session's Prefect server: with its
stderr a pipe, or the slave of a pseudo-terminal (`pty`); the flow-run logs and the
progress artifact are read back from the server.
"""

from __future__ import annotations

import io
import itertools
import logging
import os
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.pipeline_helpers import REPO, finalize_args, run_cli
from tests.support.prefect_api_reads import artifacts_of, eventually, flow_runs_named, logs_of
from tokcap.flows.cli.progress_line import ProgressLine
from tokcap.flows.inputs import make_inputs

pytestmark = pytest.mark.usefixtures("prefect_api")

ROLLOUTS, BATCH = 8, 2
BATCHES = ROLLOUTS // BATCH
PER_BATCH_LINE = re.compile(r"batch \d+: (finalized|handed off|retired) ")
INFO = {"PREFECT_LOGGING_LEVEL": "INFO"}


def inputs(tmp_path: Path, name: str) -> tuple[str, str, str]:
    """A rollout file of `ROLLOUTS` rollouts, its store, and a destination."""
    store, out = str(tmp_path / "store"), str(tmp_path / "out")
    made = make_inputs(store, out, ROLLOUTS, prefix=name)
    return made.files[0].url, store, str(tmp_path / "dest")


def finalize_args_of(tmp_path: Path, run_id: str) -> tuple[list[str], str]:
    rollouts, store, dest = inputs(tmp_path, run_id)
    return finalize_args(rollouts, store, dest, run_id, "--batch-size", str(BATCH)), rollouts


def test_in_a_pipe_each_batch_is_one_k_of_n_line_and_the_logs_keep_the_batch_lines(
    tmp_path: Path, prefect_api: str
) -> None:
    args, rollouts = finalize_args_of(tmp_path, "piped")
    done = run_cli(args, prefect_api, env=INFO)
    assert done.returncode == 0, done.stderr[-2000:]
    progress = re.findall(
        rf"^(\d+)/{BATCHES} batches, (\d+)/{ROLLOUTS} rollouts, (.*), (\d+) masked so far$",
        done.stderr,
        re.MULTILINE,
    )
    assert [int(k) for k, *_ in progress] == list(range(1, BATCHES + 1)), done.stderr
    assert [int(n) for _k, n, *_ in progress] == [2, 4, 6, 8]
    assert progress[-1][2].endswith(", done") and "rollouts/s" in progress[-1][2]
    assert "\r" not in done.stderr
    assert not PER_BATCH_LINE.search(done.stderr), "per-batch lines stay off the console"
    assert "planned 8 rollouts" in done.stderr, "other INFO lines are shown as before"
    (run,) = flow_runs_named(f"finalize piped from {rollouts}")

    def info_lines() -> list[str]:
        return [log.message for log in logs_of(run.id) if log.level == logging.INFO]

    logged = eventually(info_lines, lambda lines: len(lines) > 3 * BATCHES, "the run's logs")
    for kind in ("finalized", "handed off", "retired"):
        assert sum(bool(re.match(rf"batch \d+: {kind} ", m)) for m in logged) == BATCHES, kind
    assert any(m.startswith(f"{BATCHES}/{BATCHES} batches, ") for m in logged)
    kinds = [a.type for a in artifacts_of(flow_run_id=run.id)]
    assert "progress" not in kinds, "the progress bar goes once the report stands in its place"
    assert "markdown" in kinds, "the run's report"


def run_on_terminal(args: list[str], api_url: str, timeout: float = 300) -> tuple[int, str, str]:
    """`tokcap ARGS` with stderr on a pseudo-terminal: exit code, stdout, what the terminal
    received."""
    master, slave = os.openpty()
    env = {**os.environ, "PREFECT_API_URL": api_url, "PYTHONPATH": REPO, **INFO}
    process = subprocess.Popen(
        [sys.executable, "-m", "tokcap.flows.cli", *args],
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=slave,
    )
    os.close(slave)
    received, deadline = bytearray(), time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if not ready:
                continue
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the terminal closed: every writer exited
                break
            if not chunk:
                break
            received += chunk
        stdout = process.communicate(timeout=max(1.0, deadline - time.monotonic()))[0]
    finally:
        os.close(master)
        if process.poll() is None:
            process.kill()
    return process.returncode, stdout.decode(), received.decode(errors="replace")


def test_on_a_terminal_one_line_is_updated_in_place(tmp_path: Path, prefect_api: str) -> None:
    args, _rollouts = finalize_args_of(tmp_path, "terminal")
    code, stdout, screen = run_on_terminal(args, prefect_api)
    assert code == 0, screen[-2000:]
    updates = re.findall(rf"\r\x1b\[K(\d+)/{BATCHES} batches, ", screen)
    assert [int(k) for k in updates] == list(range(1, BATCHES + 1)), screen[-3000:]
    last = re.search(rf"\r\x1b\[K{BATCHES}/{BATCHES} batches, [^\r\n]*done[^\r\n]*\r\n", screen)
    assert last is not None, "the last line stays, ended by a newline"
    pieces = screen[screen.index(f"1/{BATCHES} batches") : last.start()].split("\r\n")
    for above, below in itertools.pairwise(pieces):
        assert "WARNING" in above, "only a warning adds a line, printed above the progress"
        assert re.match(rf"\d+/{BATCHES} batches, ", below), "and the line is drawn again"
    assert not PER_BATCH_LINE.search(screen)
    assert stdout.startswith("run terminal: complete: ") and "handed off" in stdout


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_warning_is_printed_above_the_line_which_is_then_drawn_again() -> None:
    screen = Terminal()
    line = ProgressLine(screen)
    line.show("1/3 batches", last=False)
    line.clear()
    screen.write("WARNING masked\n")
    line.redraw()
    line.show("2/3 batches", last=False)
    line.end()
    assert screen.getvalue() == (
        "\r\x1b[K1/3 batches\r\x1b[KWARNING masked\n1/3 batches\r\x1b[K2/3 batches\n"
    )


def test_in_a_pipe_the_line_is_never_cleared_or_drawn_again() -> None:
    piped = io.StringIO()
    line = ProgressLine(piped)
    line.show("1/2 batches", last=False)
    line.clear()
    line.redraw()
    line.show("2/2 batches", last=True)
    line.end()
    assert piped.getvalue() == "1/2 batches\n2/2 batches\n"
