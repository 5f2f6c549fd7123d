"""What `tokcap status` says from the destination and the inbox alone (no `PREFECT_API_URL`,
no server), and what a command the Prefect API left mid-run exits with.

An inbox file whose attempts all ended before the run recorded its manifest was given up:
`needs-attention` (exit 1) with the attempt count, never `queued` forever; one with attempts
left is `queued` (exit 3), the inbox's next pass takes it. A command the API
left mid-run prints `interrupted` and exits with that word's code, 1. A run whose only
shortfall is malformed input lines names what completes it: new input, not a retrigger.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import orjson
import pytest

from capture_core.run.inbox import release_claim, run_id_for_file, take_claim
from capture_core.storage import ByteStore, open_byte_store
from tests.support.pipeline_helpers import REPO, run_cli


def inbox_run(tmp_path: Path) -> tuple[list[str], str, ByteStore]:
    """An inbox holding one file and the destination of its run: the `tokcap status`
    arguments that ask after the run, its run id and the destination's byte store."""
    inbox, dest = tmp_path / "inbox", str(tmp_path / "dest")
    inbox.mkdir()
    (inbox / "rollouts.jsonl").write_bytes(b'{"rollout_id": "a"}\n')
    run_id = run_id_for_file(f"{inbox}/rollouts.jsonl")
    args = ["status", "--dest", dest, "--run-id", run_id, "--inbox", str(inbox)]
    return args, run_id, open_byte_store(dest)


def fail_attempts(store: ByteStore, run_id: str, count: int) -> None:
    """`count` inbox passes claim the run's file (of at most 3) and fail before its manifest."""
    for attempt in range(count):
        decision = take_claim(store, run_id, f"pass-{attempt}", f"token-{attempt}", 300.0, 3)
        assert decision.claim is not None, decision
        release_claim(store, decision.claim, ok=False)


@pytest.mark.integrity
def test_a_given_up_inbox_file_without_a_manifest_needs_attention(tmp_path: Path) -> None:
    args, run_id, store = inbox_run(tmp_path)
    fail_attempts(store, run_id, 3)
    assert take_claim(store, run_id, "pass-4", "token-4", 300.0, 3).status == "given_up"
    text = run_cli(args, None)
    as_json = run_cli([*args, "--json"], None)
    assert (text.returncode, as_json.returncode) == (1, 1), text.stdout + text.stderr
    assert text.stdout.startswith(f"needs-attention: run {run_id}: 3 inbox attempt(s)"), text.stdout
    assert orjson.loads(as_json.stdout)["state"] == "needs-attention"


@pytest.mark.integrity
def test_an_inbox_file_with_attempts_left_is_queued_naming_how_many(tmp_path: Path) -> None:
    """One failed attempt of three is not given up: the inbox's next pass takes the file."""
    args, run_id, store = inbox_run(tmp_path)
    fail_attempts(store, run_id, 1)
    text = run_cli(args, None)
    as_json = run_cli([*args, "--json"], None)
    assert (text.returncode, as_json.returncode) == (3, 3), text.stdout + text.stderr
    assert text.stdout.startswith(f"queued: run {run_id}: 1 of 3 inbox attempts"), text.stdout
    assert "next pass tries it again" in text.stdout, text.stdout
    assert orjson.loads(as_json.stdout)["state"] == "queued"


@pytest.mark.integrity
def test_a_live_claim_without_a_manifest_is_queued(tmp_path: Path) -> None:
    args, run_id, store = inbox_run(tmp_path)
    assert take_claim(store, run_id, "pass-0", "token-0", 300.0, 3).status == "claimed"
    text = run_cli(args, None)
    assert text.returncode == 3, text.stdout + text.stderr
    assert text.stdout.startswith(f"queued: run {run_id}: attempt 1 (pass-0) claimed"), text.stdout


@pytest.mark.integrity
def test_a_command_the_api_left_exits_with_the_code_of_the_word_it_prints() -> None:
    """`stop_on_lost_api` ends the process at once (`os._exit`), so it runs in its own."""
    from capture_core.operator.run_verdict import EXIT_CODES
    from tokcap.flows.cli.output import interrupted_verdict

    code = (
        "import argparse; from tokcap.flows.cli.main import stop_on_lost_api; "
        "stop_on_lost_api(argparse.Namespace(command='retire'), 'the API stopped answering')"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert "tokcap retire: the API stopped answering" in done.stderr, done.stderr
    verdict = interrupted_verdict()
    assert done.returncode == verdict.exit_code == EXIT_CODES[verdict.state] == 1


@pytest.mark.integrity
def test_a_run_short_only_of_malformed_lines_names_new_input_not_a_retrigger() -> None:
    from tokcap.flows.cli.output import completing_line

    manifest = SimpleNamespace(run_id="bad-line", store="/tmp/store")
    summary = SimpleNamespace(malformed_lines=2, failed=0)
    line = completing_line(SimpleNamespace(summary=summary, manifest=manifest), "/d", False, "")
    assert "tokcap retrigger" not in line
    assert line.startswith("its input has 2 malformed input lines: Fix or remove those lines")
    assert "finalize them as a new run" in line and "run bad-line are handed off" in line
    summary.failed = 1  # a retrigger still hands off the failed rollouts
    line = completing_line(SimpleNamespace(summary=summary, manifest=manifest), "/d", False, "")
    assert "complete it with: tokcap retrigger" in line


def test_runs_judges_an_open_run_from_its_destination_and_claims(tmp_path: Path) -> None:
    """Without the API a started run cannot be told live or dead: `interrupted`, as status
    says; its claims are read without changing that."""
    from tests.support.claimed_runs import claimed_layout

    dest = str(tmp_path / "dest")
    store = open_byte_store(dest)
    claimed_layout(store, "open-run", batches=2, started_at=100.0)
    taken = take_claim(store, "open-run", "pass-0", "token-0", 300.0, 3)
    assert taken.status == "claimed"
    listed = run_cli(["runs", "--dest", dest, "--json"], None)
    assert listed.returncode == 0, listed.stderr
    (row,) = orjson.loads(listed.stdout)["runs"]
    assert (row["run_id"], row["state"]) == ("open-run", "interrupted"), row
    assert "no PREFECT_API_URL is set" in row["note"], row


@pytest.mark.integrity
def test_an_unknown_run_id_with_the_api_unreachable_says_the_api_was_not_asked(
    tmp_path: Path,
) -> None:
    """It said `unknown run id` (exit 2, a bad argument) although the run may exist only as
    a flow run: the Prefect API could not be asked. Exit 3, the unreachable API's code."""
    from tests.support.servers import free_port

    dest = tmp_path / "dest"
    dest.mkdir()
    api_url = f"http://127.0.0.1:{free_port()}/api"
    done = run_cli(["status", "--dest", str(dest), "--run-id", "nope"], api_url)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 3 and done.stdout == "", done.stderr
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"tokcap status: unknown run id nope at {dest}: no manifest")
    assert f"the Prefect API at {api_url} did not answer" in lines[0], lines[0]
    assert "whether a flow run carries run nope" in lines[0] and "is unknown" in lines[0]


def test_a_mistyped_run_id_is_named_with_its_close_match(tmp_path: Path) -> None:
    from tests.support.claimed_runs import claimed_layout

    dest = tmp_path / "dest"
    store = open_byte_store(str(dest))
    for run_id in ("demo-20261207-124002", "other-run"):
        claimed_layout(store, run_id, started_at=1.0)
    done = run_cli(["status", "--dest", str(dest), "--run-id", "demo-20261207-12400"], None)
    assert done.returncode == 2, done.stderr
    assert "unknown run id demo-20261207-12400" in done.stderr
    assert "did you mean --run-id demo-20261207-124002?" in done.stderr, done.stderr


def test_status_of_a_destination_that_does_not_exist_says_so_as_runs_does(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-dest")
    status = run_cli(["status", "--dest", missing, "--run-id", "x"], None)
    runs = run_cli(["runs", "--dest", missing], None)
    assert (status.returncode, runs.returncode) == (2, 2), status.stderr + runs.stderr
    said = f"--dest {missing} is not a directory; give the run's destination"
    assert said in runs.stderr and said in status.stderr, status.stderr
    assert "unknown run id" not in status.stderr
    assert not os.path.exists(missing)
