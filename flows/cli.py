"""The `tokcap` command line: each command runs its flow and prints a summary.

Without `PREFECT_API_URL`, Prefect runs the flow against a temporary local server.
Exit status: 0 success, 1 the run failed (the reason is printed), 2 bad usage or input.
Credentials given with `--storage-option` go to the environment, never to flow parameters.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import orjson

CREDENTIAL_ENV = {
    "key": "AWS_ACCESS_KEY_ID",
    "secret": "AWS_SECRET_ACCESS_KEY",
    "token": "AWS_SESSION_TOKEN",
}


class UsageError(ValueError):
    """Bad command-line input."""


def parse_options(pairs: Sequence[str]) -> dict[str, Any]:
    """`key=value` pairs to fsspec options; values are JSON when they parse, else strings."""
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--storage-option {pair!r} must look like key=value")
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


def _add_storage(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--storage-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="fsspec option for s3:// locations (endpoint_url=..., key=..., "
        "secret=...); repeatable",
    )
    parser.add_argument(
        "--source-kwarg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="keyword argument for a module.path:ClassName store; repeatable",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tokcap", description="Token-capture finalization.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    finalize = commands.add_parser("finalize", help="finalize, hand off and retire a run")
    finalize.add_argument("--rollouts", required=True, help="JSON-lines rollout records URL")
    finalize.add_argument("--store", required=True, help="capture store path/URL or module:Class")
    finalize.add_argument("--dest", required=True, help="destination path or URL")
    finalize.add_argument("--run-id", required=True)
    finalize.add_argument("--batch-size", type=int, default=500)
    finalize.add_argument("--builder", default="prefix_merging")
    finalize.add_argument("--max-mask-fraction", type=float, default=None)
    finalize.add_argument("--mask-fraction-min-samples", type=int, default=50)
    finalize.add_argument(
        "--task-runner",
        default=None,
        metavar="dask[=ADDRESS]",
        help="run finalize batches on a Dask cluster (local when no address)",
    )
    _add_storage(finalize)

    clear = commands.add_parser("clear", help="dispatch-time clear of the given rollouts")
    clear.add_argument("--rollouts", required=True)
    clear.add_argument("--store", required=True)
    _add_storage(clear)

    for name, text in (
        ("retire", "retire what a run handed off"),
        ("retrigger", "re-run what did not complete in a run"),
    ):
        sub = commands.add_parser(name, help=text)
        sub.add_argument("--dest", required=True)
        sub.add_argument("--run-id", required=True)
        sub.add_argument("--store", required=True)
        _add_storage(sub)

    status = commands.add_parser("status", help="show a run's ledger summary")
    status.add_argument("--dest", required=True)
    status.add_argument("--run-id", required=True)
    status.add_argument("--json", action="store_true")
    _add_storage(status)

    demo = commands.add_parser("demo", help="end-to-end demo on a local store")
    demo.add_argument("--workdir", default="tokcap-demo")

    serve = commands.add_parser("serve", help="serve the deployments with their schedules")
    serve.add_argument("--inbox", required=True, help="folder URL of rollout files to finalize")
    serve.add_argument("--store", required=True)
    serve.add_argument("--dest", required=True)
    serve.add_argument("--cron", default="*/10 * * * *")

    deployments = commands.add_parser(
        "deployments", help="print the path of the shipped prefect.yaml, for prefect deploy"
    )
    deployments.add_argument("--show", action="store_true", help="print its contents instead")
    return parser


def _storage(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    options = split_credentials(parse_options(args.storage_option))
    return options, parse_options(getattr(args, "source_kwarg", []))


def cmd_finalize(args: argparse.Namespace) -> int:
    from flows.finalize import finalize_run
    from flows.runners import task_runner_from_spec

    options, source_kwargs = _storage(args)
    runner = task_runner_from_spec(args.task_runner)
    flow = finalize_run.with_options(task_runner=runner) if runner else finalize_run
    summary = flow(
        rollouts=args.rollouts,
        store=args.store,
        dest=args.dest,
        run_id=args.run_id,
        builder=args.builder,
        batch_size=args.batch_size,
        max_mask_fraction=args.max_mask_fraction,
        mask_fraction_min_samples=args.mask_fraction_min_samples,
        storage_options=options or None,
        source_kwargs=source_kwargs or None,
    )
    print_summary(summary)
    return 0


def cmd_clear(args: argparse.Namespace) -> int:
    from flows.clear import dispatch_clear

    options, source_kwargs = _storage(args)
    summary = dispatch_clear(args.rollouts, args.store, options or None, source_kwargs or None)
    print(f"cleared {summary.cleared} rollouts' captures ({summary.without_id} records without id)")
    return 0


def cmd_retire(args: argparse.Namespace) -> int:
    from flows.finalize import retire_uploaded

    options, source_kwargs = _storage(args)
    counts = retire_uploaded(
        args.dest, args.run_id, args.store, options or None, source_kwargs or None
    )
    print(
        f"run {args.run_id}: {counts['retired']} captures retired from {counts['receipts']} "
        f"receipts ({counts['kept']} kept as evidence)"
    )
    return 0


def cmd_retrigger(args: argparse.Namespace) -> int:
    from flows.finalize import retrigger_failed

    options, source_kwargs = _storage(args)
    report = retrigger_failed(
        args.dest, args.run_id, args.store, options or None, source_kwargs or None
    )
    print(
        f"run {args.run_id}: {len(report.newly_handed_off)} newly handed off, "
        f"{len(report.newly_retired)} newly retired, {len(report.still_failing)} still failing"
    )
    return 0 if not report.still_failing else 1


def cmd_status(args: argparse.Namespace) -> int:
    from capture_core.run_manifest import read_ledger, read_manifest
    from capture_core.run_report import summarize
    from capture_core.store import open_byte_store

    options, _ = _storage(args)
    dest = open_byte_store(args.dest, options)
    manifest = read_manifest(dest, args.run_id)
    ledger = read_ledger(dest, args.run_id)
    if manifest is None or ledger is None:
        raise UsageError(f"unknown run id {args.run_id} at {args.dest}: no manifest or ledger")
    summary = summarize(args.run_id, ledger)
    if args.json:
        print(
            orjson.dumps(
                {"manifest": manifest.model_dump(), "summary": summary.model_dump()},
                option=orjson.OPT_INDENT_2,
            ).decode()
        )
    else:
        print(f"run {args.run_id} ({manifest.rollouts}, {manifest.batches} batches)")
        print_summary(summary)
    return 0 if summary.ok else 1


def cmd_serve(args: argparse.Namespace) -> int:
    from flows.serve import serve_deployments

    serve_deployments(args.inbox, args.store, args.dest, args.cron)
    return 0


def cmd_deployments(args: argparse.Namespace) -> int:
    from flows.serve import prefect_file

    path = prefect_file()
    print(path.read_text() if args.show else path, end="" if args.show else "\n")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from flows.demo import run_demo

    return run_demo(args.workdir)


def print_summary(summary: Any) -> None:
    rows = [
        ("rollouts", summary.rollouts),
        ("handed off", summary.handed_off),
        ("already handed off (earlier run)", summary.already_handed_off),
        ("masked", summary.masked),
        *((f"  masked: {reason}", count) for reason, count in summary.mask_reasons.items()),
        ("retired", summary.retired),
        ("failed", summary.failed),
        ("malformed input lines", summary.malformed_lines),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    if summary.records_prefix:
        print(f"records: {summary.records_prefix}\nledger:  {summary.ledger}")


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "finalize": cmd_finalize,
    "clear": cmd_clear,
    "retire": cmd_retire,
    "retrigger": cmd_retrigger,
    "status": cmd_status,
    "demo": cmd_demo,
    "serve": cmd_serve,
    "deployments": cmd_deployments,
}


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `tokcap` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return COMMANDS[args.command](args)
    except UsageError as exc:
        print(f"tokcap {args.command}: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        print(f"tokcap {args.command} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
