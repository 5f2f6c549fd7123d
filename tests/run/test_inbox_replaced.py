"""Attacks on the inbox with a file re-published under the same name: never skipped as done.

A file's run id comes from its URL, so new content published under an old name maps to the
run that finalized the old content. The run's manifest records the content's digest; a pass
that finds other content fails naming the file and what to do, and finalizes nothing of it.
Flows run against the session's real Prefect server; S3 is a real moto server.
"""

from __future__ import annotations

import os

import orjson
import pytest

from capture_core.run.inbox import attempts, replaced_file, run_id_for_file
from capture_core.run.rollout_io import file_fingerprint, plan_rollout_file
from capture_core.run.run_layout import RunLayout, read_manifest
from capture_core.storage import open_byte_store
from capture_core.store import TokenCaptureStore
from tests.support.pipeline_helpers import (
    dest_records,
    locations_inbox,
    make_batch,
    rollout_ids,
    write_rollouts,
)
from tests.support.reliability_figures import record_case
from tokcap.flows.inbox import InboxFailedError, finalize_inbox
from tokcap.tasks.run_state import claim_run_id

pytestmark = [pytest.mark.integrity, pytest.mark.usefixtures("prefect_api")]


def publish(url: str, records: list[dict], options: dict | None) -> str:
    """Publish an inbox file whole: locally written aside then renamed into place, on S3 one PUT."""
    if "://" in url:
        return write_rollouts(url, records, options)
    draft = write_rollouts(url + ".draft", records)
    os.replace(draft, url)
    return url


def test_a_replaced_inbox_file_fails_the_pass_naming_it(locations) -> None:
    options, inbox = locations["options"], locations["inbox"]
    store = TokenCaptureStore(locations["store"], options)
    first = make_batch(store, 4)
    url = publish(f"{inbox}/a.jsonl", first, options)

    def inbox_pass():
        return finalize_inbox(locations_inbox(locations, batch_size=2))

    assert inbox_pass().finalized == [url]
    run_id = run_id_for_file(url)
    dest = open_byte_store(locations["dest"], options)
    recorded = read_manifest(dest, run_id)
    assert recorded is not None
    assert inbox_pass().already_done == [url], "unchanged content is done"
    publish(url, make_batch(store, 3, task=8), options)
    with pytest.raises(InboxFailedError) as failed:
        inbox_pass()
    reason = failed.value.summary.failed[url]
    assert "was replaced" in reason and recorded.rollouts_sha256[:12] in reason, reason
    assert "new file name" in reason, "the failure says what to do"
    assert failed.value.summary.already_done == []
    assert attempts(dest, run_id) == 1, "a replaced file is refused before any claim"
    assert sorted(rollout_ids(dest_records(locations["dest"], run_id, options))) == [
        f"7-{i}" for i in range(4)
    ]
    assert all(store.read_entries(f"8-{i}") for i in range(3)), "nothing new was finalized"
    publish(url, first, options)
    assert inbox_pass().already_done == [url], "the original content, re-published, is done"
    record_case("a replaced inbox file is skipped as done")


def test_the_file_fingerprint_is_only_a_shortcut_past_the_digest(tmp_path) -> None:
    """Same bytes under a new inode are the same file; an edit that resets mtime is caught."""
    url = str(tmp_path / "inbox" / "a.jsonl")
    write_rollouts(url, [{"_ng_rollout_id": "7-0"}])
    dest_url = str(tmp_path / "dest")
    plan = plan_rollout_file(url, 2)
    settings = {"store": "s", "builder": "prefix_merging", "batch_size": 2}
    claim_run_id.fn(dest_url, "r", plan, settings)
    dest = open_byte_store(dest_url)
    assert replaced_file(dest, "r", url) is None
    same = orjson.dumps({"_ng_rollout_id": "7-0"}) + b"\n"
    with open(url + ".draft", "wb") as f:
        f.write(same)
    os.replace(url + ".draft", url)
    assert replaced_file(dest, "r", url) is None, "same bytes under a new inode"
    seen = RunLayout(dest, "r").read_input_seen(plan.sha256)
    assert seen == file_fingerprint(url) != plan.fingerprint, "remembered: not read again"
    before = os.stat(url)
    with open(url, "r+b") as f:
        f.write(b'{"_ng_rollout_id": "7-1"}')
    os.utime(url, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert os.stat(url).st_size == before.st_size
    assert "was replaced" in (replaced_file(dest, "r", url) or ""), "edited in place, mtime reset"
