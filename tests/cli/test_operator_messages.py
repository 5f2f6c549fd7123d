"""What an operator is told points at something real: the mask alert names an automation only
where the Prefect API has it, a temporary server is announced on stderr, and a malformed or
cut-short input line is named with its file, its line and what to do.

Every command runs as a real `tokcap` subprocess, on the session's Prefect server or on the
temporary server a new user's command starts.
"""

from __future__ import annotations

import re

import orjson
import pytest

from capture_core.operator.run_outcome import MASK_ALERT_AUTOMATION, MASK_ALERT_EVENT
from capture_core.store import TokenCaptureStore
from tests.support.pipeline_helpers import (
    finalize_args,
    finalize_args_for,
    make_batch,
    run_cli,
    write_rollouts,
)
from tests.support.shipped_triggers import remove_applied
from tokcap.flows.runners import STARTING
from tokcap.flows.temporary_server import LOG_NAME

ABOVE = "mask rate 25% (1 of 4), above the alert threshold of 10%: "


def mask_line(stdout: str) -> str:
    return next(line for line in stdout.splitlines() if line.startswith("mask rate "))


def test_the_mask_alert_names_the_automation_where_the_api_has_it(
    run_inputs, prefect_api: str
) -> None:
    from tokcap.flows.automations import apply_automations

    try:
        assert MASK_ALERT_AUTOMATION in apply_automations().automations
        result = run_cli(finalize_args_for(run_inputs, "alerted"), prefect_api)
    finally:
        remove_applied()
    assert result.returncode == 0, result.stderr[-2000:]
    assert mask_line(result.stdout) == (
        f"{ABOVE}the mask alert fired (event {MASK_ALERT_EVENT}; "
        f"automation {MASK_ALERT_AUTOMATION})"
    )
    assert STARTING not in result.stderr, "a configured API needs no temporary server"


def test_a_temporary_server_is_announced_and_its_alert_names_no_automation(
    run_inputs, tmp_path
) -> None:
    """A temporary server has no automations: the line says what crossed the threshold."""
    home = str(tmp_path / "prefect-home")
    result = run_cli(finalize_args_for(run_inputs, "unwatched"), None, env={"PREFECT_HOME": home})
    assert result.returncode == 0, result.stderr[-2000:]
    assert mask_line(result.stdout) == (
        f"{ABOVE}the mask rate crossed it, so the run emitted event {MASK_ALERT_EVENT}"
    )
    assert "automation" not in result.stdout
    assert result.stderr.splitlines()[0] == f"tokcap finalize: {STARTING}"
    assert result.stderr.count(STARTING) == 1


@pytest.mark.parametrize("json", [False, True])
def test_a_reading_command_starts_no_server_and_keeps_its_json_clean(
    run_inputs, tmp_path, prefect_api: str, json: bool
) -> None:
    """`status`, `runs` and `deployments` read the destination and the package only."""
    done = run_cli(finalize_args_for(run_inputs, "read"), prefect_api)
    assert done.returncode == 0, done.stderr[-2000:]
    home = str(tmp_path / "prefect-home")
    flag = ["--json"] if json else []
    commands = [
        ["status", "--dest", run_inputs["dest"], "--run-id", "read", *flag],
        ["runs", "--dest", run_inputs["dest"], *flag],
        ["deployments"],
    ]
    for args in commands:
        result = run_cli(args, None, env={"PREFECT_HOME": home})
        assert result.returncode == 0, result.stderr[-2000:]
        assert STARTING not in result.stderr and "temporary" not in result.stderr
        if json and args[0] != "deployments":
            orjson.loads(result.stdout)
    assert not (tmp_path / "prefect-home" / LOG_NAME).exists(), "no temporary server ran"
    assert not list((tmp_path / "prefect-home").glob("*.db")), "no database was made"


def test_a_malformed_or_cut_short_line_names_the_file_the_line_and_what_to_do(
    tmp_path, prefect_api: str
) -> None:
    store, dest = str(tmp_path / "store"), str(tmp_path / "dest")
    bad = write_rollouts(
        str(tmp_path / "bad.jsonl"),
        make_batch(TokenCaptureStore(store), 2),
        extra_lines=[b"{oops\n", b'{"_ng_rollout_id": "7-9", "respo'],  # the last one cut
    )
    result = run_cli(finalize_args(bad, store, dest, "bad-lines"), prefect_api)
    assert result.returncode == 1, result.stderr[-2000:]
    err = result.stderr
    assert re.search(
        rf"{re.escape(bad)} line 3: malformed JSON \(.*\); repair or drop that line", err
    )
    assert f"{bad} line 4: malformed JSON, cut short: the file ends inside this line" in err
    assert "collect that rollout again, or finalize its complete line in a new file" in err
    assert "re-running it cannot succeed while the" in err
    assert "Traceback" not in err
