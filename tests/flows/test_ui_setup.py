"""What an operator sees in the Prefect UI: a server on another port, the mask-alert automation.

The port facts are Prefect's own settings, read in a fresh process as a server would read them;
the docs step that chooses the port must carry the setting the UI needs.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from prefect.events.schemas.automations import AutomationCore

from capture_core.operator.run_outcome import MASK_ALERT_AUTOMATION, MASK_ALERT_EVENT
from tests.support.pipeline_helpers import REPO
from tokcap.flows.automations import load_definitions

READ_UI_API_URL = (
    "from prefect.settings import PREFECT_UI_API_URL; print(PREFECT_UI_API_URL.value())"
)


def ui_api_url(**settings: str) -> str:
    """The API URL a server started with `settings` in its environment gives its UI."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env["PREFECT_HOME"] = os.environ.get("PREFECT_HOME", "")
    done = subprocess.run(
        [sys.executable, "-c", READ_UI_API_URL],
        env={**env, **settings},
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def test_a_server_on_another_port_needs_prefect_ui_api_url_and_the_docs_say_so() -> None:
    # `prefect server start --port 4300` passes the port to uvicorn only: its UI is told
    # PREFECT_UI_API_URL, which falls back to PREFECT_API_URL, else port 4200.
    assert ui_api_url() == "http://127.0.0.1:4200/api"
    assert ui_api_url(PREFECT_API_URL="http://127.0.0.1:4200/api").endswith(":4200/api")
    told = ui_api_url(
        PREFECT_UI_API_URL="http://127.0.0.1:4300/api", PREFECT_API_URL="http://x:4200/api"
    )
    assert told == "http://127.0.0.1:4300/api", "the setting the docs give wins"
    readme = Path(REPO, "deployments", "README.md").read_text(encoding="utf-8")
    start = next(line for line in readme.splitlines() if "prefect server start --host" in line)
    assert re.search(r"PREFECT_UI_API_URL=http://127\.0\.0\.1:\$PORT/api", start), start
    assert "Can't connect to Server API" in readme


def test_the_mask_alert_automation_says_where_the_alert_shows() -> None:
    (spec,) = [a for a in load_definitions()["automations"] if a["name"] == MASK_ALERT_AUTOMATION]
    automation = AutomationCore.model_validate(spec)
    assert automation.trigger.expect == {MASK_ALERT_EVENT}
    words = automation.description
    assert "Event Feed" in words and MASK_ALERT_EVENT in words, words
    assert "report" in words and "the mask alert fired" in words, words
    assert "empty on purpose" in words and "send-notification" in words, words
