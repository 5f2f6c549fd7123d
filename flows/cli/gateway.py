"""`tokcap gateway`: the capture gateway in the foreground (docs/gateway.md).

Its arguments are checked before it starts (a usage error names the option, exit 2): the
engine URL, the store (usable and writable now), the version source (readable now), a key
whenever the host is not loopback. It needs no Prefect server. The gateway itself is
`capture_core.gateway`, imported only when this command runs.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Callable
from typing import Any

from capture_core.errors import InvalidInputError
from capture_core.gateway.settings import (
    API_KEY_ENV,
    DEFAULT_ENGINE_TIMEOUT,
    DEFAULT_HOST,
    DEFAULT_MAX_ANSWER_BYTES,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_SHUTDOWN_GRACE,
    ENGINE_API_KEY_ENV,
    GatewaySettings,
)
from tokcap.flows.cli.checks import (
    UsageError,
    absolute,
    check_location,
    is_class_spec,
    is_local,
    positive_int,
)

DEFAULT_PORT = 8100


def port_number(text: str) -> int:
    """An argparse type: a TCP port, 0 (pick a free one) to 65535."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port: give 0-65535 (0 picks one)")
    return value


def seconds(text: str) -> float:
    """An argparse type: a positive number of seconds."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value


def add_gateway_command(commands: Any, add_storage: Callable[..., None], store_help: str) -> None:
    """The `gateway` subcommand."""
    gateway = commands.add_parser(
        "gateway", help="capture every call a harness makes to an engine (OpenAI-compatible)"
    )
    gateway.add_argument(
        "--engine",
        required=True,
        metavar="URL",
        help=f"the engine's base URL (vLLM's shape); the engine's own key, if any: set "
        f"{ENGINE_API_KEY_ENV}",
    )
    gateway.add_argument(
        "--store", required=True, metavar="URL", help="capture store: a path or an s3:// URL"
    )
    gateway.add_argument(
        "--host",
        default=DEFAULT_HOST,
        metavar="H",
        help=f"default {DEFAULT_HOST}; another host needs --api-key",
    )
    gateway.add_argument(
        "--port",
        type=port_number,
        default=DEFAULT_PORT,
        metavar="P",
        help=f"default {DEFAULT_PORT}; 0 picks a free one",
    )
    gateway.add_argument(
        "--weight-version-source",
        default=None,
        metavar="URL",
        help="where the trainer publishes its weight version (a file or URL): read at admission "
        "(start_weight_version) and completion (end_weight_version)",
    )
    gateway.add_argument(
        "--replica", default=None, metavar="NAME", help="replica name (default: the engine URL)"
    )
    gateway.add_argument(
        "--api-key",
        default=None,
        metavar="KEY",
        help=f"key every call must send as Authorization: Bearer (or set {API_KEY_ENV})",
    )
    gateway.add_argument(
        "--engine-labels-are-versions",
        action="store_true",
        help="the engine's per-token weight-version labels are trainer versions (integers)",
    )
    gateway.add_argument(
        "--max-body-bytes",
        type=positive_int,
        default=DEFAULT_MAX_BODY_BYTES,
        metavar="N",
        help=f"largest request body (default {DEFAULT_MAX_BODY_BYTES})",
    )
    gateway.add_argument(
        "--max-answer-bytes",
        type=positive_int,
        default=DEFAULT_MAX_ANSWER_BYTES,
        metavar="N",
        help=f"largest engine answer (default {DEFAULT_MAX_ANSWER_BYTES})",
    )
    gateway.add_argument(
        "--engine-timeout",
        type=seconds,
        default=DEFAULT_ENGINE_TIMEOUT,
        metavar="S",
        help=f"seconds an engine may be silent (default {DEFAULT_ENGINE_TIMEOUT:g})",
    )
    gateway.add_argument(
        "--shutdown-grace",
        type=seconds,
        default=DEFAULT_SHUTDOWN_GRACE,
        metavar="S",
        help="seconds calls in flight may finish after SIGTERM before they are cut and recorded "
        f"lost (default {DEFAULT_SHUTDOWN_GRACE:g})",
    )
    add_storage(gateway, source=False)


def check_gateway_args(args: argparse.Namespace) -> None:
    """Build the settings (each refusal names its option), then check the store and the
    version source can be used now."""
    if args.command != "gateway":
        return
    if is_class_spec(args.store):
        raise UsageError(f"--store {args.store}: the gateway writes to a path or an s3:// URL")
    args.store = absolute(args.store)
    if args.weight_version_source is not None:
        args.weight_version_source = absolute(args.weight_version_source)
    try:
        args.settings = GatewaySettings(
            engine=args.engine,
            host=args.host,
            port=args.port,
            replica=args.replica,
            weight_version_source=args.weight_version_source,
            engine_labels_are_versions=args.engine_labels_are_versions,
            api_key=args.api_key or os.environ.get(API_KEY_ENV) or None,
            engine_api_key=os.environ.get(ENGINE_API_KEY_ENV) or None,
            max_body_bytes=args.max_body_bytes,
            max_answer_bytes=args.max_answer_bytes,
            engine_timeout=args.engine_timeout,
            shutdown_grace=args.shutdown_grace,
        )
    except InvalidInputError as exc:
        flag = "--engine" if str(exc).startswith("engine") else "--host"
        raise UsageError(f"{flag}: {exc}") from None
    if args.weight_version_source is not None:
        check_location("--weight-version-source", lambda: _version_now(args))
    check_location("--store", lambda: _usable_store(args))


def _usable_store(args: argparse.Namespace) -> None:
    """Any store must be usable and writable before the gateway says it listens. A local
    one missing is made to try it and removed again: the gateway makes it when it serves,
    so a refused command leaves nothing behind (the store is checked last)."""
    made = _make_folder(args.store) if is_local(args.store) else []
    try:
        _store(args).probe(must_exist=True)
    finally:
        _remove_made(made)


def _make_folder(path: str) -> list[str]:
    """Make the folder `path` and its missing parents; the folders made, outermost first.
    A folder that cannot be made is named with what to do."""
    missing = []
    while not os.path.exists(path) and os.path.dirname(path) != path:
        missing.insert(0, path)
        path = os.path.dirname(path)
    made: list[str] = []
    for folder in missing:
        try:
            os.mkdir(folder)
        except OSError as exc:
            _remove_made(made)
            raise UsageError(
                f"the folder {missing[-1]} cannot be made ({exc.strerror or exc}: {folder}); "
                "give a folder this user can create and write to, or create it first"
            ) from None
        made.append(folder)
    return made


def _remove_made(made: list[str]) -> None:
    """Remove the folders `_make_folder` made, innermost first, while they are empty."""
    for folder in reversed(made):
        try:
            os.rmdir(folder)
        except OSError:
            return


def _store(args: argparse.Namespace) -> Any:
    from capture_core.store import open_capture_store

    return open_capture_store(args.store, args.options or None)


def _version_now(args: argparse.Namespace) -> int:
    from capture_core.gateway.versions import VersionReader

    source = VersionReader(args.weight_version_source).source
    assert source is not None
    return source.current()


def cmd_gateway(args: argparse.Namespace) -> int:
    """Serve until SIGTERM or SIGINT; exit 0 once every call in flight is settled."""
    from capture_core.gateway.serve import LISTENING, serve

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)

    def listening(url: str) -> None:
        print(f"{LISTENING} {url}", flush=True)

    made = _make_folder(args.store) if is_local(args.store) else []
    try:
        serve(args.settings, _store(args), listening)
    except OSError as exc:
        _remove_made(made)  # nothing was served: leave no store behind
        raise UsageError(
            f"--host/--port: cannot listen on {args.host}:{args.port} ({exc})"
        ) from None
    return 0
