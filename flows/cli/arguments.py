"""The `tokcap` commands' arguments: every command and option with its help, and the one
pass that checks them all (`check_args`) before any Prefect server starts.

The parser class (one-line usage errors with a close match) is `tokcap.flows.cli.parser`;
each check is in `tokcap.flows.cli.checks` or beside the command it belongs to.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from typing import Any

import orjson

from capture_core.builder import BUILDERS
from capture_core.builder.trace_envelope import DELIVERIES, MAIN_CHAIN
from capture_core.run.run_layout import ROW_FORMATS
from capture_core.run.task_groups import DEFAULT_MAX_GROUP_SIZE, GROUP_BY, group_by_setting
from tokcap.flows.cli.checks import (
    UsageError,
    absolute,
    check_api_set,
    check_consumer,
    check_cron,
    check_dest,
    check_locations_usable,
    check_rollouts,
    check_run_id,
    check_separate,
    check_spelling,
    check_storage_options,
    check_store,
    check_workdir,
    fraction,
    known_run,
    positive_int,
)
from tokcap.flows.cli.deploy import add_deploy_parser, check_setting_variables
from tokcap.flows.cli.docs import add_docs_command
from tokcap.flows.cli.events import add_event_commands, check_event_args
from tokcap.flows.cli.gateway import add_gateway_command, check_gateway_args
from tokcap.flows.cli.inputs import add_inputs_command, check_inputs_args
from tokcap.flows.cli.parser import Parser
from tokcap.flows.cli.runs import add_runs_command, check_runs_args
from tokcap.flows.cli.sweep import add_sweep
from tokcap.flows.demo import DEFAULT_ROLLOUTS
from tokcap.flows.runners import parse_task_runner


def add_storage(parser: argparse.ArgumentParser, source: bool = True) -> None:
    parser.add_argument(
        "--storage-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="fsspec option for s3:// locations (endpoint_url=..., key=..., "
        "secret=...); repeatable",
    )
    if source:
        parser.add_argument(
            "--source-kwarg",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="keyword argument for a module.path:ClassName store; repeatable",
        )


STORE_HELP = "capture store: a path, an s3:// URL, or module.path:ClassName"
DEST_HELP = "destination of finalized records: a path or an s3:// URL"


def _add_finalize(commands: Any) -> None:
    finalize = commands.add_parser("finalize", help="finalize, hand off and retire a run")
    finalize.add_argument("--rollouts", required=True, help="rollout records file (JSON lines)")
    finalize.add_argument("--store", required=True, help=STORE_HELP)
    finalize.add_argument("--dest", required=True, help=DEST_HELP)
    finalize.add_argument("--run-id", required=True, help="names the run under --dest")
    finalize.add_argument(
        "--batch-size", type=positive_int, default=500, help="rollouts per batch (default 500)"
    )
    finalize.add_argument(
        "--builder",
        choices=BUILDERS,
        default=BUILDERS[0],
        help=f"trajectory builder: {', '.join(BUILDERS)} (default {BUILDERS[0]})",
    )
    finalize.add_argument(
        "--delivery",
        choices=DELIVERIES,
        default=MAIN_CHAIN,
        help="main_chain rebuilds response.output (default); all_traces adds the "
        "training_traces envelope, every sampled call owned once (tokcap docs traces)",
    )
    finalize.add_argument(
        "--max-mask-fraction",
        type=fraction,
        default=None,
        help="stop the run when more than this fraction (0-1) of the rollouts finalized so far "
        "is masked, judged after every batch (1 never stops it)",
    )
    finalize.add_argument(
        "--mask-fraction-min-samples",
        type=positive_int,
        default=50,
        help="rollouts seen before --max-mask-fraction applies (default 50)",
    )
    finalize.add_argument(
        "--rows",
        choices=ROW_FORMATS,
        default="none",
        help="trainer rows written beside each part: parquet (what every table tool reads), "
        "arrow (Arrow IPC, a trainer's fastest read), or none (default)",
    )
    finalize.add_argument(
        "--retire-after-consumer",
        default=None,
        metavar="NAME",
        help="hand off but retire nothing now: `tokcap retire` and the inbox retire each batch "
        "once row consumer NAME acknowledged it (needs --rows parquet or arrow)",
    )
    finalize.add_argument(
        "--group-by",
        choices=GROUP_BY,
        default=GROUP_BY[0],
        help="task: no part splits the rollouts of one task index (a GRPO group); a batch "
        "grows past --batch-size to finish its groups (default none)",
    )
    finalize.add_argument(
        "--max-group-size",
        type=positive_int,
        default=DEFAULT_MAX_GROUP_SIZE,
        metavar="N",
        help="with --group-by task: refuse a task of more than N rollouts, or a batch that "
        f"cannot close within N rollouts past --batch-size (default {DEFAULT_MAX_GROUP_SIZE})",
    )
    finalize.add_argument(
        "--task-runner",
        default=None,
        metavar="dask[=ADDRESS]",
        help="run finalize batches on a Dask cluster (local when no address)",
    )
    add_storage(finalize)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="tokcap", description="Token-capture finalization.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    _add_finalize(commands)

    clear = commands.add_parser("clear", help="dispatch-time clear of the given rollouts")
    clear.add_argument("--rollouts", required=True, help="rollout records file (JSON lines)")
    clear.add_argument("--store", required=True, help=STORE_HELP)
    add_storage(clear)
    add_sweep(commands, add_storage, STORE_HELP)
    add_event_commands(commands, add_storage)
    add_inputs_command(commands, add_storage)
    add_runs_command(commands, add_storage, DEST_HELP)
    add_gateway_command(commands, add_storage, STORE_HELP)
    add_docs_command(commands)

    for name, text in (
        ("retire", "retire what a run handed off"),
        ("retrigger", "re-run what did not complete in a run"),
    ):
        sub = commands.add_parser(name, help=text)
        sub.add_argument("--dest", required=True, help=DEST_HELP)
        sub.add_argument("--run-id", required=True, help=f"the run to {name} (under --dest)")
        sub.add_argument("--store", required=True, help=STORE_HELP)
        add_storage(sub)

    status = commands.add_parser("status", help="show a run's ledger summary")
    status.add_argument("--dest", required=True, help=DEST_HELP)
    status.add_argument("--run-id", required=True, help="the run to show (under --dest)")
    status.add_argument(
        "--json",
        action="store_true",
        help="print the run's state, manifest, summary and row consumers as JSON",
    )
    status.add_argument(
        "--inbox",
        help="the inbox `tokcap submit` placed the run's file in: a file not started yet "
        "is then reported queued",
    )
    add_storage(status, source=False)

    demo = commands.add_parser("demo", help="end-to-end demo on a local store")
    demo.add_argument("--workdir", default="tokcap-demo", help="default ./tokcap-demo")
    demo.add_argument(
        "--rollouts",
        dest="demo_rollouts",
        type=positive_int,
        default=DEFAULT_ROLLOUTS,
        metavar="N",
        help=f"rollouts to make: the {DEFAULT_ROLLOUTS} scripted cases, then seeded agent "
        f"rollouts (default {DEFAULT_ROLLOUTS})",
    )

    serve = commands.add_parser("serve", help="serve the deployments with their schedules")
    serve.add_argument("--inbox", required=True, help="folder URL of rollout files to finalize")
    serve.add_argument("--store", required=True, help=STORE_HELP)
    serve.add_argument("--dest", required=True, help=DEST_HELP)
    serve.add_argument("--cron", help="schedule of the inbox deployment (default: prefect.yaml's)")

    deployments = commands.add_parser(
        "deployments", help="print the path of the shipped prefect.yaml, for prefect deploy"
    )
    shown = deployments.add_mutually_exclusive_group()
    shown.add_argument("--show", action="store_true", help="print its contents instead")
    shown.add_argument(
        "--check",
        action="store_true",
        help="list the deployments on PREFECT_API_URL's server made with entrypoints of an "
        "older tokcap (exit 1 when there are any)",
    )
    add_deploy_parser(commands)
    return parser


CREDENTIAL_ENV = {
    "key": "AWS_ACCESS_KEY_ID",
    "secret": "AWS_SECRET_ACCESS_KEY",
    "token": "AWS_SESSION_TOKEN",
}


def parse_options(pairs: Sequence[str], flag: str = "--storage-option") -> dict[str, Any]:
    """`key=value` pairs to options; values are JSON when they parse, else strings."""
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"{flag} {pair!r} must look like key=value")
        try:
            options[key] = orjson.loads(value)
        except orjson.JSONDecodeError:
            options[key] = value
    return options


def split_credentials(options: dict[str, Any]) -> dict[str, Any]:
    """Move credentials into the environment; return the options safe to pass to a flow."""
    public = {}
    for key, value in options.items():
        if key in CREDENTIAL_ENV:
            os.environ[CREDENTIAL_ENV[key]] = str(value)
        else:
            public[key] = value
    return public


def check_args(args: argparse.Namespace) -> None:
    """Check every argument and make local paths absolute; raises `UsageError`."""
    args.options = split_credentials(parse_options(getattr(args, "storage_option", [])))
    args.source_kwargs = parse_options(getattr(args, "source_kwarg", []), "--source-kwarg")
    check_storage_options(args.options)
    check_spelling(args)
    if getattr(args, "run_id", None) is not None:
        check_run_id(args)
    if getattr(args, "rollouts", None) is not None:
        check_rollouts(args)
    if getattr(args, "store", None) is not None and args.command != "gateway":
        check_store(args, must_exist=args.command != "serve")
    if getattr(args, "dest", None) is not None:
        check_dest(args, must_exist=args.command in ("retire", "retrigger"))
    if args.command == "serve":
        args.inbox = absolute(args.inbox)
    check_separate(args)
    if args.command == "finalize":
        args.group_by = group_by_setting(args.group_by)  # the run setting: none is None
        check_consumer(args)
        try:
            parse_task_runner(args.task_runner)
        except ValueError as exc:
            raise UsageError(f"--task-runner: {exc}") from None
    check_locations_usable(args)
    if args.command == "status" and args.inbox:
        args.inbox = absolute(args.inbox)
    if args.command in ("retire", "retrigger"):
        known_run(args.dest, args.run_id, args.options)
    if args.command == "serve" and args.cron is not None:
        check_cron(args.cron)
    if args.command == "demo":
        check_workdir(args)
    check_setting_variables(args)
    if args.command == "deployments" and args.check:
        check_api_set("--check reads the deployments of the server PREFECT_API_URL names")
    check_event_args(args)
    check_inputs_args(args)
    check_runs_args(args)
    check_gateway_args(args)
