"""Without a Prefect server: a `TOKCAP_*` variable tokcap does not read is refused by the
commands that read the inbox settings, naming the closest one it reads, never ignored (a
misspelled setting would deploy its default in silence); the list of names tokcap reads is
the one its sources use, and the variables tokcap's own test suite sets are let through."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tokcap.flows.cli.main import main
from tokcap.flows.deploy_settings import (
    READ_VARIABLES,
    SETTING_VARIABLES,
    TEST_SUITE_VARIABLES,
    SettingVariableError,
    deployed_settings,
)

ROOT = Path(__file__).resolve().parents[2]
QUOTED = re.compile(r"[\"']?\$?\b(TOKCAP_[A-Z0-9_]+)[\"']")
SHELL = re.compile(r"(?:\$|ENV )(TOKCAP_[A-Z0-9_]+)")


@pytest.fixture(autouse=True)
def no_setting_variables(monkeypatch) -> None:
    for name in SETTING_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def names_in(*folders: str) -> set[str]:
    """The `TOKCAP_*` names quoted in code (or read as `$NAME`) under `folders`."""
    found: set[str] = set()
    for folder in folders:
        for path in (ROOT / folder).rglob("*"):
            if path.is_file() and (path.suffix in {".py", ".yaml"} or path.name == "Dockerfile"):
                text = path.read_text(encoding="utf-8")
                found |= set(QUOTED.findall(text)) | set(SHELL.findall(text))
    return found


@pytest.mark.integrity
@pytest.mark.parametrize(
    ("name", "meant"),
    [
        ("TOKCAP_ROW_FORMAT", "TOKCAP_ROWS"),
        ("TOKCAP_MAX_MASK_FRACTION", "TOKCAP_MAX_ATTEMPTS"),
        ("TOKCAP_CONSUMER", "TOKCAP_RETIRE_AFTER_CONSUMER"),
        ("TOKCAP_LEASE", "TOKCAP_CLAIM_LEASE_SECONDS"),
        ("TOKCAP_ROW", "TOKCAP_ROWS"),
    ],
)
def test_a_name_tokcap_does_not_read_is_refused_naming_the_closest(
    monkeypatch, capsys, name: str, meant: str
) -> None:
    with pytest.raises(SettingVariableError, match=f"did you mean {meant}\\?"):
        deployed_settings({name: "parquet"})
    monkeypatch.setenv(name, "parquet")
    for command in (
        ["deployments", "--show"],
        ["serve", "--inbox", "/in", "--store", "/store", "--dest", "/dest"],
        ["deploy"],
    ):
        assert main(command) == 2, command
        captured = capsys.readouterr()
        assert captured.out == "", "nothing shown, served or deployed"
        assert f"{name} is no tokcap variable: did you mean {meant}?" in captured.err


def test_every_name_tokcap_reads_is_let_through() -> None:
    env = {name: "" for name in (*READ_VARIABLES, *TEST_SUITE_VARIABLES)}
    assert deployed_settings(env)["rows"] == "none"


def test_the_names_tokcap_reads_are_the_ones_its_sources_use() -> None:
    product = names_in("capture_core", "flows", "tasks", "deployments")
    assert set(READ_VARIABLES) <= product, set(READ_VARIABLES) - product
    assert product <= {*READ_VARIABLES, *TEST_SUITE_VARIABLES}, product - set(READ_VARIABLES)


def test_the_test_suites_own_names_are_exactly_those_let_through() -> None:
    helpers = names_in("tests/support", "tests/packaging", "tests/api", "bench", ".ci")
    assert helpers - set(READ_VARIABLES) == set(TEST_SUITE_VARIABLES)


def test_the_error_names_no_test_hook_and_says_what_the_pool_variable_sets(capsys) -> None:
    """`TOKCAP_CRASH_AT` kills the process at a named step (crash tests only); it was listed
    among the variables a user may set, and `TOKCAP_POOL` was named with no word of its use."""
    with pytest.raises(SettingVariableError) as refused:
        deployed_settings({"TOKCAP_ROWZ": "parquet"})
    message = str(refused.value)
    assert "did you mean TOKCAP_ROWS?" in message
    assert "TOKCAP_CRASH_AT" not in message and "CRASH" not in message
    assert "TOKCAP_POOL (the work pool the shipped worker image serves)" in message
    with pytest.raises(SettingVariableError) as crash:
        deployed_settings({"TOKCAP_CRASH_AFTER": "x"})  # a hook is never the suggestion
    assert "CRASH_AT" not in str(crash.value), crash.value
