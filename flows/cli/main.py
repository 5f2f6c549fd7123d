"""The `tokcap` console script: parse, check, run the command, report its outcome.

Checks come before any Prefect server starts; a command that needs one gets a temporary
server unless `PREFECT_API_URL` names one. Every failure is printed here, in one line.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable
from functools import partial
from typing import NoReturn

from tokcap.flows.cli.arguments import build_parser, check_args
from tokcap.flows.cli.checks import UnavailableError, UsageError, run_summary
from tokcap.flows.cli.commands import (
    cmd_clear,
    cmd_demo,
    cmd_deployments,
    cmd_finalize,
    cmd_retire,
    cmd_retrigger,
    cmd_serve,
    flow_options,
)
from tokcap.flows.cli.deploy import cmd_deploy
from tokcap.flows.cli.docs import cmd_docs
from tokcap.flows.cli.events import cmd_automations, cmd_submit
from tokcap.flows.cli.gateway import cmd_gateway
from tokcap.flows.cli.inputs import cmd_make_inputs
from tokcap.flows.cli.output import (
    EXIT_LOST_API,
    EXIT_STARTED,
    may_show_progress,
    one_line,
    print_notes,
    report_failure,
    report_lost_api,
)
from tokcap.flows.cli.runs import cmd_runs
from tokcap.flows.cli.status import cmd_status
from tokcap.flows.cli.stdout import end_quietly, reader_gone
from tokcap.flows.cli.sweep import cmd_sweep
from tokcap.flows.runners import (
    ApiUnreachableError,
    FlowFailed,
    ServerUnavailableError,
    prefect_environment,
    run_flow,
)

COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "finalize": cmd_finalize,
    "clear": cmd_clear,
    "sweep": lambda args: cmd_sweep(args, run_flow, flow_options(args)),
    "retire": cmd_retire,
    "retrigger": cmd_retrigger,
    "status": cmd_status,
    "demo": cmd_demo,
    "serve": cmd_serve,
    "deployments": cmd_deployments,
    "deploy": cmd_deploy,
    "submit": cmd_submit,
    "make-inputs": cmd_make_inputs,
    "runs": cmd_runs,
    "automations": cmd_automations,
    "gateway": cmd_gateway,
    "docs": cmd_docs,
}
FLOW_MODULES = {
    "finalize": ("tokcap.flows.finalize",),
    "retire": ("tokcap.flows.finalize",),
    "retrigger": ("tokcap.flows.retrigger",),
    "demo": ("tokcap.flows.demo", "tokcap.flows.finalize"),
    "clear": ("tokcap.flows.clear",),
}  # imported while a temporary server starts (`prepare`)
FINALIZING = {"finalize", "retrigger", "demo"}  # their console shows a progress line
NO_SERVER = {
    "status",
    "deployments",
    "deploy",
    "submit",
    "automations",
    "serve",
    "make-inputs",
    "runs",
    "gateway",
    "docs",
}


def stop_on_lost_api(args: argparse.Namespace, explanation: str) -> NoReturn:
    """The Prefect API went away mid-command: say so, show what the run handed off and the
    command that completes it, and exit now, with status 1 (`EXIT_LOST_API`, the code of
    the `interrupted` it prints): Prefect's client would retry for minutes. Exiting here is
    a crash of the run, which every step of a run survives (docs/pipeline.md, "Re-running
    is safe")."""
    report_lost_api(args, explanation)
    os._exit(EXIT_LOST_API)


def announce(args: argparse.Namespace, line: str) -> None:
    """One line on stderr, named by the command; stdout stays the command's (`--json`)."""
    print(f"tokcap {args.command}: {line}", file=sys.stderr, flush=True)


def prepare(command: str) -> None:
    """What a command needs before its flow, done while a temporary server starts: Prefect's
    console set to one line per record, and the command's flows imported."""
    from tokcap.flows.runners import one_line_console

    one_line_console()
    for module in FLOW_MODULES.get(command, ()):
        importlib.import_module(module)


def run_command(args: argparse.Namespace, notes: list[str]) -> int:
    """Run the command, on a temporary Prefect server unless it needs none or one is set;
    notes about that server go to `notes`, to print after the result."""
    if args.command in NO_SERVER:
        return COMMANDS[args.command](args)
    from tokcap.flows.cli.progress_line import progress_console
    from tokcap.flows.runners import prefect_api

    on_lost = partial(stop_on_lost_api, args)
    meanwhile = partial(prepare, args.command)
    with (
        prefect_api(notes, on_lost, partial(announce, args), meanwhile) as api_url,
        progress_console(args.command in FINALIZING),
    ):
        args.api_url = api_url
        return COMMANDS[args.command](args)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `tokcap` console script."""
    prefect_environment()
    notes: list[str] = []
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help()
            return 2
        code = run_and_report(args, notes)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        return end_quietly()
    finally:
        print_notes(notes)


def run_and_report(args: argparse.Namespace, notes: list[str]) -> int:
    """Run the command; print any failure in one place and return the exit code."""
    try:
        check_args(args)
        return run_command(args, notes)
    except UsageError as exc:
        print(f"tokcap {args.command}: {exc}", file=sys.stderr)
        return 2
    except FlowFailed as failed:
        partial = None
        if may_show_progress(args, failed.error):
            partial = run_summary(args.dest, args.run_id, args.options)
        report_failure(args, failed, partial)
        return 1
    except ApiUnreachableError as exc:  # nothing ran; the run, if any, waits as it was
        print(f"tokcap {args.command}: {exc}", file=sys.stderr)
        return EXIT_STARTED
    except (ServerUnavailableError, UnavailableError) as exc:
        print(f"tokcap {args.command}: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:
        if isinstance(exc, BrokenPipeError) and reader_gone():
            raise  # `tokcap status | head`: not a failure of the command
        print(
            f"tokcap {args.command} failed: {type(exc).__name__}: {one_line(exc)}", file=sys.stderr
        )
        return 1
