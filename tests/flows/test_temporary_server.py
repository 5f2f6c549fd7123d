"""The temporary Prefect server's own output goes to its log file, never onto the console."""

from __future__ import annotations

import os
import subprocess
import sys

import orjson

from tests.cli.test_first_run import fresh_prefect_env
from tests.support.pipeline_helpers import REPO
from tokcap.flows.temporary_server import (
    LOG_NAME,
    LOG_START,
    child_output_to,
    error_lines,
    log_position,
)

CHILD = (
    "import sys; print('served', flush=True); "
    "print('Traceback (most recent call last):', file=sys.stderr, flush=True)"
)


def test_a_child_started_inside_writes_to_the_log_and_the_console_comes_back(
    tmp_path, capfd
) -> None:
    log = tmp_path / "home" / "server.log"
    with child_output_to(str(log)):
        child = subprocess.Popen([sys.executable, "-c", CHILD])
    assert child.wait(timeout=120) == 0
    print("console again")
    captured = capfd.readouterr()
    assert "served" not in captured.out and "Traceback" not in captured.err
    assert "console again" in captured.out, "the command's own output still reaches it"
    assert log.read_text().splitlines() == ["served", "Traceback (most recent call last):"]
    assert error_lines(str(log), LOG_START) == ["Traceback (most recent call last):"]
    assert error_lines(str(log), log_position(str(log))) == [], "only what came after"


def test_a_log_that_cannot_be_opened_leaves_the_child_on_the_console(tmp_path, capfd) -> None:
    (tmp_path / "home").write_text("a file where the log's folder should be")
    with child_output_to(str(tmp_path / "home" / "server.log")):
        child = subprocess.Popen([sys.executable, "-c", CHILD])
    assert child.wait(timeout=120) == 0
    captured = capfd.readouterr()
    assert "served" in captured.out and "Traceback" in captured.err, "nothing was lost"


CLOSED_CONSOLE = """
import os
import sys
os.close(1)
sys.stdout = None
from tokcap.flows.temporary_server import child_output_to
with child_output_to(sys.argv[1]) as redirected:
    pass
try:
    os.fstat(1)
    state = "open"
except OSError:
    state = "closed"
print(f"redirected={redirected} fd1={state}", file=sys.stderr)
"""


def test_a_closed_console_is_left_as_it_is(tmp_path) -> None:
    """With stdout closed the log could take its fd; the child starts as Prefect starts it."""
    log = tmp_path / "server.log"
    result = subprocess.run(
        [sys.executable, "-c", CLOSED_CONSOLE, str(log)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == "redirected=False fd1=closed", "no log took the fd"


SERVER_LOGS_AN_ERROR = """
import json
from tokcap.flows.runners import prefect_api, prefect_environment
prefect_environment()
from tokcap.flows.temporary_server import server_log_path
notes = []
with prefect_api(notes) as api_url:
    assert api_url is None
    with open(server_log_path(), "a") as log:
        log.write("ERROR | the server's database was busy\\n")
    print("command done")
print(json.dumps(notes))
"""


def run_script(script: str, home: str) -> subprocess.CompletedProcess[str]:
    """Run `script` as a new user's command would run: fresh PREFECT_HOME, no API URL."""
    return subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        env=fresh_prefect_env(home),
        capture_output=True,
        text=True,
        timeout=400,
    )


def test_a_server_error_ends_the_command_with_one_line_naming_the_log(tmp_path) -> None:
    home = tmp_path / "prefect-home"
    result = run_script(SERVER_LOGS_AN_ERROR, str(home))
    assert result.returncode == 0, result.stderr[-3000:]
    done, notes = result.stdout.splitlines()
    assert done == "command done" and "note:" not in result.stderr, "the caller prints it"
    [note] = orjson.loads(notes)
    assert "logged errors while this command ran" in note and note.endswith(str(home / LOG_NAME))
    assert "database was busy" in (home / LOG_NAME).read_text()


CLEAN_COMMAND = """
from tokcap.flows.runners import prefect_api, prefect_environment
prefect_environment()
with prefect_api():
    pass
"""


def test_a_note_only_when_the_log_holds_errors_and_never_a_traceback(tmp_path) -> None:
    """An idle server with the CLI's defaults (telemetry off) usually logs nothing; a busy
    machine may make it log errors, and then, only then, the note names its log."""
    home = tmp_path / "prefect-home"
    result = run_script(CLEAN_COMMAND, str(home))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr
    if "note:" in result.stderr:
        assert error_lines(str(home / LOG_NAME), LOG_START), "a note means logged errors"


def test_notes_follow_the_result_also_when_stdout_is_a_buffered_file(tmp_path) -> None:
    script = (
        "from tokcap.flows.cli.output import print_notes; print('result'); print_notes(['note: x'])"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    with open(tmp_path / "out", "w") as out:
        subprocess.run(
            [sys.executable, "-c", script], cwd=REPO, env=env, stdout=out, stderr=out, timeout=60
        )
    assert (tmp_path / "out").read_text().splitlines() == ["result", "note: x"]
