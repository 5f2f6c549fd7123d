"""`tokcap sweep`: its arguments and its command; the rest of the CLI is `tokcap.flows.cli`."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from capture_core.store.retirement import DEFAULT_SWEEP_AGE, sweep_age_seconds


def sweep_age(text: str) -> str:
    """An argparse type: a sweep age (`36h`, `2d`, `90m`, `3600s`), checked, kept as written."""
    try:
        sweep_age_seconds(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def add_sweep(
    commands: Any, add_storage: Callable[[argparse.ArgumentParser], None], store_help: str
) -> None:
    """The `sweep` subcommand, with the store options every command takes."""
    sweep = commands.add_parser("sweep", help="remove tombstones of captures retired long ago")
    sweep.add_argument("--store", required=True, help=store_help)
    sweep.add_argument(
        "--older-than",
        type=sweep_age,
        default=DEFAULT_SWEEP_AGE,
        metavar="DURATION",
        help=f"age of the tombstones to remove: 36h, 2d, 90m, 3600s; at least 1h "
        f"(default {DEFAULT_SWEEP_AGE})",
    )
    add_storage(sweep)


def cmd_sweep(
    args: argparse.Namespace, run_flow: Callable[..., Any], flow_options: dict[str, Any]
) -> int:
    """Run the sweep flow through the CLI's `run_flow` and print how many tombstones went.

    `run_flow` and `flow_options` come from `tokcap.flows.cli.main`, which imports this module.
    """
    from tokcap.flows.sweep import sweep_retired_captures  # imports Prefect: not at CLI start

    summary = run_flow(
        sweep_retired_captures, store=args.store, older_than=args.older_than, **flow_options
    )
    print(
        f"swept {summary.swept} retired rollouts' tombstones older than {summary.older_than} "
        f"from {summary.store}"
    )
    return 0
