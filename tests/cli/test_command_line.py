"""The command line itself: close matches for mistyped options and commands, every option
documented in its command's help, and a reader that stops early (`tokcap ... | head`).

Parsing runs in process (`main` exits before any flow); a closed stdout needs a real subprocess.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import pytest

from capture_core.run.run_layout import LedgerLine, RunLayout, RunManifest
from capture_core.storage import open_byte_store
from tests.support.pipeline_helpers import REPO
from tokcap.flows.cli.arguments import build_parser
from tokcap.flows.cli.main import main

BROKEN_PIPE_EXIT = 141


def usage_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """The one stderr line `tokcap ARGV` exits 2 with."""
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_a_mistyped_option_gets_the_close_one_and_its_command_help(capsys) -> None:
    line = usage_error(
        capsys,
        ["finalize", "--rollouts", "a", "--store", "b", "--dest", "c", "--run-id", "r",
         "--batchsize", "10"],
    )  # fmt: skip
    assert line == (
        "tokcap finalize: unrecognized arguments: --batchsize 10; did you mean --batch-size? "
        "(see tokcap finalize --help)"
    )


def test_a_mistyped_option_value_form_and_a_mistyped_command_get_close_ones(capsys) -> None:
    line = usage_error(capsys, ["status", "--dest", "d", "--run-id", "r", "--jsn"])
    assert "did you mean --json?" in line and "(see tokcap status --help)" in line
    line = usage_error(capsys, ["sweep", "--store", "s", "--older-then=3d"])
    assert "did you mean --older-than?" in line
    line = usage_error(capsys, ["finalise"])
    assert "did you mean finalize?" in line


def test_every_option_of_every_command_says_what_it_is(capsys) -> None:
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    undocumented = [
        f"{name} {action.option_strings or action.dest}"
        for name, sub in commands.choices.items()
        for action in sub._actions
        if action.help in (None, "") and not isinstance(action, argparse._HelpAction)
    ]
    assert not undocumented, undocumented
    with pytest.raises(SystemExit):
        main(["status", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--run-id RUN_ID the run to show" in help_text
    assert "--json print the run's state, manifest, summary and row consumers as JSON" in help_text


def run_into_closed_pipe(args: list[str]) -> subprocess.CompletedProcess:
    """`tokcap ARGS` whose stdout is a pipe nobody reads any more (`| head` after its lines)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    try:
        return subprocess.run(
            [sys.executable, "-m", "tokcap.flows.cli", *args],
            cwd=REPO,
            env={**env, "PYTHONPATH": REPO},
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write_end)


def a_finished_run(dest: str) -> None:
    """A run `r` at `dest` whose one rollout was handed off masked, as a finalize leaves it."""
    layout = RunLayout(open_byte_store(dest), "r")
    manifest = RunManifest(
        run_id="r", rollouts="/in.jsonl", rollouts_sha256="0" * 64, store="/store",
        builder="prefix_merging", batch_size=2, batches=1,
    )  # fmt: skip
    assert layout.claim(manifest)
    reason = "unresolved retries ['c1', 'c2']"
    layout.write_ledger(
        [LedgerLine(rollout_id="1-0", line=1, finalized=True, handed_off=True, masked=True,
                    mask_reason=reason)]
    )  # fmt: skip


def test_status_says_the_outcome_first_and_the_reason_in_words(tmp_path, capsys) -> None:
    a_finished_run(str(tmp_path / "dest"))
    assert main(["status", "--dest", str(tmp_path / "dest"), "--run-id", "r"]) == 0
    state, first, second, *rest = capsys.readouterr().out.splitlines()
    assert state == "complete: run r: every rollout handed off"
    assert first == (
        "run r: complete: 1 of 1 rollout handed off, 1 masked (trainers skip masked records)"
    )
    assert second == "from /in.jsonl, 1 batch, delivery main_chain"
    assert "mask rate 100% (1 of 1)" in rest
    assert any(line.startswith("  1 unresolved retry: a call was retried") for line in rest)


def test_a_reader_that_stops_early_ends_the_command_quietly(tmp_path) -> None:
    dest = str(tmp_path / "dest")
    a_finished_run(dest)
    for args in (["status", "--dest", dest, "--run-id", "r"], ["deployments", "--show"]):
        done = run_into_closed_pipe(args)
        assert (done.returncode, done.stderr) == (BROKEN_PIPE_EXIT, ""), (args, done.stderr)
