"""`tokcap make-inputs`: write seeded captures and rollout files, then say what to run next.

It needs no Prefect server. Its locations are checked here (the store and the folder may
be new); the rest of the CLI (`tokcap.flows.cli`) imports this module.
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Callable
from typing import Any

from capture_core.builder.trace_envelope import DELIVERIES, MAIN_CHAIN
from capture_core.operator.run_report import plural
from capture_core.run.capture_source import check_separate_locations, is_class_spec
from capture_core.storage import open_byte_store
from tokcap.flows.cli.checks import (
    UsageError,
    absolute,
    check_location,
    is_local,
    non_negative_int,
    positive_int,
)
from tokcap.flows.runners import script


def add_inputs_command(commands: Any, add_storage: Callable[..., None]) -> None:
    """The `make-inputs` subcommand."""
    inputs = commands.add_parser(
        "make-inputs",
        help="write seeded captures into a store and rollout files into a folder, ready to "
        "finalize or submit",
    )
    inputs.add_argument(
        "--store",
        dest="inputs_store",
        required=True,
        metavar="STORE",
        help="capture store to write the captures into: a path or an s3:// URL (may be new)",
    )
    inputs.add_argument(
        "--out", required=True, help="folder for the rollout files: a path or an s3:// URL"
    )
    inputs.add_argument(
        "--rollouts",
        dest="inputs_rollouts",
        type=positive_int,
        required=True,
        metavar="N",
        help="rollouts to make",
    )
    inputs.add_argument(
        "--files", type=positive_int, default=1, metavar="K", help="files to split them into"
    )
    inputs.add_argument(
        "--seed",
        type=non_negative_int,
        default=0,
        metavar="S",
        help="the same seed, the same tokens",
    )
    inputs.add_argument(
        "--delivery",
        choices=DELIVERIES,
        default=MAIN_CHAIN,
        help="main_chain: the demo's shapes (default); all_traces: the episodes multi-trace "
        "delivery is for (tokcap docs traces)",
    )
    inputs.add_argument(
        "--id-prefix",
        default=None,
        metavar="PREFIX",
        help="start of every rollout id and file name (default: a new one per invocation)",
    )
    add_storage(inputs, source=False)


def check_inputs_args(args: argparse.Namespace) -> None:
    """Make the locations absolute, keep them apart, and check they can be used."""
    if args.command != "make-inputs":
        return
    if is_class_spec(args.inputs_store):
        raise UsageError("--store: make-inputs writes a store location, not a source class")
    args.inputs_store, args.out = absolute(args.inputs_store), absolute(args.out)
    if args.files > args.inputs_rollouts:
        raise UsageError(f"--files {args.files} is more than --rollouts {args.inputs_rollouts}")
    try:
        check_separate_locations({"--store": args.inputs_store, "--out": args.out})
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.id_prefix is not None:
        from tokcap.flows.inputs import check_prefix

        check_location("--id-prefix", lambda: check_prefix(args.id_prefix))
    for flag, location in (("--store", args.inputs_store), ("--out", args.out)):
        check_location(flag, lambda at=location: _probe(at, args.options))


def _probe(location: str, options: dict[str, Any]) -> None:
    store = open_byte_store(location, options)
    try:
        store.probe(must_exist=False)
    finally:
        store.close()


def cmd_make_inputs(args: argparse.Namespace) -> int:
    """Write the inputs, print what was written and the commands that use it."""
    from tokcap.flows.inputs import InputsRefusedError, make_inputs

    try:
        made = make_inputs(
            args.inputs_store,
            args.out,
            args.inputs_rollouts,
            files=args.files,
            seed=args.seed,
            delivery=args.delivery,
            prefix=args.id_prefix,
            storage_options=args.options or None,
        )
    except InputsRefusedError as exc:
        raise UsageError(str(exc)) from None
    print(
        f"wrote {len(made.rollout_ids)} rollouts ({made.delivery} shapes, seed {made.seed}) "
        f"into {plural(len(made.files), 'file')} and their captures into {made.store}"
    )
    for written in made.files:
        print(f"  {written.url}  ({written.rollouts} rollouts)")
    print(f"rollout ids: {made.prefix}-<task>-<rollout>, new with this invocation")
    print("\n".join(next_commands(made, bool(args.options))))
    return 0


def next_commands(made: Any, with_options: bool) -> list[str]:
    """The commands that finalize the first file, and that submit every file to an inbox."""
    tokcap = script("tokcap")
    first = made.files[0]
    run_id = first.url.rsplit("/", 1)[-1].removesuffix(".jsonl")
    delivery = f" --delivery {made.delivery}" if made.delivery != MAIN_CHAIN else ""
    options = " (with the same --storage-option values)" if with_options else ""
    if is_local(made.out):
        files = shlex.quote(f"{made.out.rstrip('/')}/{made.prefix}-") + "*.jsonl"
    else:
        files = " ".join(shlex.quote(f.url) for f in made.files)
    return [
        f"next, finalize {'a file' if len(made.files) > 1 else 'it'} into a destination "
        f"DEST{options}:",
        f"  {tokcap} finalize --rollouts {shlex.quote(first.url)} --store "
        f"{shlex.quote(made.store)} --dest DEST --run-id {run_id}{delivery}",
        "or submit the files to a served inbox (tokcap serve; tokcap docs pipeline#the-inbox):",
        f"  {tokcap} submit --inbox INBOX {files}",
    ]
