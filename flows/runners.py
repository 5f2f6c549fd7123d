"""How the CLI runs flows: `run_flow`, the Prefect API it talks to, its console, task runners.

Without `PREFECT_API_URL` the CLI starts Prefect's temporary server itself, before any flow,
with a generous readiness wait (`PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS`, default
300 s: a fresh `PREFECT_HOME` migrates its database first, slowly on a busy machine) and with
the server's telemetry off, so its background writes cannot lock the database mid-run.
Its flow runs send a heartbeat every 30 s, as the shipped work pool's do, so a run on a real
server is marked Crashed only when its process is gone. The console shows one line per log
record; tracebacks stay in the flow-run logs on the API.
The temporary server's own output goes to a log file under `PREFECT_HOME`
(`tokcap.flows.temporary_server`).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

STARTUP_TIMEOUT_SETTING = "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"
DEFAULT_STARTUP_TIMEOUT_SECONDS = 300
HEARTBEAT_SETTING = "PREFECT_FLOWS_HEARTBEAT_FREQUENCY"
HEARTBEAT_SECONDS = 30  # the shipped crash automation marks a run silent for 90 s Crashed
CLI_PREFECT_DEFAULTS = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    STARTUP_TIMEOUT_SETTING: str(DEFAULT_STARTUP_TIMEOUT_SECONDS),
    HEARTBEAT_SETTING: str(HEARTBEAT_SECONDS),
}
ENGINE_MODULES = ("flow_engine", "task_engine", "transactions")
PROBE_TIMEOUT_SECONDS = 10.0
STARTING = (
    "starting a temporary Prefect server (PREFECT_API_URL is not set; set it to a running "
    "server to skip this wait)"
)


class ServerUnavailableError(RuntimeError):
    """No Prefect API could be reached or started; the message says what to do."""


class ApiUnreachableError(ServerUnavailableError):
    """`PREFECT_API_URL` names an API that refused the connection: nothing ran (exit 3)."""


class FlowFailed(Exception):
    """A flow run ended Failed or Crashed; `error` is why, `flow_run_id` where its logs are."""

    def __init__(self, error: BaseException, flow_run_id: Any) -> None:
        super().__init__(str(error))
        self.error, self.flow_run_id = error, flow_run_id


def run_flow(flow: Any, **parameters: Any) -> Any:
    """Run a flow and return its result; `FlowFailed` when the run did not complete."""
    state = flow(**parameters, return_state=True)
    if state.is_completed():
        return state.result()
    error = state.result(raise_on_failure=False)
    if not isinstance(error, BaseException):
        error = RuntimeError(state.message or f"flow run ended {state.name}")
    raise FlowFailed(error, state.state_details.flow_run_id)


def prefect_environment() -> None:
    """Set the CLI's Prefect defaults; call before Prefect is imported. Explicit values win."""
    for name, value in CLI_PREFECT_DEFAULTS.items():
        os.environ.setdefault(name, value)


def startup_timeout() -> int:
    """Seconds to wait for the temporary server; a bad value falls back to the default."""
    try:
        return max(1, int(os.environ.get(STARTUP_TIMEOUT_SETTING, "")))
    except ValueError:
        return DEFAULT_STARTUP_TIMEOUT_SECONDS


def server_help(waiting: bool = True) -> str:
    """The one line that tells a user how to run against their own Prefect server (or, for
    a server that was only slow, how to wait longer)."""
    own = (
        f"start one with `{script('prefect')} server start` in another terminal and set "
        "PREFECT_API_URL=http://127.0.0.1:4200/api"
    )
    if waiting:
        return f"{own}, or wait longer with {STARTUP_TIMEOUT_SETTING}=600"
    return f"fix what the log names, or {own}"


@contextmanager
def prefect_api(
    notes: list[str] | None = None,
    on_lost: Callable[[str], None] | None = None,
    announce: Callable[[str], None] | None = None,
    meanwhile: Callable[[], None] | None = None,
) -> Iterator[str | None]:
    """Yield the API URL the flows use: `PREFECT_API_URL`, else a temporary server's.

    `None` means the temporary server, which stops on exit. Its flow runs stay in the
    database under `PREFECT_HOME`, where `prefect server start` shows them later. If its
    log gained errors while the command ran, a note naming the log goes to `notes` (for
    the caller to print after the command's result), or to stderr.
    While the block runs the API is watched (`tokcap.flows.api_watch`): once it refuses every
    connection for seconds, `on_lost` gets what went away and what to do about it.
    `announce` gets one line before a temporary server starts, so the wait is explained;
    `meanwhile` runs while it starts (the command's imports), or at once with a configured API.
    """
    from prefect.settings import PREFECT_API_URL

    from tokcap.flows.api_watch import watching

    configured = PREFECT_API_URL.value()
    if configured:
        check_reachable(str(configured))
        if meanwhile is not None:
            meanwhile()
        lost = on_lost and partial(_configured_lost, on_lost)
        with watching(str(configured), lost):
            yield str(configured)
        return
    from tokcap.flows.temporary_server import ending_signals_exit

    with ending_signals_exit():
        yield from _temporary_api(notes, on_lost, announce, meanwhile)


def _temporary_api(
    notes: list[str] | None,
    on_lost: Callable[[str], None] | None,
    announce: Callable[[str], None] | None,
    meanwhile: Callable[[], None] | None,
) -> Iterator[None]:
    """A temporary server's part of `prefect_api`: start it, yield, stop it."""
    from tokcap.flows.api_watch import watching
    from tokcap.flows.temporary_server import (
        TemporaryServer,
        log_position,
        rotate_log,
        server_log_path,
    )

    server = TemporaryServer(server_log_path())
    rotate_log(server.log_path)
    started_at = log_position(server.log_path)
    if announce is not None:
        announce(STARTING)
    try:
        server.launch()
        if meanwhile is not None:
            meanwhile()  # the server starts meanwhile, on the other core
    except BaseException:
        server.stop()
        raise
    try:
        server.wait_ready(startup_timeout())
    except Exception as exc:
        server.stop()
        raise ServerUnavailableError(start_failure(exc, server, started_at)) from None
    except BaseException:
        server.stop()
        raise
    ran_from = log_position(server.log_path)
    lost = on_lost and partial(_temporary_lost, server, on_lost)
    try:
        with api_url_set(server.api_url), watching(server.api_url, lost):
            try:
                yield None
            finally:
                drain_to_api()
    finally:
        server.stop()
        report_server_errors(server, ran_from, notes)


@contextmanager
def api_url_set(api_url: str) -> Iterator[None]:
    """Point Prefect's clients, and processes started meanwhile, at `api_url`."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    saved = os.environ.get("PREFECT_API_URL")
    os.environ["PREFECT_API_URL"] = api_url
    try:
        with temporary_settings(updates={PREFECT_API_URL: api_url}):
            yield
    finally:
        if saved is None:
            os.environ.pop("PREFECT_API_URL", None)
        else:
            os.environ["PREFECT_API_URL"] = saved


def check_reachable(api_url: str) -> None:
    """Raise `ApiUnreachableError`, in one line naming the URL and what to check, when the
    configured API refuses the connection: Prefect's client would retry for about 20 s and
    then fail with a bare `RuntimeError`. A slow or failing answer is left to the client."""
    import httpx

    from tokcap.flows.api_watch import refused

    try:
        with httpx.Client(timeout=PROBE_TIMEOUT_SECONDS) as client:
            seen = refused(client, api_url)
    except httpx.HTTPError as exc:  # not a URL httpx can use (no scheme, a bad port)
        seen = " ".join(str(exc).split()) or type(exc).__name__
    if seen is not None:
        raise ApiUnreachableError(
            f"the Prefect API at {api_url} (PREFECT_API_URL) cannot be reached ({seen}), so "
            "nothing ran; check that its server runs and that the URL, ending in /api, is "
            "right (`prefect server start` serves http://127.0.0.1:4200/api), or unset "
            "PREFECT_API_URL to run on a temporary server"
        )


def _configured_lost(on_lost: Callable[[str], None], api_url: str, seen: str) -> None:
    on_lost(
        f"the Prefect API at {api_url} stopped answering ({seen}), so this command stopped; "
        "start that server again (or set PREFECT_API_URL to one that runs)"
    )


def _temporary_lost(server: Any, on_lost: Callable[[str], None], api_url: str, seen: str) -> None:
    server.stop()  # whatever is left of it
    log = f"; its log: {server.log_path}" if getattr(server, "redirected", False) else ""
    on_lost(
        f"the temporary Prefect server this command started at {api_url} stopped answering "
        f"({seen}{log}), so this command stopped; the next command starts a new one"
    )


def report_server_errors(server: Any, since: Any, notes: list[str] | None) -> None:
    """Note the log of a temporary server that logged errors since `since`."""
    from tokcap.flows.temporary_server import error_lines

    if not getattr(server, "redirected", False) or not error_lines(server.log_path, since):
        return
    note = (
        "note: a temporary Prefect server using this PREFECT_HOME logged errors while this "
        f"command ran; see {server.log_path}"
    )
    if notes is None:
        print(note, file=sys.stderr)
    else:
        notes.append(note)


def start_failure(exc: Exception, server: Any, since: Any) -> str:
    """Why the temporary server did not start, with its log's last error, and what to do."""
    from tokcap.flows.temporary_server import StartupCrashError, last_error

    crashed = isinstance(exc, StartupCrashError)
    if crashed:
        what = f"did not start: {exc}"
    else:
        what = f"did not start within {startup_timeout()} s ({str(exc).splitlines()[0][:120]})"
    if getattr(server, "redirected", False):  # False for a server Prefect made first
        error = last_error(server.log_path, since)
        what += f"; its log {server.log_path} ends with: {error[:200]}" if error else ""
    return f"the temporary Prefect server {what}; {server_help(waiting=not crashed)}"


def drain_to_api(timeout: float = 30) -> None:
    """Send the logs and events still queued, so none is lost when the server stops."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for worker in (APILogWorker, EventsWorker):
        try:
            worker.drain_all(timeout=timeout)
        except Exception as exc:  # a lost log line must not fail a finished command
            logging.getLogger(__name__).warning("could not send queued %s: %s", worker, exc)


def script(name: str) -> str:
    """How to call one of this environment's console scripts from the working directory."""
    path = os.path.join(os.path.dirname(sys.executable), name)
    if not os.path.exists(path):
        return name
    relative = os.path.relpath(path)
    return relative if not relative.startswith("..") else path


def ui_hint(api_url: str | None) -> str:
    """Where the user sees the runs: the configured server's UI, or a server they start."""
    if api_url:
        base = api_url.rstrip("/")
        base = base[: -len("/api")] if base.endswith("/api") else base
        return f"open {base} (Flow Runs; a run's report comes first in its Artifacts tab)"
    from prefect.settings import PREFECT_SERVER_API_HOST, PREFECT_SERVER_API_PORT

    address = f"http://{PREFECT_SERVER_API_HOST.value()}:{PREFECT_SERVER_API_PORT.value()}"
    return (
        f"run `{script('prefect')} server start` and open {address} (Flow Runs; a run's report "
        "comes first in its Artifacts tab; this run is stored under PREFECT_HOME)"
    )


class OneLineFormatter(logging.Formatter):
    """Formats a record with its wrapped formatter, without traceback or stack."""

    def __init__(self, inner: logging.Formatter | None) -> None:
        super().__init__()
        self.inner = inner or logging.Formatter()

    def format(self, record: logging.LogRecord) -> str:
        saved = record.exc_info, record.exc_text, record.stack_info
        record.exc_info, record.exc_text, record.stack_info = None, None, None
        try:
            return self.inner.format(record).split("\n", 1)[0]
        finally:
            record.exc_info, record.exc_text, record.stack_info = saved


class EngineFailureFilter(logging.Filter):
    """Drops the engine's reports of failed states, failed tries and failed result commits;
    the run logs one line per batch that failed, and the CLI prints each failure once more
    at the end (all of them stay in the flow-run logs)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.module not in ENGINE_MODULES:
            return True
        if record.levelno >= logging.WARNING:
            return False
        message = str(record.msg)
        if message.startswith("Task run failed with"):  # a try that a retry follows
            return False
        return not message.startswith("Finished in state") or "Completed" in message


def one_line_console() -> None:
    """Make every Prefect console handler print one line per record and no engine failures.

    A log handler's own failure is not printed either (`logging.raiseExceptions`): Prefect's
    API log handler writes `--- Error logging to API ---` onto the console once the API is
    gone, which `tokcap.flows.api_watch` reports in one line; the logs still reach the console.
    """
    import prefect.main  # noqa: F401  (configures Prefect's logging once, on first import)
    from prefect.logging.handlers import PrefectConsoleHandler

    logging.raiseExceptions = False
    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    for logger in loggers:
        for handler in getattr(logger, "handlers", []):
            if isinstance(handler, PrefectConsoleHandler) and not isinstance(
                handler.formatter, OneLineFormatter
            ):
                handler.setFormatter(OneLineFormatter(handler.formatter))
                handler.addFilter(EngineFailureFilter())


def parse_task_runner(spec: str | None) -> tuple[str, str] | None:
    """Check a `--task-runner` value: `dask` or `dask=ADDRESS`; `ValueError` otherwise."""
    if not spec:
        return None
    kind, _, address = spec.partition("=")
    if kind != "dask":
        raise ValueError(f"unknown task runner {spec!r}; use dask or dask=tcp://scheduler:8786")
    try:
        import prefect_dask  # noqa: F401
    except ImportError as exc:
        raise ValueError(
            "the dask task runner needs prefect-dask: pip install -e '.[dask]'"
        ) from exc
    return kind, address


def task_runner_from_spec(spec: str | None) -> Any:
    """`None`: Prefect's default; `dask`: a local cluster; `dask=ADDRESS`: an existing one."""
    parsed = parse_task_runner(spec)
    if parsed is None:
        return None
    from prefect_dask import DaskTaskRunner

    _kind, address = parsed
    if address:
        return DaskTaskRunner(address=address)
    return DaskTaskRunner(
        cluster_kwargs={
            "n_workers": 2,
            "threads_per_worker": 1,
            "processes": True,
            "dashboard_address": None,
        }
    )
