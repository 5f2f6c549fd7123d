"""`tokcap submit` and `tokcap automations`: the event path's commands; the rest of the
CLI (`tokcap.flows.cli`) imports this module.

Both talk to the server named by `PREFECT_API_URL`, never to a temporary one: an event or
an automation on a server that stops with the command would reach no worker.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from tokcap.flows.cli.checks import UsageError, absolute, positive_int

NOT_ANNOUNCED = "the inbox deployment's scheduled pass finalizes it"
NOT_ANNOUNCED_EXIT = 3
"""`tokcap submit`'s exit status when a file was placed but not announced: it waits for the
inbox's next scheduled pass instead of starting a run now."""


def add_event_commands(commands: Any, add_storage: Callable[..., None]) -> None:
    """The `submit` and `automations` subcommands."""
    submit = commands.add_parser(
        "submit", help="place rollout files into the inbox and announce each with an event"
    )
    submit.add_argument("--inbox", required=True, help="folder URL of the inbox")
    submit.add_argument("files", nargs="+", metavar="FILE", help="rollout files (*.jsonl)")
    add_storage(submit, source=False)
    automations = commands.add_parser(
        "automations", help="apply the shipped automations and concurrency limits"
    )
    verbs = automations.add_subparsers(
        dest="verb", metavar="VERB", required=True, help="apply: the only verb"
    )
    apply = verbs.add_parser("apply", help="create or replace them on the PREFECT_API_URL server")
    apply.add_argument("--file", help="automations file (default: the shipped automations.yaml)")
    apply.add_argument(
        "--store-request-limit",
        type=positive_int,
        default=None,
        metavar="N",
        help="store requests in flight across all workers (default: the file's)",
    )


def check_event_args(args: argparse.Namespace) -> None:
    """Make the submit locations absolute; raises `UsageError`."""
    if args.command == "submit":
        args.inbox = absolute(args.inbox)
        args.files = [absolute(f) for f in args.files]


def cmd_submit(args: argparse.Namespace) -> int:
    """Submit each file in turn; one `run id: <id>` line per file submitted.

    Exit 0 when every file was announced, `NOT_ANNOUNCED_EXIT` when one was placed but no
    server took its event (or none is configured).
    """
    from tokcap.flows.submit import SubmitRefusedError, submit_files

    waiting = False
    for source in args.files:
        try:
            (result,) = submit_files(args.inbox, [source], args.options or None)
        except SubmitRefusedError as exc:
            raise UsageError(str(exc)) from None
        print(f"run id: {result.run_id}", flush=True)
        if not result.placed:
            print(f"{result.url} was already in the inbox with this content", file=sys.stderr)
        if result.not_announced:
            waiting = True
            print(
                f"tokcap submit: {result.url} not announced: {result.not_announced}; "
                + NOT_ANNOUNCED
                + f" (exit status {NOT_ANNOUNCED_EXIT})",
                file=sys.stderr,
            )
    return NOT_ANNOUNCED_EXIT if waiting else 0


def cmd_automations(args: argparse.Namespace) -> int:
    """Apply the automations file to the configured server and print what exists now."""
    from pathlib import Path

    from prefect.settings import PREFECT_API_URL

    from tokcap.flows.automations import apply_automations

    if not PREFECT_API_URL.value():
        raise UsageError(
            "no Prefect server to apply them to: start one (prefect server start) and set "
            "PREFECT_API_URL=http://127.0.0.1:4200/api"
        )
    path = Path(args.file) if args.file else None
    if path is not None and not path.is_file():
        raise UsageError(f"--file {args.file} does not exist")
    applied = apply_automations(path, args.store_request_limit)
    for name in applied.automations:
        print(f"automation: {name}")
    for name, limit in applied.limits.items():
        print(f"concurrency limit: {name} = {limit}")
    return 0
