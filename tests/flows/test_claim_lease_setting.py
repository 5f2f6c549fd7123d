"""Without a Prefect server: a claim lease must be finite and at least the floor, wherever
it is set (`FileSettings`, `TOKCAP_CLAIM_LEASE_SECONDS`), the refusal naming the floor; and
a retrigger that meets a claim which never lapses (made before that check) ends
`NeedsAttention` naming the claim, instead of raising or waiting forever."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from capture_core.run.inbox import MIN_CLAIM_LEASE_SECONDS, HeldClaim
from tokcap.flows.cli.main import main
from tokcap.flows.deploy_settings import SETTING_VARIABLES, SettingVariableError, deployed_settings
from tokcap.flows.file_settings import FileSettings
from tokcap.flows.retrigger import NEEDS_ATTENTION
from tokcap.flows.retrigger_deferral import defer_retrigger

ODD_LEASES = ["inf", "Infinity", "nan", "-inf", "1e-9", "0.5", str(MIN_CLAIM_LEASE_SECONDS - 1)]
FLOOR = f"a finite number of seconds, at least {MIN_CLAIM_LEASE_SECONDS:g}"


@pytest.fixture(autouse=True)
def no_setting_variables(monkeypatch) -> None:
    for name in SETTING_VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.mark.integrity
@pytest.mark.parametrize("text", ODD_LEASES)
def test_an_odd_lease_is_refused_by_the_settings_naming_the_floor(text: str) -> None:
    for value in (text, float(text)):
        with pytest.raises(ValidationError) as refused:
            FileSettings(inbox="-", store="-", dest="-", claim_lease_seconds=value)
        assert FLOOR in str(refused.value), refused.value


@pytest.mark.integrity
@pytest.mark.parametrize("text", ODD_LEASES)
def test_an_odd_lease_variable_is_refused_before_show(monkeypatch, capsys, text: str) -> None:
    with pytest.raises(SettingVariableError, match="TOKCAP_CLAIM_LEASE_SECONDS"):
        deployed_settings({"TOKCAP_CLAIM_LEASE_SECONDS": text})
    monkeypatch.setenv("TOKCAP_CLAIM_LEASE_SECONDS", text)
    assert main(["deployments", "--show"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and FLOOR in captured.err, captured.err


def test_the_floor_itself_and_the_default_are_accepted() -> None:
    floor = {"TOKCAP_CLAIM_LEASE_SECONDS": f"{MIN_CLAIM_LEASE_SECONDS:g}"}
    assert deployed_settings(floor)["claim_lease_seconds"] == MIN_CLAIM_LEASE_SECONDS
    assert FileSettings(inbox="-", store="-", dest="-").claim_lease_seconds == 300


@pytest.mark.integrity
@pytest.mark.parametrize("lapses_at", [math.inf, 1e300])
def test_a_claim_that_never_lapses_ends_the_retrigger_for_a_person(lapses_at: float) -> None:
    held = HeldClaim(
        number=0, owner="pass-a", renewed_at=1.0, lapses_at=lapses_at, end_key="r/attempts/0.end"
    )
    state = defer_retrigger("r", held)
    assert state is not None and state.is_failed() and state.name == NEEDS_ATTENTION, state
    assert "claimed by pass-a" in state.message and "never lapses" in state.message
    assert "r/attempts/0.end" in state.message, state.message


@pytest.mark.integrity
def test_a_retrigger_of_a_run_made_with_an_odd_lease_is_left_to_a_person(tmp_path) -> None:
    """Settings an older release accepted can never validate again: the retrigger is refused
    (it ends `NeedsAttention`) instead of failing the same way each time."""
    from tokcap.flows.retrigger import RetriggerRefusedError, inbox_rerun
    from tokcap.tasks.flow_runs import RetriedRun

    where = {name: str(tmp_path / name) for name in ("inbox", "store", "dest")}
    settings = {**where, "claim_lease_seconds": "inf"}
    retried = RetriedRun(
        flow_run_id="f",
        flow="finalize-inbox-file",
        parameters={"rollouts": f"{where['inbox']}/a.jsonl", "run_id": "a", "settings": settings},
    )
    with pytest.raises(RetriggerRefusedError) as refused:
        inbox_rerun(retried)
    assert "run 'a' ran with inbox settings tokcap no longer accepts" in str(refused.value)
    assert FLOOR in str(refused.value), refused.value
