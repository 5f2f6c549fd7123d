"""`deployments/prefect.yaml` needs no checkout: module entrypoints, no pull steps, no paths.

Deploying it and running it on a worker, from an installed wheel, is tests/packaging/test_wheel.py.
"""

from __future__ import annotations

import inspect
import typing
from pathlib import Path

import yaml
from prefect import Flow
from prefect.utilities.importtools import import_object
from prefect.utilities.templating import apply_values
from pydantic import BaseModel

from capture_core.store.retirement import MIN_SWEEP_AGE_SECONDS, sweep_age_seconds
from tests.support.pipeline_helpers import REPO
from tokcap.flows.cli.main import main
from tokcap.flows.deploy_settings import SETTING_VARIABLES, shown_file
from tokcap.flows.inbox import FileSettings, finalize_inbox, finalize_inbox_file

SOURCE = Path(REPO, "deployments", "prefect.yaml")
EXPECTED = {
    "inbox-file": "finalize-inbox-file",
    "inbox": "finalize-inbox",
    "finalize-run": "finalize-run",
    "finalize-run-strict": "finalize-run",
    "dispatch-clear": "dispatch-clear",
    "sweep-retired": "sweep-retired",
    "retire-uploaded": "retire-uploaded",
    "retrigger-failed": "retrigger-failed",
}


def test_every_deployment_names_an_installed_flow_and_its_real_parameters() -> None:
    spec = yaml.safe_load(SOURCE.read_text())
    assert {d["name"] for d in spec["deployments"]} == set(EXPECTED)
    for deployment in spec["deployments"]:
        entrypoint = deployment["entrypoint"]
        assert ".py" not in entrypoint and "/" not in entrypoint, "a module path, not a file"
        flow = import_object(entrypoint)
        assert isinstance(flow, Flow) and flow.name == EXPECTED[deployment["name"]]
        accepted = inspect.signature(flow.fn).parameters
        assert set(deployment["parameters"]) <= set(accepted), deployment["name"]
        for name, value in deployment["parameters"].items():
            model = typing.get_type_hints(flow.fn).get(name)
            if isinstance(model, type) and issubclass(model, BaseModel):
                assert set(value) <= set(model.model_fields), (deployment["name"], name)
                # as `prefect deploy` fills them with no setting variable set: ""
                model.model_validate(apply_values(value, {}))


def test_both_inbox_flows_take_the_inbox_settings_as_one_parameter() -> None:
    """A pass hands its `settings` whole to each file's run: one model, never two lists."""
    for flow in (finalize_inbox, finalize_inbox_file):
        assert typing.get_type_hints(flow.fn)["settings"] is FileSettings
    child = set(inspect.signature(finalize_inbox_file.fn).parameters)
    assert child == {"rollouts", "run_id", "settings"}, "what an event and a fan-out fill in"


def test_the_sweep_runs_daily_with_a_safe_age_on_the_store() -> None:
    spec = yaml.safe_load(SOURCE.read_text())
    (sweep,) = [d for d in spec["deployments"] if d["name"] == "sweep-retired"]
    assert sweep["parameters"] == {"store": "{{ $TOKCAP_STORE }}", "older_than": "2d"}
    assert sweep_age_seconds(sweep["parameters"]["older_than"]) >= MIN_SWEEP_AGE_SECONDS
    (schedule,) = sweep["schedules"]
    assert schedule["active"] and schedule["timezone"] == "UTC"
    minute, hour, *every = schedule["cron"].split()
    assert every == ["*", "*", "*"] and minute.isdigit() and hour.isdigit(), "once a day"


def test_the_deployments_refer_to_no_checkout() -> None:
    text = SOURCE.read_text()
    spec = yaml.safe_load(text)
    assert spec["pull"] == [], "an empty pull keeps prefect from recording the deploying folder"
    assert spec["build"] is None and spec["push"] is None
    assert "TOKCAP_HOME" not in text and "set_working_directory" not in text
    assert "{{ $TOKCAP_INBOX }}" in text and "{{ $TOKCAP_STORE }}" in text


def test_tokcap_deployments_locates_the_shipped_file(capsys, monkeypatch) -> None:
    for name in SETTING_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert main(["deployments"]) == 0
    located = Path(capsys.readouterr().out.strip())
    assert located.read_text() == SOURCE.read_text()
    assert main(["deployments", "--show"]) == 0
    shown = capsys.readouterr().out
    assert shown == shown_file(SOURCE.read_text(), {}), "the file, its settings filled"
    assert '    rows: "none"  # default none' in shown and "    batch_size: 500  #" in shown


def test_unset_setting_variables_deploy_the_shipped_defaults(monkeypatch) -> None:
    """`prefect deploy` fills an unset variable as ""; each such setting keeps its default."""
    for name in SETTING_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    (inbox,) = [
        d for d in yaml.safe_load(SOURCE.read_text())["deployments"] if d["name"] == "inbox"
    ]
    filled = apply_values(inbox["parameters"]["settings"], {})
    assert {filled[field] for field in SETTING_VARIABLES.values()} == {""}
    settings = FileSettings.model_validate(filled)
    defaults = FileSettings(inbox="-", store="-", dest="-")
    for field in SETTING_VARIABLES.values():
        assert getattr(settings, field) == getattr(defaults, field), field
    assert (defaults.rows, defaults.batch_size, defaults.group_by) == ("none", 500, None)


def test_every_run_beats_often_enough_for_the_crash_automation_and_is_retriggered() -> None:
    """Three heartbeats fit in the silence that marks a run Crashed, for every deployed flow
    and the CLI's runs; a Crashed run is retriggered like a Failed one."""
    from tokcap.flows.automations import load_definitions
    from tokcap.flows.runners import CLI_PREFECT_DEFAULTS, HEARTBEAT_SETTING

    spec = yaml.safe_load(SOURCE.read_text())
    (crash,) = [
        a for a in load_definitions()["automations"] if a["name"] == "tokcap-crash-silent-runs"
    ]
    trigger = crash["trigger"]
    assert trigger["posture"] == "Proactive" and trigger["for_each"] == ["prefect.resource.id"]
    assert crash["actions"] == [{**crash["actions"][0], "type": "change-flow-run-state"}]
    assert crash["actions"][0]["state"] == "CRASHED"
    beats = [
        int(d["work_pool"]["job_variables"]["env"][HEARTBEAT_SETTING]) for d in spec["deployments"]
    ]
    beats.append(int(CLI_PREFECT_DEFAULTS[HEARTBEAT_SETTING]))
    assert all(3 * beat <= trigger["within"] for beat in beats), (beats, trigger["within"])
    flows = {import_object(d["entrypoint"]).name for d in spec["deployments"]}
    assert set(trigger["match_related"]["prefect.resource.name"]) == flows
    (retrigger,) = [d for d in spec["deployments"] if d["name"] == "retrigger-failed"]
    (on_failure,) = retrigger["triggers"]
    assert set(on_failure["expect"]) == {"prefect.flow-run.Failed", "prefect.flow-run.Crashed"}
    assert on_failure["parameters"]["failed_run"] == "{{ flow_run.id | string }}"
