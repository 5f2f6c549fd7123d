"""On the session's Prefect server: the shipped inbox deployments made with the inbox
settings of `TOKCAP_*` variables, by `tokcap deploy` and by plain `prefect deploy`.

`tokcap deploy` refuses a bad value by name and deploys nothing; a good one is recorded in
the deployments' parameters and read back as the settings the variables name. Plain
`prefect deploy` with no setting variable set deploys the shipped defaults (Prefect fills an
unset variable as "", which the settings read as their default).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from prefect.client.orchestration import get_client
from prefect.exceptions import ObjectNotFound

from tests.flows.test_deploy_settings import GIVEN, SET
from tests.support.pipeline_helpers import run_cli
from tests.support.prefect_workers import prefect_cli
from tests.support.shipped_triggers import SHIPPED, shipped_automation_names
from tokcap.flows.deploy_settings import SETTING_VARIABLES
from tokcap.flows.file_settings import FileSettings

pytestmark = [pytest.mark.slow]

POOL = "tokcap-process"  # the shipped file's pool
INBOX_RUNS = ("finalize-inbox-file/inbox-file", "finalize-inbox/inbox")
ONLY_INBOX = ["--name", "inbox-file", "--name", "inbox"]


@pytest.fixture()
def deploy_env(tmp_path: Path, prefect_api: str) -> Iterator[dict[str, str]]:
    env = {k: v for k, v in os.environ.items() if k not in SETTING_VARIABLES}
    env.update(
        PREFECT_API_URL=prefect_api,
        TOKCAP_INBOX=str(tmp_path / "inbox"),
        TOKCAP_STORE=str(tmp_path / "store"),
        TOKCAP_DEST=str(tmp_path / "dest"),
    )
    prefect_cli(["work-pool", "create", POOL, "--type", "process", "--overwrite"], env, tmp_path)
    try:
        yield env
    finally:
        with get_client(sync_client=True) as client:
            for deployment in client.read_deployments():
                if deployment.work_pool_name == POOL:
                    client.delete_deployment(deployment.id)
            for automation in shipped_automation_names():
                for found in client.read_automations_by_name(automation):
                    client.delete_automation(found.id)


def deployed_settings(name: str) -> tuple[dict, FileSettings]:
    """A deployment's recorded `settings` parameter, and the settings its runs read."""
    with get_client(sync_client=True) as client:
        recorded = client.read_deployment_by_name(name).parameters["settings"]
    return recorded, FileSettings.model_validate(recorded)


def test_tokcap_deploy_records_the_variables_settings_and_refuses_a_bad_one(
    deploy_env: dict[str, str], prefect_api: str
) -> None:
    bad = run_cli(["deploy", *ONLY_INBOX], prefect_api, {**deploy_env, "TOKCAP_ROWS": "parquett"})
    assert bad.returncode == 2, bad.stderr
    assert "TOKCAP_ROWS='parquett'" in bad.stderr and "none or parquet" in bad.stderr
    with get_client(sync_client=True) as client, pytest.raises(ObjectNotFound):
        client.read_deployment_by_name(INBOX_RUNS[0])

    done = run_cli(["deploy", *ONLY_INBOX], prefect_api, {**deploy_env, **GIVEN})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    said = "deployed inbox-file, inbox; inbox settings of inbox-file, inbox: rows=parquet, "
    assert said + "delivery=all_traces" in done.stdout, done.stdout
    for name in INBOX_RUNS:
        recorded, settings = deployed_settings(name)
        assert {field: getattr(settings, field) for field in SET} == SET, name
        assert recorded["inbox"] == deploy_env["TOKCAP_INBOX"]
    shown = run_cli(["deployments", "--show"], prefect_api, {**deploy_env, **GIVEN})
    assert shown.returncode == 0 and '    rows: "parquet"  # default' in shown.stdout


def test_plain_prefect_deploy_without_variables_deploys_the_shipped_defaults(
    deploy_env: dict[str, str], tmp_path: Path
) -> None:
    deploy = ["--no-prompt", "deploy", *ONLY_INBOX, "--prefect-file", str(SHIPPED)]
    prefect_cli(deploy, deploy_env, tmp_path)
    defaults = FileSettings(inbox="-", store="-", dest="-")
    for name in INBOX_RUNS:
        recorded, settings = deployed_settings(name)
        assert recorded["rows"] == "" and recorded["batch_size"] == "", "as Prefect fills unset"
        for field in SETTING_VARIABLES.values():
            assert getattr(settings, field) == getattr(defaults, field), (name, field)
