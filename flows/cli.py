"""The `tokcap` command line: each command runs its flow and prints a summary.

Every argument is checked, and every local path made absolute, before any Prefect server or
flow starts. Without `PREFECT_API_URL` the CLI starts a temporary Prefect server (see
`tokcap.flows.runners`). Exit status: 0 success, 1 the run failed (each failure on one line; the
tracebacks are in the flow-run logs), 2 bad usage or input (with the close match of a
mistyped option, command or choice; an unknown run id: never started), 3 the run started and
has not ended (`status` of a run still going or interrupted, or a command whose Prefect API
went away mid-run: the printed command completes it) or `submit` placed a file it could not
announce (the inbox's scheduled pass finalizes it), 141 stdout's reader stopped (`| head`).
Credentials given with `--storage-option` go to the environment, never to flow parameters.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, NoReturn

import orjson

from capture_core.builder import BUILDERS
from capture_core.builder.trace_envelope import DELIVERIES, MAIN_CHAIN
from capture_core.run.run_layout import ROW_FORMATS
from tokcap.flows.cli_checks import (
    UnavailableError,
    UsageError,
    absolute,
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
    run_summary,
    status_of_run,
)
from tokcap.flows.cli_events import (
    add_event_commands,
    check_event_args,
    cmd_automations,
    cmd_submit,
)
from tokcap.flows.cli_inputs import add_inputs_command, check_inputs_args, cmd_make_inputs
from tokcap.flows.cli_output import (
    EXIT_STARTED,
    STATE_EXIT,
    may_show_progress,
    one_line,
    print_notes,
    print_retired,
    print_retriggered,
    print_status,
    print_summary,
    report_failure,
    report_lost_api,
)
from tokcap.flows.cli_parser import Parser
from tokcap.flows.cli_runs import add_runs_command, check_runs_args, cmd_runs
from tokcap.flows.cli_stdout import end_quietly, reader_gone
from tokcap.flows.cli_sweep import add_sweep, cmd_sweep
from tokcap.flows.demo import DEFAULT_ROLLOUTS
from tokcap.flows.runners import (
    FlowFailed,
    ServerUnavailableError,
    parse_task_runner,
    prefect_environment,
    run_flow,
)

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


def _add_storage(parser: argparse.ArgumentParser, source: bool = True) -> None:
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
        "training_traces envelope, every sampled call owned once (docs/traces.md)",
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
        help="trainer rows written beside each part: parquet, or none (default)",
    )
    finalize.add_argument(
        "--retire-after-consumer",
        default=None,
        metavar="NAME",
        help="hand off but retire nothing now: `tokcap retire` and the inbox retire each batch "
        "once row consumer NAME acknowledged it (needs --rows parquet)",
    )
    finalize.add_argument(
        "--task-runner",
        default=None,
        metavar="dask[=ADDRESS]",
        help="run finalize batches on a Dask cluster (local when no address)",
    )
    _add_storage(finalize)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="tokcap", description="Token-capture finalization.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    _add_finalize(commands)

    clear = commands.add_parser("clear", help="dispatch-time clear of the given rollouts")
    clear.add_argument("--rollouts", required=True, help="rollout records file (JSON lines)")
    clear.add_argument("--store", required=True, help=STORE_HELP)
    _add_storage(clear)
    add_sweep(commands, _add_storage, STORE_HELP)
    add_event_commands(commands, _add_storage)
    add_inputs_command(commands, _add_storage)
    add_runs_command(commands, _add_storage, DEST_HELP)

    for name, text in (
        ("retire", "retire what a run handed off"),
        ("retrigger", "re-run what did not complete in a run"),
    ):
        sub = commands.add_parser(name, help=text)
        sub.add_argument("--dest", required=True, help=DEST_HELP)
        sub.add_argument("--run-id", required=True, help=f"the run to {name} (under --dest)")
        sub.add_argument("--store", required=True, help=STORE_HELP)
        _add_storage(sub)

    status = commands.add_parser("status", help="show a run's ledger summary")
    status.add_argument("--dest", required=True, help=DEST_HELP)
    status.add_argument("--run-id", required=True, help="the run to show (under --dest)")
    status.add_argument(
        "--json",
        action="store_true",
        help="print the run's manifest, summary and row consumers as JSON",
    )
    _add_storage(status, source=False)

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
    deployments.add_argument("--show", action="store_true", help="print its contents instead")
    return parser


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
    if getattr(args, "store", None) is not None:
        check_store(args, must_exist=args.command != "serve")
    if getattr(args, "dest", None) is not None:
        check_dest(args, must_exist=args.command in ("retire", "retrigger", "status"))
    if args.command == "serve":
        args.inbox = absolute(args.inbox)
    check_separate(args)
    if args.command == "finalize":
        check_consumer(args)
        try:
            parse_task_runner(args.task_runner)
        except ValueError as exc:
            raise UsageError(f"--task-runner: {exc}") from None
    check_locations_usable(args)
    if args.command in ("retire", "retrigger", "status"):
        known_run(args.dest, args.run_id, args.options)
    if args.command == "serve" and args.cron is not None:
        check_cron(args.cron)
    if args.command == "demo":
        check_workdir(args)
    check_event_args(args)
    check_inputs_args(args)
    check_runs_args(args)


def _flow_options(args: argparse.Namespace) -> dict[str, Any]:
    return {"storage_options": args.options or None, "source_kwargs": args.source_kwargs or None}


def cmd_finalize(args: argparse.Namespace) -> int:
    from tokcap.flows.finalize import finalize_run
    from tokcap.flows.runners import task_runner_from_spec

    runner = task_runner_from_spec(args.task_runner)
    flow = finalize_run.with_options(task_runner=runner) if runner else finalize_run
    summary = run_flow(
        flow,
        rollouts=args.rollouts,
        store=args.store,
        dest=args.dest,
        run_id=args.run_id,
        builder=args.builder,
        delivery=args.delivery,
        batch_size=args.batch_size,
        max_mask_fraction=args.max_mask_fraction,
        mask_fraction_min_samples=args.mask_fraction_min_samples,
        rows=args.rows,
        retire_after_consumer=args.retire_after_consumer,
        **_flow_options(args),
    )
    print_summary(summary)
    return 0


def cmd_clear(args: argparse.Namespace) -> int:
    from tokcap.flows.clear import dispatch_clear

    summary = run_flow(
        dispatch_clear, rollouts=args.rollouts, store=args.store, **_flow_options(args)
    )
    print(f"cleared {summary.cleared} rollouts' captures ({summary.without_id} records without id)")
    return 0


def _run_on_run_id(flow: Any, args: argparse.Namespace) -> Any:
    """Run a flow over an existing run: `--dest`, `--run-id` and `--store`."""
    return run_flow(
        flow, dest=args.dest, run_id=args.run_id, store=args.store, **_flow_options(args)
    )


def cmd_retire(args: argparse.Namespace) -> int:
    from tokcap.flows.finalize import retire_uploaded

    print_retired(args.run_id, _run_on_run_id(retire_uploaded, args))
    return 0


def cmd_retrigger(args: argparse.Namespace) -> int:
    from tokcap.flows.retrigger import retrigger_failed

    report = _run_on_run_id(retrigger_failed, args)
    print_retriggered(report)
    return 0 if not report.still_failing else 1


def cmd_status(args: argparse.Namespace) -> int:
    status = status_of_run(args.dest, args.run_id, args.options)
    if args.json:
        body = status.model_dump(include={"state", "manifest", "summary", "progress", "unreadable"})
        body["consumers"] = [c.model_dump() for c in status.consumers]
        print(orjson.dumps(body, option=orjson.OPT_INDENT_2).decode())
    else:
        print_status(status, args.dest, bool(args.options))
    return STATE_EXIT[status.state]


def cmd_serve(args: argparse.Namespace) -> int:
    from tokcap.flows.serve import NoSchedulerError, serve_deployments

    try:
        serve_deployments(args.inbox, args.store, args.dest, args.cron)
    except NoSchedulerError as exc:
        print(f"tokcap serve: {exc}", file=sys.stderr)
        return 1
    return 0


def cmd_deployments(args: argparse.Namespace) -> int:
    from tokcap.flows.serve import prefect_file

    path = prefect_file()
    print(path.read_text() if args.show else path, end="" if args.show else "\n")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from tokcap.flows.demo import run_demo

    return run_demo(args.workdir, args.api_url, args.demo_rollouts)


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "finalize": cmd_finalize,
    "clear": cmd_clear,
    "sweep": lambda args: cmd_sweep(args, run_flow, _flow_options(args)),
    "retire": cmd_retire,
    "retrigger": cmd_retrigger,
    "status": cmd_status,
    "demo": cmd_demo,
    "serve": cmd_serve,
    "deployments": cmd_deployments,
    "submit": cmd_submit,
    "make-inputs": cmd_make_inputs,
    "runs": cmd_runs,
    "automations": cmd_automations,
}
FINALIZING = {"finalize", "retrigger", "demo"}  # their console shows a progress line
NO_SERVER = {"status", "deployments", "submit", "automations", "serve", "make-inputs", "runs"}


def stop_on_lost_api(args: argparse.Namespace, explanation: str) -> NoReturn:
    """The Prefect API went away mid-command: say so, show what the run handed off and the
    command that completes it, and exit now, with status 3 (`EXIT_STARTED`): Prefect's
    client would retry for minutes. Exiting here is a crash of the run, which every step
    of a run survives (docs/pipeline.md, "Re-running is safe")."""
    report_lost_api(args, explanation)
    os._exit(EXIT_STARTED)


def run_command(args: argparse.Namespace, notes: list[str]) -> int:
    """Run the command, on a temporary Prefect server unless it needs none or one is set;
    notes about that server go to `notes`, to print after the result."""
    if args.command in NO_SERVER:
        return COMMANDS[args.command](args)
    from tokcap.flows.cli_progress import progress_console
    from tokcap.flows.runners import one_line_console, prefect_api

    one_line_console()
    on_lost = partial(stop_on_lost_api, args)
    with (
        prefect_api(notes, on_lost=on_lost) as api_url,
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


if __name__ == "__main__":
    sys.exit(main())
