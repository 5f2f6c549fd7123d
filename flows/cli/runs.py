"""`tokcap runs`: a destination's runs, newest first, one line each (`run_index`).

It reads the destination (each run's manifest and summary) and, for the runs shown that are
not complete, where `PREFECT_API_URL` is set, their flow runs (`flow_facts`): each run's
state is the word `tokcap status` gives it (`run_verdict`). The rest of the CLI
(`tokcap.flows.cli`) imports this module.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

import orjson

from tokcap.flows.cli.checks import check_dest, non_negative_int

DEFAULT_LIMIT = 50


def add_runs_command(commands: Any, add_storage: Callable[..., None], dest_help: str) -> None:
    """The `runs` subcommand."""
    runs = commands.add_parser(
        "runs", help="list a destination's runs, newest first: state, counts, mask rate, rate"
    )
    runs.add_argument("--dest", required=True, help=dest_help)
    runs.add_argument("--json", action="store_true", help="print the rows as JSON")
    runs.add_argument(
        "--limit",
        type=non_negative_int,
        default=DEFAULT_LIMIT,
        metavar="N",
        help=f"newest runs shown (default {DEFAULT_LIMIT}; 0 shows all)",
    )
    add_storage(runs, source=False)


def check_runs_args(args: argparse.Namespace) -> None:
    """A local destination must exist (the other checks are `check_args`'s)."""
    if args.command == "runs":
        check_dest(args, must_exist=True)


def cmd_runs(args: argparse.Namespace) -> int:
    """Print the runs (a table, or JSON) and, when some are left out, how many."""
    from capture_core.operator.run_index import list_runs
    from capture_core.storage import open_byte_store

    dest = open_byte_store(args.dest, args.options or None)
    try:
        listing = list_runs(dest, limit=args.limit)
        listing.runs = judged(listing.runs, dest)
    finally:
        dest.close()
    if args.json:
        body = {"dest": args.dest, "total": listing.total, "runs": listing.runs}
        print(_json(body))
    elif listing.runs:
        print("\n".join(text_table([row.cells() for row in listing.runs])))
    else:
        print(f"no runs at {args.dest}", file=sys.stderr)
    left = listing.total - len(listing.runs)
    if left and not args.json:
        print(f"... and {left} older runs (--limit 0 shows all)", file=sys.stderr)
    return 0


def judged(rows: list[Any], dest: Any) -> list[Any]:
    """The rows with the state `judge` gives each run that is not complete: its flow runs
    (read once for all) and its inbox claims, and its row read again when the verdict
    calls a person (the run may have completed while the API was read)."""
    from capture_core.operator.run_index import COMPLETE
    from tokcap.flows.cli.flow_facts import flow_facts

    open_runs = [row.run_id for row in rows if row.state != COMPLETE]
    found = flow_facts(open_runs) if open_runs else None
    return [row if row.state == COMPLETE else _judged_row(row, dest, found) for row in rows]


def _judged_row(row: Any, dest: Any, found: dict[str, Any] | None) -> Any:
    from capture_core.operator.run_index import dest_state, read_row, with_verdict
    from capture_core.operator.run_verdict import judge
    from capture_core.run.run_layout import RunLayout
    from tokcap.flows.cli.status import claim_facts

    latest = [row]

    def read_again() -> Any:
        latest.append(read_row(dest, row.run_id) or row)
        return dest_state(latest[-1])

    reads = iter([lambda: dest_state(row), read_again])
    verdict = judge(
        lambda: next(reads)(),
        lambda: None if found is None else found.get(row.run_id),
        claim_facts(RunLayout(dest, row.run_id)),
    )
    return row if verdict is None else with_verdict(latest[-1], verdict)


def _json(body: dict[str, Any]) -> str:
    runs = [row.model_dump() for row in body["runs"]]
    return orjson.dumps({**body, "runs": runs}, option=orjson.OPT_INDENT_2).decode()


def text_table(rows: list[dict[str, str]]) -> list[str]:
    """A header and one line per row; columns padded, numbers right-aligned, the last
    column (the details) left as it is."""
    columns = list(rows[0])
    widths = {c: max(len(c), *(len(row[c]) for row in rows)) for c in columns}
    right = {"rollouts", "retired", "waiting", "rollouts/s"}

    def line(cells: dict[str, str]) -> str:
        parts = [
            cells[c].rjust(widths[c]) if c in right else cells[c].ljust(widths[c])
            for c in columns[:-1]
        ]
        return "  ".join([*parts, cells[columns[-1]]]).rstrip()

    return [line(dict(zip(columns, columns, strict=True))), *map(line, rows)]
