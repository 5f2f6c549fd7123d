"""Helpers for pipeline tests: captured rollout batches, destination readers, CLI runs."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

import orjson

from capture_core.errors import StoreUnavailableError
from capture_core.operator.run_report import RunSummary
from capture_core.protocols import DropRequest, TokenCaptureSnapshot
from capture_core.records import TokenEntry
from capture_core.run.rollout_io import split_lines
from capture_core.storage import open_byte_store
from capture_core.store import TokenCaptureStore
from capture_core.testing.synthetic import RolloutShape, rollout_record, synthetic_rollout
from tokcap.flows.finalize import finalize_run
from tokcap.flows.inbox import FileSettings

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class FailingDropStore(TokenCaptureStore):
    """A source whose drops fail permanently, so a run ends with receipts but no retirement."""

    def drop_now(self, rollout_id: str, snapshot_id: str, version: int) -> bool:
        raise PermissionError("retirement not allowed in this test")


FAILING_DROP_SOURCE = "tests.support.pipeline_helpers:FailingDropStore"
"""The `source` spec that opens a `FailingDropStore` (pass its root in `source_kwargs`)."""


class OneDeleteFailsStore(TokenCaptureStore):
    """A source that cannot delete rollout `7-0`'s payloads: its retirement is decided (the
    tombstone is durable) but fails, while the other rollouts of its batch retire."""

    def _delete_payloads(
        self, request: DropRequest, listed: Sequence[str] = ()
    ) -> list[str] | None:
        if request.rollout_id == "7-0":
            raise PermissionError("deleting 7-0 is not allowed in this test")
        return super()._delete_payloads(request, listed)


ONE_DELETE_FAILS_SOURCE = "tests.support.pipeline_helpers:OneDeleteFailsStore"


class FailingFreezeStore(TokenCaptureStore):
    """A source whose freezes of task 8's rollouts (`8-i`) find the storage unavailable, so
    the batch holding them fails (after its retries) while the others complete."""

    def freeze_now(self, rollout_id: str) -> TokenCaptureSnapshot:
        if rollout_id.startswith("8-"):
            raise StoreUnavailableError(f"storage unavailable in this test ({rollout_id})")
        return super().freeze_now(rollout_id)


FAILING_FREEZE_SOURCE = "tests.support.pipeline_helpers:FailingFreezeStore"
"""The `source` spec that opens a `FailingFreezeStore` (pass its root in `source_kwargs`)."""


def make_batch(
    store: TokenCaptureStore, count: int, *, masked: set[int] = frozenset(), task: int = 7
) -> list[dict[str, Any]]:
    """Capture `count` rollouts `task-i`; those in `masked` get an auxiliary call (2 roots)."""
    records = []
    for i in range(count):
        for entry in batch_entries(f"{task}-{i}", masked=i in masked):
            store.put_now(entry)
        records.append(rollout_record(task, i, reward=float(i % 2)))
    return records


def batch_entries(rollout_id: str, masked: bool = False) -> list[TokenEntry]:
    """The calls `make_batch` captures for one rollout (deterministic for its id)."""
    shape = RolloutShape(
        turns=3, prompt_tokens=16, generated_tokens=4, tool_tokens=2, auxiliary_call=masked
    )
    return synthetic_rollout(rollout_id, shape)


def write_rollouts(
    url: str, records: list[dict], options: dict | None = None, extra_lines: list[bytes] = ()
) -> str:
    data = b"".join(orjson.dumps(r) + b"\n" for r in records) + b"".join(extra_lines)
    if "://" in url:
        import fsspec

        from capture_core.storage import filesystem_for

        fs, path = filesystem_for(url, options)
        fs.pipe_file(path, data)
        assert isinstance(fs, fsspec.AbstractFileSystem)
    else:
        os.makedirs(os.path.dirname(url), exist_ok=True)
        with open(url, "wb") as f:
            f.write(data)
    return url


def finalize_locations(locations: dict, run_id: str, **settings: Any) -> RunSummary:
    """`finalize_run` over the rollout file, store and destination of a `locations` fixture."""
    return finalize_run(
        locations["rollouts"],
        locations["store"],
        locations["dest"],
        run_id,
        storage_options=locations["options"],
        **settings,
    )


def locations_inbox(locations: dict, **settings: Any) -> FileSettings:
    """The inbox settings of a `locations` fixture (its inbox, store, destination and options),
    each of `settings` in place of the fixture's or the default."""
    named = {"inbox": locations["inbox"], "store": locations["store"], "dest": locations["dest"]}
    return FileSettings(**{**named, "storage_options": locations["options"], **settings})


def dest_records(dest: str, run_id: str, options: dict | None = None) -> list[dict]:
    """Every finalized record in the run's part files, in part order."""
    byte_store = open_byte_store(dest, options)
    records = []
    for key in byte_store.list_prefix(f"{run_id}/records"):
        data = byte_store.get(key) or b""
        records.extend(orjson.loads(line) for line in split_lines([data]) if line.strip())
    return records


def receipt_args(command: str, dest: str, run_id: str, store: str) -> list[str]:
    """`tokcap retire` or `tokcap retrigger` arguments for one run against one store."""
    return [command, "--dest", dest, "--run-id", run_id, "--store", store]


def rollout_ids(records: list[dict]) -> list[str]:
    return [f"{r['_ng_task_index']}-{r['_ng_rollout_index']}" for r in records]


def finalize_args(rollouts: str, store: str, dest: str, run_id: str, *extra: str) -> list[str]:
    """`tokcap finalize` arguments for one run."""
    return [
        "finalize",
        "--rollouts",
        rollouts,
        "--store",
        store,
        "--dest",
        dest,
        "--run-id",
        run_id,
        *extra,
    ]


def with_storage_options(args: list[str], options: dict | None) -> list[str]:
    """`tokcap` arguments plus `--storage-option endpoint_url=...` when `options` name one."""
    if options:
        args = [*args, "--storage-option", f"endpoint_url={options['endpoint_url']}"]
    return args


def finalize_args_for(inputs: dict[str, str], run_id: str, *extra: str) -> list[str]:
    """`tokcap finalize` arguments for one run over `inputs` (its rollouts, store and dest)."""
    return finalize_args(inputs["rollouts"], inputs["store"], inputs["dest"], run_id, *extra)


def run_cli(
    args: list[str],
    api_url: str | None,
    env: dict[str, str] | None = None,
    timeout: float = 300,
    cwd: str = REPO,
) -> subprocess.CompletedProcess:
    """Run `tokcap ARGS` as a real subprocess in `cwd`, against the session's Prefect server;
    with `api_url` `None`, as a new user runs it: no Prefect settings but those in `env`."""
    base = {k: v for k, v in os.environ.items() if api_url or not k.startswith("PREFECT_")}
    server = {"PREFECT_API_URL": api_url} if api_url else {}
    full_env = {**base, **server, "PYTHONPATH": REPO, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "tokcap.flows.cli", *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
