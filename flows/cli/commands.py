"""What each `tokcap` command does once its arguments are checked: run its flow, print.

A command returns its exit status; failures raise, and `tokcap.flows.cli.main` prints them.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from tokcap.flows.cli.output import (
    print_retired,
    print_retriggered,
    print_summary,
)
from tokcap.flows.runners import run_flow

FINALIZE_SETTINGS = (
    "rollouts",
    "store",
    "dest",
    "run_id",
    "builder",
    "delivery",
    "batch_size",
    "max_mask_fraction",
    "mask_fraction_min_samples",
    "rows",
    "retire_after_consumer",
    "group_by",
    "max_group_size",
)  # `finalize_run`'s parameters, each from the option of the same name


def flow_options(args: argparse.Namespace) -> dict[str, Any]:
    """The storage options and store arguments every flow takes."""
    return {"storage_options": args.options or None, "source_kwargs": args.source_kwargs or None}


def cmd_finalize(args: argparse.Namespace) -> int:
    from tokcap.flows.finalize import finalize_run
    from tokcap.flows.runners import task_runner_from_spec

    runner = task_runner_from_spec(args.task_runner)
    flow = finalize_run.with_options(task_runner=runner) if runner else finalize_run
    settings = {name: getattr(args, name) for name in FINALIZE_SETTINGS}
    summary = run_flow(flow, **settings, **flow_options(args))
    print_summary(summary)
    return 0


def cmd_clear(args: argparse.Namespace) -> int:
    from tokcap.flows.clear import dispatch_clear

    summary = run_flow(
        dispatch_clear, rollouts=args.rollouts, store=args.store, **flow_options(args)
    )
    print(f"cleared {summary.cleared} rollouts' captures ({summary.without_id} records without id)")
    return 0


def _run_on_run_id(flow: Any, args: argparse.Namespace) -> Any:
    """Run a flow over an existing run: `--dest`, `--run-id` and `--store`."""
    return run_flow(
        flow, dest=args.dest, run_id=args.run_id, store=args.store, **flow_options(args)
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


def cmd_serve(args: argparse.Namespace) -> int:
    from tokcap.flows.serve import NoSchedulerError, serve_deployments

    try:
        serve_deployments(args.inbox, args.store, args.dest, args.cron)
    except NoSchedulerError as exc:
        print(f"tokcap serve: {exc}", file=sys.stderr)
        return 1
    return 0


def cmd_deployments(args: argparse.Namespace) -> int:
    from tokcap.flows.deploy_settings import shown_file
    from tokcap.flows.serve import outdated_deployments, prefect_file

    if args.check:
        check_configured_api()
        outdated = outdated_deployments()
        print("\n".join(outdated) or "no deployment uses an entrypoint this tokcap lacks")
        return 1 if outdated else 0
    path = prefect_file()
    if args.show:  # with the inbox settings this environment deploys
        print(shown_file(path.read_text(), os.environ), end="")
    else:
        print(path)
    return 0


def check_configured_api() -> None:
    """An unreachable `PREFECT_API_URL` is one line naming it and what to check (exit 3),
    as for the commands that run a flow, not Prefect's bare connection error."""
    from tokcap.flows.cli.flow_facts import api_url
    from tokcap.flows.runners import check_reachable

    url = api_url()
    if url is not None:
        check_reachable(url)


def cmd_demo(args: argparse.Namespace) -> int:
    from tokcap.flows.demo import run_demo

    return run_demo(args.workdir, args.api_url, args.demo_rollouts)
