"""`tokcap status`: one run's state, from its destination, its inbox and the Prefect API.

The destination says what the run handed off; `--inbox` (or a submit event the API holds)
says a file waits for its run; the API's flow runs say whether anything still acts on it.
The inbox claims on its file (kept in the destination) say whether a pass holds it or all its
attempts ended. `capture_core.operator.run_verdict.judge` turns these into the state word
and exit code, reading the destination again before it calls a person.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import orjson

from capture_core.operator.run_status import RunStatus, run_status
from capture_core.operator.run_verdict import (
    ClaimFacts,
    DestState,
    FlowFacts,
    Verdict,
    judge,
)
from capture_core.run.inbox import claim_numbers, held_claim, read_claim, run_id_for_file
from capture_core.run.run_layout import RunLayout
from capture_core.storage import filesystem_for, open_byte_store, url_scheme
from tokcap.flows.cli.checks import UsageError, is_local, missing_dest, unknown_run
from tokcap.flows.cli.flow_facts import flow_facts
from tokcap.flows.runners import ApiUnreachableError

DEST_STATES: dict[str, DestState] = {"ok": "ok", "failed": "failed", "started": "started"}


def inbox_file(inbox: str, run_id: str, options: dict[str, Any] | None) -> str | None:
    """The URL of the inbox file whose run is `run_id`, or `None`."""
    fs, root = filesystem_for(inbox, options)
    scheme = url_scheme(inbox)
    protocol = f"{scheme}://" if scheme is not None else ""
    for path in sorted(fs.glob(f"{root.rstrip('/')}/*.jsonl")):
        url = protocol + path if protocol and not path.startswith(protocol) else path
        if run_id_for_file(url) == run_id:
            return url
    return None


def dest_state(status: RunStatus | None, placed: str | None) -> DestState:
    if status is not None:
        return DEST_STATES[status.state]
    return "placed" if placed else "absent"


def claim_facts(layout: RunLayout) -> ClaimFacts:
    """The inbox claims on the run's file: how many, and the live one's holder."""
    numbers = claim_numbers(layout.dest, layout.run_id)
    if not numbers:
        return ClaimFacts()
    latest = read_claim(layout.dest, layout.run_id, numbers[-1])
    limit = latest.max_attempts if latest is not None else None
    held = held_claim(layout.dest, layout.run_id)
    if held is None:
        return ClaimFacts(attempts=len(numbers), max_attempts=limit)
    holder = f"attempt {held.number + 1} ({held.owner})"
    return ClaimFacts(
        attempts=len(numbers), holder=holder, renewed_at=held.renewed_at, max_attempts=limit
    )


def read_status(args: argparse.Namespace) -> tuple[RunStatus | None, str | None, Verdict]:
    """The run's destination status (`None` before its manifest), its inbox file (with
    `--inbox`) and its verdict; `UsageError` when neither knows the run."""
    options = args.options or None
    layout = RunLayout(open_byte_store(args.dest, options), args.run_id)
    read: dict[str, RunStatus | None] = {}
    placed = None
    if getattr(args, "inbox", None) and layout.read_manifest() is None:
        placed = inbox_file(args.inbox, args.run_id, options)

    def read_dest() -> DestState:
        read["status"] = run_status(layout, args.dest)
        return dest_state(read["status"], placed)

    asked: list[FlowFacts | None] = []

    def read_facts() -> FlowFacts | None:
        found = flow_facts([args.run_id])
        asked.append(None if found is None else found[args.run_id])
        return asked[-1]

    verdict = judge(read_dest, read_facts, claim_facts(layout))
    if verdict is None:
        refuse_unknown(args, layout, asked[-1] if asked else None)
    return read["status"], placed, verdict


def refuse_unknown(args: argparse.Namespace, layout: RunLayout, facts: FlowFacts | None) -> None:
    """Raise for a run nothing knows: a local destination that does not exist, or a run id
    without a manifest (or inbox file), named with its close match (`UsageError`, exit 2).
    When the Prefect API could not be asked, the run may exist only as a flow run (queued
    by a deployment), so the argument is not known to be bad: `ApiUnreachableError`, exit 3,
    as for every command an unreachable `PREFECT_API_URL` stops."""
    if is_local(args.dest) and not os.path.isdir(args.dest):
        unknown = missing_dest(args.dest)
    else:
        unknown = unknown_run(args.dest, args.run_id, layout.dest)
    if facts is not None and not facts.reachable:
        raise ApiUnreachableError(
            f"{unknown}; {facts.why_not}, so whether a flow run carries run {args.run_id} "
            "(a queued or submitted run has nothing else yet) is unknown: check that the Prefect "
            "server PREFECT_API_URL names is running, then ask again"
        )
    hint = "" if getattr(args, "inbox", None) else "; for a submitted file add --inbox"
    raise UsageError(unknown + hint)


def cmd_status(args: argparse.Namespace) -> int:
    from tokcap.flows.cli.output import print_status, print_verdict

    status, placed, verdict = read_status(args)
    if args.json:
        print(status_json(status, placed, verdict))
    elif status is None:
        print_verdict(args.run_id, verdict)
        if placed:
            print(f"file: {placed}")
    else:
        print_status(status, args.dest, bool(args.options), verdict=verdict)
    return verdict.exit_code


def status_json(status: RunStatus | None, placed: str | None, verdict: Verdict) -> str:
    """`status --json`: `state`, `reason` and `flow_run` always; the destination's manifest,
    summary, progress, consumers and unreadable receipts once the run recorded them."""
    body: dict[str, Any] = {"state": verdict.state, "reason": verdict.reason}
    body["flow_run"] = None if verdict.flow_run is None else verdict.flow_run.model_dump()
    body["inbox_file"] = placed
    if status is not None:
        body |= status.model_dump(include={"manifest", "summary", "progress", "unreadable"})
        body["consumers"] = [c.model_dump() for c in status.consumers]
    else:
        body |= {"manifest": None, "summary": None, "progress": None, "unreadable": []}
        body["consumers"] = []
    return orjson.dumps(body, option=orjson.OPT_INDENT_2).decode()
