"""`tokcap serve` serves the deployments `prefect.yaml` defines, with the given locations."""

from __future__ import annotations

import yaml

from tests.support.pipeline_helpers import run_cli
from tokcap.flows.serve import deployment_specs, prefect_file, served_deployment, served_deployments
from tokcap.flows.submit import SUBMITTED

ENV = {"TOKCAP_INBOX": "/in", "TOKCAP_STORE": "/store", "TOKCAP_DEST": "/dest"}


def test_served_deployments_are_the_files_deployments() -> None:
    spec = yaml.safe_load(prefect_file().read_text())
    served = [served_deployment(d, ENV, None) for d in deployment_specs()]
    assert [d.name for d in served] == [d["name"] for d in spec["deployments"]]


def test_placeholders_are_filled_with_the_given_locations() -> None:
    inbox = next(d for d in deployment_specs() if d["name"] == "inbox")
    settings = served_deployment(inbox, ENV, None).parameters["settings"]
    assert (settings["inbox"], settings["store"], settings["dest"]) == (
        "/in",
        "/store",
        "/dest",
    )


def test_the_inbox_schedule_is_the_files_unless_overridden() -> None:
    inbox = next(d for d in deployment_specs() if d["name"] == "inbox")
    cron = inbox["schedules"][0]["cron"]
    assert [s.schedule.cron for s in served_deployment(inbox, ENV, None).schedules] == [cron]
    overridden = served_deployment(inbox, ENV, "0 * * * *")
    assert [s.schedule.cron for s in overridden.schedules] == ["0 * * * *"]


def test_on_demand_deployments_have_no_schedule() -> None:
    clear = next(d for d in deployment_specs() if d["name"] == "dispatch-clear")
    assert served_deployment(clear, ENV, None).schedules == []


def test_cron_reschedules_the_inbox_only_and_the_sweep_keeps_its_daily_schedule() -> None:
    sweep = next(d for d in deployment_specs() if d["name"] == "sweep-retired")
    served = {d.name: d for d in served_deployments("/in", "/store", "/dest", "0 * * * *")}
    assert [s.schedule.cron for s in served["inbox"].schedules] == ["0 * * * *"]
    daily = [s.schedule.cron for s in served["sweep-retired"].schedules]
    assert daily == [sweep["schedules"][0]["cron"]]
    assert served["sweep-retired"].parameters == {"store": "/store", "older_than": "2d"}


def test_serve_refuses_without_a_server_that_runs_schedules() -> None:
    done = run_cli(["serve", "--inbox", "/in", "--store", "/store", "--dest", "/dest"], "")
    assert done.returncode == 1
    (line,) = done.stderr.splitlines()
    assert "prefect server start" in line and "PREFECT_API_URL" in line


def test_served_deployments_carry_the_files_triggers_with_locations_filled() -> None:
    specs = {d["name"]: d for d in deployment_specs()}
    served = served_deployment(specs["inbox-file"], ENV, None)
    (trigger,) = served.triggers
    assert trigger.expect == {SUBMITTED}
    assert trigger.match.root["tokcap.inbox"] == "/in"
    assert trigger.parameters == {
        "rollouts": "{{ event.payload.rollouts }}",
        "run_id": "{{ event.payload.run_id }}",
    }
