"""A fleet-wide failure never reads as success.

A store written by a newer tokcap, or one that refuses reads, masks every rollout for a
reason that is not the rollout's. Such reasons are kinds of their own in the summary
(`version skew`, `unreadable store`), and a run whose rollouts mask for them beyond the alert
threshold stops before handing those batches off, fails (exit 1) and says what to do; once
the cause is fixed, `tokcap retrigger` delivers the rollouts.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from capture_core.operator.mask_reasons import reason_kind
from capture_core.operator.run_report import reason_category
from capture_core.protocols import TokenCaptureSnapshot
from capture_core.store import TokenCaptureStore
from tests.support.pipeline_helpers import (
    dest_records,
    finalize_args,
    make_batch,
    receipt_args,
    run_cli,
    write_rollouts,
)
from tests.support.reliability_figures import record_case
from tokcap.flows.finalize import RunFailedError, finalize_run

pytestmark = pytest.mark.usefixtures("prefect_api")


def stored_by(store: str, version: int) -> int:
    """Mark every stored entry of the store as written in stored schema `version`."""
    count = 0
    for path in Path(store).glob("*/e/*"):
        data = path.read_bytes()
        for old in (b'"schema_version":3', b'"schema_version":4'):
            data = data.replace(old, b'"schema_version":%d' % version)
        path.write_bytes(data)
        count += 1
    return count


@pytest.mark.integrity
def test_a_store_written_by_a_newer_tokcap_fails_the_run_and_says_what_to_do(
    tmp_path: Path, prefect_api: str
) -> None:
    store, dest = str(tmp_path / "store"), str(tmp_path / "dest")
    records = make_batch(TokenCaptureStore(store), 6)
    rollouts = write_rollouts(str(tmp_path / "in.jsonl"), records)
    assert stored_by(store, 4) > 0
    result = run_cli(finalize_args(rollouts, store, dest, "skewed"), prefect_api)
    out = result.stdout + result.stderr
    assert result.returncode == 1, out[-3000:]
    assert "complete" not in result.stdout.splitlines()[0], result.stdout
    assert "6 version skew" in result.stdout, "the summary names the reason"
    assert "other reason" not in out
    assert "upgrade tokcap" in out and "tokcap retrigger --dest" in out, "it says what to do"
    assert dest_records(dest, "skewed") == [], "no batch of it was handed off"

    assert stored_by(store, 3) > 0  # tokcap upgraded: it reads the store now
    again = run_cli(receipt_args("retrigger", dest, "skewed", store), prefect_api)
    assert again.returncode == 0, again.stderr[-3000:]
    delivered = dest_records(dest, "skewed")
    assert len(delivered) == 6 and not any(r.get("mask_sample") for r in delivered)
    record_case("a store written by a newer tokcap fails the run instead of completing it")


class RefusingStore(TokenCaptureStore):
    """A store whose reads are refused, as a local store the finalizing user cannot read."""

    def freeze_now(self, rollout_id: str) -> TokenCaptureSnapshot:
        raise PermissionError(
            f"local store cannot list folder {rollout_id}: Permission denied "
            f"({self.root}/{rollout_id}); fix the permissions so the store's user can read "
            "and traverse it"
        )


@pytest.mark.integrity
def test_a_store_that_refuses_reads_fails_the_run_as_an_unreadable_store(tmp_path: Path) -> None:
    store, dest = str(tmp_path / "store"), str(tmp_path / "dest")
    records = make_batch(TokenCaptureStore(store), 5)
    rollouts = write_rollouts(str(tmp_path / "in.jsonl"), records)
    spec = f"{__name__}:RefusingStore"
    with pytest.raises(RunFailedError) as failed:
        finalize_run(rollouts, spec, dest, "refused", source_kwargs={"root": store})
    summary = failed.value.summary
    assert summary.mask_reasons == {"unreadable store": 5}, summary.mask_reasons
    assert summary.handed_off == 0 and summary.gated == 5
    assert "fix the store's permissions" in str(failed.value)
    assert "tokcap retrigger" in failed.value.next_step


@pytest.mark.parametrize(
    ("reason", "title"),
    [
        (
            "UnreadableCaptureError: rollout 7-0: object 7-0/e/cabc is not a readable token "
            "entry: stored schema_version 4 is newer than this reader supports (3); upgrade "
            "tokcap before reading it",
            "version skew",
        ),
        (
            "PermissionError: storage at s3://b/captures refused to list 7-1: Access Denied; "
            "check the credentials",
            "unreadable store",
        ),
        ("capture contains no token records", "nothing captured"),
    ],
)
def test_infrastructure_reasons_are_one_category_each(reason: str, title: str) -> None:
    """Every rollout's reason of one infrastructure kind sums under its title, whatever
    rollout or object it names; other reasons keep their categories."""
    assert reason_kind(reason_category(reason)).title == title
    other = reason.replace("7-0", "9-3").replace("7-1", "9-4")
    assert reason_category(other) == reason_category(reason)
