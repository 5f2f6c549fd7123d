"""The temporary Prefect server's own output goes to its log file, never onto the console."""

from __future__ import annotations

import os
import subprocess
import sys

from flows.temporary_server import LOG_NAME, child_output_to, error_lines
from tests.pipeline_helpers import REPO
from tests.test_first_run import fresh_prefect_env

CHILD = "import sys; print('served'); print('Traceback (most recent call last):', file=sys.stderr)"


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
    assert error_lines(str(log), 0) == ["Traceback (most recent call last):"]
    assert error_lines(str(log), log.stat().st_size) == [], "only what came after the offset"


def test_a_log_that_cannot_be_opened_leaves_the_child_on_the_console(tmp_path, capfd) -> None:
    (tmp_path / "home").write_text("a file where the log's folder should be")
    with child_output_to(str(tmp_path / "home" / "server.log")):
        child = subprocess.Popen([sys.executable, "-c", CHILD])
    assert child.wait(timeout=120) == 0
    captured = capfd.readouterr()
    assert "served" in captured.out and "Traceback" in captured.err, "nothing was lost"


SERVER_LOGS_AN_ERROR = """
from flows.runners import prefect_api, prefect_environment
prefect_environment()
from flows.temporary_server import server_log_path
with prefect_api() as api_url:
    assert api_url is None
    with open(server_log_path(), "a") as log:
        log.write("ERROR | the server's database was busy\\n")
print("command done")
"""


def run_script(script: str, home: str) -> subprocess.CompletedProcess[str]:
    """Run `script` as a new user's command would run: fresh PREFECT_HOME, no API URL."""
    return subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        env=fresh_prefect_env(home),
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_server_error_ends_the_command_with_one_line_naming_the_log(tmp_path) -> None:
    home = tmp_path / "prefect-home"
    result = run_script(SERVER_LOGS_AN_ERROR, str(home))
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "command done"
    notes = [line for line in result.stderr.splitlines() if line.startswith("note:")]
    assert len(notes) == 1, result.stderr
    assert "server logged errors" in notes[0] and notes[0].endswith(str(home / LOG_NAME))
    assert "database was busy" in (home / LOG_NAME).read_text()


CLEAN_COMMAND = """
from flows.runners import prefect_api, prefect_environment
prefect_environment()
with prefect_api():
    pass
"""


def test_a_clean_command_prints_no_note_and_its_server_log_holds_no_error(tmp_path) -> None:
    """With the CLI's defaults (telemetry off) an idle server logs nothing alarming; with
    telemetry on, a fresh server logged "database is locked" from its telemetry heartbeat
    on the development machine, hence the default."""
    home = tmp_path / "prefect-home"
    result = run_script(CLEAN_COMMAND, str(home))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "note:" not in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert os.path.isfile(home / LOG_NAME), "the server's output went to its log"
    assert error_lines(str(home / LOG_NAME), 0) == []
