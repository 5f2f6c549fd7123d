"""`tokcap deploy`: deploy the shipped `prefect.yaml` with the inbox settings of the environment.

The inbox settings (rows, delivery, group-by, ...) are `TOKCAP_*` environment variables that
the shipped file reads (`tokcap.flows.deploy_settings`); this command checks them and the
locations first, refusing a bad one by name, then runs `prefect deploy` with every setting
spelled out, so each deployment records the settings it runs with, defaults included.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

from tokcap.flows.cli.checks import UsageError, check_api_set
from tokcap.flows.deploy_settings import (
    LOCATIONS,
    SettingVariableError,
    deploy_environment,
    deployed_settings,
)

SETTING_COMMANDS = ("deploy", "serve", "deployments")  # the commands that read the variables


def add_deploy_parser(commands: argparse._SubParsersAction) -> None:
    """The `deploy` command's arguments."""
    deploy = commands.add_parser(
        "deploy",
        help="deploy the shipped prefect.yaml to PREFECT_API_URL's server, with the inbox "
        "settings of the TOKCAP_* variables (deployments/README.md)",
    )
    deploy.add_argument(
        "--name",
        action="append",
        metavar="DEPLOYMENT",
        help="deploy only this one (repeatable; default: all)",
    )


def check_setting_variables(args: argparse.Namespace) -> None:
    """Refuse a bad `TOKCAP_*` inbox setting before a command that deploys or shows it;
    `deploy` also needs the locations and a server."""
    if args.command not in SETTING_COMMANDS:
        return
    try:
        deployed_settings(os.environ)
    except SettingVariableError as exc:
        raise UsageError(str(exc)) from None
    if args.command != "deploy":
        return
    check_api_set("deploy creates the deployments on the server PREFECT_API_URL names")
    unset = [name for name in LOCATIONS if not os.environ.get(name)]
    if unset:
        raise UsageError(
            f"set {', '.join(unset)}: the deployments' inbox, store and destination "
            "(paths or s3:// URLs)"
        )


def cmd_deploy(args: argparse.Namespace) -> int:
    from tokcap.flows.serve import prefect_file

    env = deploy_environment(os.environ)
    names = [arg for name in args.name or [] for arg in ("--name", name)]
    chosen = names or ["--all"]
    command = [sys.executable, "-m", "prefect", "--no-prompt", "deploy", *chosen]
    done = subprocess.run([*command, "--prefect-file", str(prefect_file())], env=env)
    if done.returncode != 0:
        print(f"tokcap deploy: prefect deploy failed (exit {done.returncode})", file=sys.stderr)
        return 1
    from tokcap.flows.serve import deployment_specs

    print(deployed_line(args.name, deployed_settings(os.environ), deployment_specs()))
    return 0


def deployed_line(
    names: list[str] | None, settings: Mapping[str, Any], specs: list[dict[str, Any]]
) -> str:
    """What `tokcap deploy` deployed: the deployments `--name` chose (all of the file's
    without it), and the inbox settings only when a deployment taking them was among them."""
    every = [str(spec["name"]) for spec in specs]
    chosen = list(names) if names else every
    what = ", ".join(chosen) if names else f"all {len(every)} deployments ({', '.join(every)})"
    inbox = [
        str(spec["name"])
        for spec in specs
        if spec["name"] in chosen and "settings" in (spec.get("parameters") or {})
    ]
    if not inbox:
        return f"deployed {what}"
    shown = ", ".join(f"{field}={value}" for field, value in settings.items())
    return f"deployed {what}; inbox settings of {', '.join(inbox)}: {shown}"
