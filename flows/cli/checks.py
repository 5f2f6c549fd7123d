"""Checks of `tokcap` arguments, done before any Prefect server or flow starts.

Local paths are resolved against the working directory, so flows, manifests and later
commands run from other directories all see absolute paths. Each problem is a `UsageError`
naming the option and what to do (exit status 2). The locations are then checked with the
flows' own checks (`check_source`, `check_destination`, the manifest's recorded settings),
so a bad scheme, a source class that does not import, a missing bucket or a reused run id
with other settings fails here, in one line, and no flow run is left Failed. A location
that cannot be reached now is an `UnavailableError` (exit status 1: the arguments may be
right, and retrying later may work).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

from capture_core.config import public_storage_options
from capture_core.errors import OverlappingLocationsError, is_transient
from capture_core.operator.run_index import closest_run_id
from capture_core.operator.run_report import RunSummary
from capture_core.operator.run_status import RunStatus, ledger_summary, run_status
from capture_core.rows.row_cursor import validate_consumer_name
from capture_core.run.capture_source import (
    check_destination,
    check_separate_locations,
    check_source,
    is_class_spec,
)
from capture_core.run.rollout_io import file_fingerprint, file_sha256, open_rollout_file
from capture_core.run.run_layout import (
    RUN_SETTINGS,
    RunLayout,
    RunManifest,
    validate_run_id,
)
from capture_core.run.store_check import check_store_for_run
from capture_core.storage import ByteStore, location_problem, open_byte_store, url_scheme


class UsageError(ValueError):
    """Bad command-line input."""


class UnavailableError(RuntimeError):
    """A location an argument names cannot be reached now; retrying later may work."""


def is_local(location: str) -> bool:
    return url_scheme(location) is None


def absolute(location: str) -> str:
    """A local path made absolute against the working directory; URLs unchanged."""
    return os.path.abspath(os.path.expanduser(location)) if is_local(location) else location


def positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    return _int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    """An argparse type: an integer of at least 0."""
    return _int_at_least(text, 0)


def _int_at_least(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"{value} is not at least {least}")
    return value


def fraction(text: str) -> float:
    """An argparse type: a number from 0 to 1."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{value} is not between 0 and 1")
    return value


LOCATION_FLAGS = ("rollouts", "store", "dest", "inbox", "out")


def check_spelling(args: argparse.Namespace) -> None:
    """A location typed as a URL missing a slash (`s3:/bucket`) or with an unknown protocol
    (`s4://bucket`) is refused alike (`location_problem`), before it is made absolute and
    would pass for a local path, or reach a filesystem's own checks."""
    named = [(f"--{name}", getattr(args, name, None)) for name in LOCATION_FLAGS]
    files = getattr(args, "files", None)  # submit's FILE list (make-inputs' --files counts)
    named += [("FILE", path) for path in (files if isinstance(files, list) else [])]
    for flag, value in named:
        problem = location_problem(value) if isinstance(value, str) else None
        if problem is not None:
            raise UsageError(f"{flag} {problem}")


def check_rollouts(args: argparse.Namespace) -> None:
    args.rollouts = absolute(args.rollouts)
    if is_local(args.rollouts) and not os.path.isfile(args.rollouts):
        raise UsageError(f"--rollouts {args.rollouts} is not a file; give the rollout JSONL file")


def check_store(args: argparse.Namespace, must_exist: bool = True) -> None:
    if is_class_spec(args.store):
        return
    args.store = absolute(args.store)
    if must_exist and is_local(args.store) and not os.path.isdir(args.store):
        raise UsageError(
            f"--store {args.store} is not a directory; give the capture store the model "
            "servers write to (an absolute or relative path, or an s3:// URL)"
        )


def check_dest(args: argparse.Namespace, must_exist: bool = False) -> None:
    args.dest = absolute(args.dest)
    if not is_local(args.dest):
        return
    if must_exist and not os.path.isdir(args.dest):
        raise UsageError(missing_dest(args.dest))
    check_directory_can_exist("--dest", args.dest, "a directory for the finalized records")


def check_separate(args: argparse.Namespace) -> None:
    """`--store`, `--dest` and `--inbox` (those the command has) are separate locations."""
    named = {f"--{name}": getattr(args, name, None) for name in ("store", "dest", "inbox")}
    try:
        check_separate_locations(named)
    except OverlappingLocationsError as exc:
        raise UsageError(str(exc)) from None


def check_locations_usable(args: argparse.Namespace) -> None:
    """Run the flows' checks of the store, the destination and a reused run id now."""
    store, dest = getattr(args, "store", None), getattr(args, "dest", None)
    if args.command in ("serve", "gateway"):
        return  # serve: each scheduled run checks them; gateway: `check_gateway_args`
    rollouts = getattr(args, "rollouts", None)
    if rollouts is not None:
        check_location("--rollouts", lambda: open_rollout_file(rollouts, args.options))
    if store is not None:
        check_location("--store", lambda: check_source(store, args.options, args.source_kwargs))
    if dest is not None:
        check_location("--dest", lambda: check_destination(dest, args.options))
    if args.command == "finalize":
        check_location("--run-id", lambda: check_run_settings(args))
        check_location("--store", lambda: check_store_for_run(*run_locations(args), args.options))


def run_locations(args: argparse.Namespace) -> tuple[str, str, str, str]:
    """A finalize's input, store, destination and run id, as `check_store_for_run` takes them."""
    return args.rollouts, args.store, args.dest, args.run_id


def check_location(flag: str, check: Callable[[], object]) -> None:
    """Run one check; its error, naming `flag`, becomes a `UsageError` (or, when retrying
    may help, an `UnavailableError`)."""
    try:
        check()
    except Exception as exc:
        message = f"{flag}: {' '.join(str(exc).split())}"
        if is_transient(exc):
            raise UnavailableError(message) from None
        raise UsageError(message) from None


def check_run_settings(args: argparse.Namespace) -> None:
    """A run id used before keeps its input and settings (`RunLayout.refuse_other_settings`).

    The input's digest is compared only when its cheap fingerprint changed (`file_fingerprint`).
    """
    layout = RunLayout(open_byte_store(args.dest, args.options), args.run_id)
    recorded = layout.read_manifest()
    if recorded is None:
        return
    claim = {name: getattr(args, name) for name in RUN_SETTINGS}
    fingerprint = file_fingerprint(args.rollouts, args.options)
    if fingerprint is None or fingerprint != recorded.rollouts_fingerprint:
        claim["rollouts"] = args.rollouts
        claim["rollouts_sha256"] = file_sha256(args.rollouts, args.options)
    layout.refuse_other_settings(recorded, claim)


def check_workdir(args: argparse.Namespace) -> None:
    args.workdir = absolute(args.workdir)
    check_directory_can_exist("--workdir", args.workdir, "a directory for the demo's files")


def check_directory_can_exist(flag: str, path: str, what: str) -> None:
    """`path` is a directory, or can become one: its nearest existing ancestor is a directory."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise UsageError(f"{flag} {path} is a file; give {what}")
    ancestor = os.path.dirname(path)
    while not os.path.exists(ancestor) and os.path.dirname(ancestor) != ancestor:
        ancestor = os.path.dirname(ancestor)
    if not os.path.isdir(ancestor):
        raise UsageError(f"{flag} {path} cannot be created: {ancestor} is a file; give {what}")


def check_run_id(args: argparse.Namespace) -> None:
    try:
        validate_run_id(args.run_id)
    except ValueError as exc:
        raise UsageError(f"--run-id: {exc}") from None


def check_storage_options(options: dict[str, Any]) -> None:
    try:
        public_storage_options(options)
    except ValueError as exc:
        raise UsageError(f"--storage-option: {exc}") from None


def check_cron(expression: str) -> None:
    from prefect.client.schemas.schedules import CronSchedule

    try:
        CronSchedule(cron=expression)
    except ValueError:
        raise UsageError(
            f"--cron {expression!r} is not a cron expression; use five fields such as "
            "'*/10 * * * *'"
        ) from None


def missing_dest(dest: str) -> str:
    """The words for a local `--dest` that is no directory (`runs`, `status`)."""
    return f"--dest {dest} is not a directory; give the run's destination"


def unknown_run(dest: str, run_id: str, store: ByteStore | None = None) -> str:
    """The words for a run id `dest` has no manifest of, with the run id of `store` (the
    destination, when given) it most likely meant."""
    close = None if store is None else closest_run_id(store, run_id)
    meant = f"did you mean --run-id {close}? " if close else ""
    return (
        f"unknown run id {run_id} at {dest}: no manifest (never started, or stopped before it "
        f"recorded one); {meant}check --dest and --run-id"
    )


def known_run(
    dest: str, run_id: str, options: dict[str, Any], need_ledger: bool = False
) -> tuple[RunManifest, RunSummary | None]:
    """The run's manifest and ledger summary; `UsageError` when `dest` has no such run (or,
    with `need_ledger`, no ledger)."""
    layout = RunLayout(open_byte_store(dest, options), run_id)
    manifest = layout.read_manifest()
    ledger = layout.read_ledger()
    if manifest is None:
        raise UsageError(unknown_run(dest, run_id, layout.dest))
    if need_ledger and ledger is None:
        raise UsageError(f"run {run_id} at {dest} has no ledger yet: it has not ended")
    if ledger is None:
        return manifest, None
    return manifest, ledger_summary(layout, dest, manifest, ledger)


def check_consumer(args: Any) -> None:
    """`--retire-after-consumer` names a valid consumer and comes with `--rows parquet`."""
    name = args.retire_after_consumer
    if name is None:
        return
    try:
        validate_consumer_name(name)
    except ValueError as exc:
        raise UsageError(f"--retire-after-consumer: {exc}") from None
    if args.rows == "none":
        raise UsageError(
            "--retire-after-consumer needs trainer rows for the consumer to acknowledge; "
            "add --rows parquet"
        )


def status_of_run(dest: str, run_id: str, options: dict[str, Any]) -> RunStatus:
    """The run as its destination shows it now; `UsageError` when `dest` has no such run."""
    layout = RunLayout(open_byte_store(dest, options), run_id)
    status = run_status(layout, dest)
    if status is None:
        raise UsageError(unknown_run(dest, run_id, layout.dest))
    return status


def run_summary(dest: str, run_id: str, options: dict[str, Any]) -> RunSummary | None:
    """The summary of a run's ledger, or `None` when the run wrote none (or it is unreadable)."""
    try:
        return known_run(dest, run_id, options, need_ledger=True)[1]
    except Exception:  # the caller is already reporting the run's own failure
        return None


def check_api_set(why: str) -> None:
    """Refuse a command that needs a Prefect server of its own when none is configured."""
    from prefect.settings import PREFECT_API_URL

    if not PREFECT_API_URL.value():
        raise UsageError(f"{why}; set it (export PREFECT_API_URL=http://HOST:4200/api)")
