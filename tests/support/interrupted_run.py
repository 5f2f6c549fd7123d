"""A `tokcap finalize` run held at a known point, so tests can interrupt it for real.

`StalledRun` captures 6 rollouts (or more) in batches of 2 behind a `StallingStore` whose freeze of
`7-4` (batch 2) stalls: the run hands off and retires batches 0 and 1, then waits. A test
then kills the worker, stops the Prefect server or starts an S3 outage, and releases the
stall or not.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from capture_core.storage import open_byte_store
from capture_core.store import TokenCaptureStore
from tests.support.pipeline_helpers import REPO, finalize_args, make_batch, write_rollouts
from tests.support.servers import wait_until
from tests.support.stalling_source import read_flag

STALL_SOURCE = "tests.support.stalling_source:StallingStore"
ROLLOUTS = 6
BATCH_SIZE = 2
STALLED_BATCH = 2


@dataclass
class StalledRun:
    """A run over 6 captured rollouts whose batch 2 stalls until `release` exists."""

    base: Path
    run_id: str
    prefix: str = ""
    """Where the store, destination and rollout file go: `base` when empty, or `s3://bucket`."""
    options: dict | None = None
    rollouts_count: int = ROLLOUTS
    root: str = field(init=False)
    dest: str = field(init=False)
    rollouts: str = field(init=False)
    flag: str = field(init=False)

    def __post_init__(self) -> None:
        prefix = self.prefix or str(self.base)
        self.root = f"{prefix}/store"
        self.dest = f"{prefix}/dest"
        self.flag = str(self.base / "stalled")
        records = make_batch(TokenCaptureStore(self.root, self.options), self.rollouts_count)
        self.rollouts = write_rollouts(f"{prefix}/in.jsonl", records, self.options)

    def source_args(self) -> list[str]:
        kwargs = {"root": self.root, "stall_rollout": "7-4", "flag": self.flag}
        if self.options:
            kwargs["storage_options"] = self.options
        args = ["--store", STALL_SOURCE]
        for key, value in kwargs.items():
            text = value if isinstance(value, str) else orjson.dumps(value).decode()
            args += ["--source-kwarg", f"{key}={text}"]
        return args + self.storage_args()

    def storage_args(self) -> list[str]:
        if not self.options:
            return []
        return ["--storage-option", f"endpoint_url={self.options['endpoint_url']}"]

    def finalize_args(self) -> list[str]:
        args = finalize_args(self.rollouts, STALL_SOURCE, self.dest, self.run_id)
        at = args.index("--store")
        del args[at : at + 2]
        return [*args, "--batch-size", str(BATCH_SIZE), *self.source_args()]

    def retrigger_args(self) -> list[str]:
        return ["retrigger", "--dest", self.dest, "--run-id", self.run_id, *self.source_args()]

    def status_args(self, *extra: str) -> list[str]:
        return [
            "status",
            "--dest",
            self.dest,
            "--run-id",
            self.run_id,
            *extra,
            *self.storage_args(),
        ]

    def completing_command(self) -> str:
        """How the CLI names the command that completes the run (its flags in this order)."""
        return f"tokcap retrigger --dest {self.dest} --run-id {self.run_id} --store {STALL_SOURCE}"

    def keys(self, under: str) -> list[str]:
        return open_byte_store(self.dest, self.options).list_prefix(f"{self.run_id}/{under}")

    def wait_stalled(self, proc: subprocess.Popen, timeout: float = 240) -> None:
        """Until batches 0 and 1 are handed off and retired and batch 2 stalls."""

        def held() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"the run ended before it stalled: {proc.communicate()}")
            retired = [k for k in self.keys("receipts") if "-retired-" in k]
            return read_flag(self.flag) is not None and len(retired) == STALLED_BATCH

        wait_until(held, timeout, "batches 0 and 1 to be retired and batch 2 to stall", 0.2)

    def release(self) -> None:
        Path(self.flag + ".release").touch()


def start_cli(args: list[str], env: dict[str, str]) -> subprocess.Popen:
    """`tokcap ARGS` as a real subprocess in its own session, its output captured."""
    return subprocess.Popen(
        [sys.executable, "-m", "tokcap.flows.cli", *args],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": REPO, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
