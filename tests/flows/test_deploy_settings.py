"""The inbox settings set at deploy time by `TOKCAP_*` variables, checked by name.

A bad value or a near miss of a variable's name is refused before anything is deployed or
served, naming the variable and what it allows; a good one reaches the settings typed.
The deployments made with them on a real Prefect server: tests/flows/test_deploy_command.py.
"""

from __future__ import annotations

import pytest

from tests.support.pipeline_helpers import run_cli
from tokcap.flows.cli.main import main
from tokcap.flows.deploy_settings import SETTING_VARIABLES, deployed_settings
from tokcap.flows.serve import served_deployments

GIVEN = {
    "TOKCAP_ROWS": "parquet",
    "TOKCAP_DELIVERY": "all_traces",
    "TOKCAP_GROUP_BY": "task",
    "TOKCAP_RETIRE_AFTER_CONSUMER": "trainer",
    "TOKCAP_BATCH_SIZE": "7",
    "TOKCAP_MAX_GROUP_SIZE": "40",
    "TOKCAP_MAX_ATTEMPTS": "5",
    "TOKCAP_CLAIM_LEASE_SECONDS": "60",
}
SET = {
    "rows": "parquet",
    "delivery": "all_traces",
    "group_by": "task",
    "retire_after_consumer": "trainer",
    "batch_size": 7,
    "max_group_size": 40,
    "max_attempts": 5,
    "claim_lease_seconds": 60.0,
}


@pytest.fixture(autouse=True)
def no_setting_variables(monkeypatch) -> None:
    for name in SETTING_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def test_every_setting_variable_reaches_its_setting_typed() -> None:
    assert deployed_settings(GIVEN) == SET
    assert set(GIVEN) == set(SETTING_VARIABLES)
    arrow = {**GIVEN, "TOKCAP_ROWS": "arrow"}
    assert deployed_settings(arrow) == {**SET, "rows": "arrow"}, "arrow rows gate retirement too"


@pytest.mark.parametrize(
    ("variable", "text", "allowed"),
    [
        ("TOKCAP_ROWS", "parquett", "none or parquet or arrow"),
        ("TOKCAP_DELIVERY", "all", "main_chain or all_traces"),
        ("TOKCAP_GROUP_BY", "tasks", "none or task"),
        ("TOKCAP_BATCH_SIZE", "0", "a whole number above 0"),
        ("TOKCAP_BATCH_SIZE", "five", "a whole number above 0"),
        ("TOKCAP_CLAIM_LEASE_SECONDS", "-1", "a finite number of seconds, at least 10"),
        ("TOKCAP_RETIRE_AFTER_CONSUMER", "../x", "a consumer name"),
    ],
)
def test_a_bad_value_is_refused_by_name_before_show_serve_or_deploy(
    monkeypatch, capsys, variable: str, text: str, allowed: str
) -> None:
    monkeypatch.setenv(variable, text)
    for command in (
        ["deployments", "--show"],
        ["serve", "--inbox", "/in", "--store", "/store", "--dest", "/dest"],
        ["deploy"],
    ):
        assert main(command) == 2, command
        captured = capsys.readouterr()
        assert captured.out == "", "nothing shown, served or deployed"
        assert f"{variable}={text!r}" in captured.err and allowed in captured.err, captured.err


def test_a_near_miss_of_a_variable_name_is_refused_never_ignored(monkeypatch, capsys) -> None:
    monkeypatch.setenv("TOKCAP_ROW", "parquet")
    assert main(["deployments", "--show"]) == 2
    err = capsys.readouterr().err
    assert "TOKCAP_ROW is no tokcap variable: did you mean TOKCAP_ROWS?" in err, err


def test_a_consumer_without_rows_is_refused_naming_both(monkeypatch, capsys) -> None:
    monkeypatch.setenv("TOKCAP_RETIRE_AFTER_CONSUMER", "trainer")
    assert main(["deployments", "--show"]) == 2
    err = capsys.readouterr().err
    assert "TOKCAP_RETIRE_AFTER_CONSUMER" in err and "TOKCAP_ROWS=parquet" in err, err


def test_show_prints_what_the_variables_deploy(monkeypatch, capsys) -> None:
    for name, text in GIVEN.items():
        monkeypatch.setenv(name, text)
    assert main(["deployments", "--show"]) == 0
    shown = capsys.readouterr().out
    for line in ('rows: "parquet"', "batch_size: 7", 'group_by: "task"', "max_attempts: 5"):
        assert f"    {line}  # default" in shown, line
    assert '"{{ $TOKCAP_INBOX }}"' in shown, "locations stay placeholders"


def test_serve_honours_the_setting_variables(monkeypatch) -> None:
    for name, text in GIVEN.items():
        monkeypatch.setenv(name, text)
    served = {d.name: d for d in served_deployments("/in", "/store", "/dest")}
    for name in ("inbox", "inbox-file"):
        settings = served[name].parameters["settings"]
        assert {field: settings[field] for field in SET} == SET, name
        assert settings["inbox"] == "/in"


def test_serve_without_setting_variables_serves_the_shipped_defaults() -> None:
    served = {d.name: d for d in served_deployments("/in", "/store", "/dest")}
    settings = served["inbox-file"].parameters["settings"]
    assert (settings["rows"], settings["batch_size"], settings["group_by"]) == ("none", 500, None)
    assert settings["retire_after_consumer"] is None and settings["claim_lease_seconds"] == 300


def test_deploy_without_locations_names_them_and_deploys_nothing() -> None:
    unset = {name: "" for name in ("TOKCAP_INBOX", "TOKCAP_STORE", "TOKCAP_DEST")}
    done = run_cli(["deploy"], "http://127.0.0.1:9/api", unset)
    assert done.returncode == 2 and done.stdout == ""
    assert "set TOKCAP_INBOX, TOKCAP_STORE, TOKCAP_DEST" in done.stderr, done.stderr


@pytest.mark.integrity
def test_deploy_says_what_it_deployed_and_inbox_settings_only_with_an_inbox_one() -> None:
    from tokcap.flows.cli.deploy import deployed_line
    from tokcap.flows.serve import deployment_specs

    specs, settings = deployment_specs(), {"rows": "parquet", "batch_size": 7}
    assert deployed_line(["finalize-run"], settings, specs) == "deployed finalize-run"
    both = deployed_line(["inbox-file", "inbox"], settings, specs)
    assert both == (
        "deployed inbox-file, inbox; inbox settings of inbox-file, inbox: rows=parquet, "
        "batch_size=7"
    )
    every = deployed_line(None, settings, specs)
    assert every.startswith(f"deployed all {len(specs)} deployments (inbox-file, ")
    assert every.endswith("inbox settings of inbox-file, inbox: rows=parquet, batch_size=7")
