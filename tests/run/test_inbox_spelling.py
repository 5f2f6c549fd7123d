"""Two spellings of one inbox give each file one run: a file's run id comes from its canonical
URL (a local file by its real path), so a deployment whose inbox is respelled (a plain path,
`file://`, `local://`, a symlink) never finalizes a finished file again as a new run. A run an
older tokcap started under the URL as spelled is found and kept, so upgrading does not either.
"""

from __future__ import annotations

import os

import pytest

from capture_core.run.inbox import (
    canonical_file_url,
    file_run_ids,
    legacy_run_ids,
    run_id_for_file,
)
from capture_core.store import TokenCaptureStore
from flows.finalize import finalize_run
from flows.inbox import FileSettings, check_inbox_file, finalize_inbox, scan_inbox
from tests.support.pipeline_helpers import dest_records, make_batch, write_rollouts
from tests.support.reliability_figures import record_case

pytestmark = pytest.mark.integrity


def spellings(tmp_path) -> tuple[str, list[str]]:
    """An inbox folder holding one file, and four spellings of that folder."""
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    os.symlink(inbox, tmp_path / "current")
    return str(inbox), [
        str(inbox),
        f"file://{inbox}",
        f"local://{inbox}",
        str(tmp_path / "current"),
    ]


def test_one_file_is_one_run_whatever_the_inbox_spelling(tmp_path) -> None:
    inbox, spelled = spellings(tmp_path)
    dest = tmp_path / "dest"
    dest.mkdir()
    write_rollouts(f"{inbox}/rollouts.jsonl", [{"_ng_rollout_id": "r1"}])
    runs = {
        spelling: [f.run_id for f in scan_inbox.fn(spelling, "*.jsonl", str(dest))]
        for spelling in spelled
    }
    assert all(len(ids) == 1 for ids in runs.values()), runs
    assert len({ids[0] for ids in runs.values()}) == 1, runs
    assert {canonical_file_url(f"{s}/rollouts.jsonl") for s in spelled} == {
        f"{inbox}/rollouts.jsonl"
    }
    record_case("one inbox file read through two spellings of the inbox", records_lost=0)


def test_an_event_may_name_the_canonical_or_a_legacy_run_id_of_its_file(tmp_path) -> None:
    inbox, _ = spellings(tmp_path)
    url = f"file://{inbox}/a.jsonl"
    legacy = legacy_run_ids(url)
    assert file_run_ids(url)[0] == run_id_for_file(url) and legacy
    for run_id in file_run_ids(url):
        check_inbox_file(url, run_id, f"file://{inbox}")
    with pytest.raises(ValueError, match="is not the run of"):
        check_inbox_file(url, run_id_for_file(f"{inbox}/b.jsonl"), f"file://{inbox}")


@pytest.mark.usefixtures("prefect_api")
def test_a_file_an_older_tokcap_finalized_under_its_spelled_url_is_done(tmp_path) -> None:
    """An older pass digested `file://<inbox>/a.jsonl` as spelled; the upgraded pass, through
    that spelling or another, finds that run and finalizes nothing again."""
    inbox, spelled = spellings(tmp_path)
    store, dest = str(tmp_path / "store"), str(tmp_path / "dest")
    records = make_batch(TokenCaptureStore(store), 3)
    url = write_rollouts(f"{inbox}/a.jsonl", records)
    old_id = legacy_run_ids(f"file://{url}")[0]  # the digest of the URL as spelled
    assert old_id != run_id_for_file(url)
    finalize_run(f"file://{url}", store, dest, old_id, batch_size=2)
    for spelling in spelled:
        report = finalize_inbox(FileSettings(inbox=spelling, store=store, dest=dest))
        assert report.finalized == [] and len(report.already_done) == 1, (spelling, report)
    assert len(dest_records(dest, old_id)) == 3
    assert dest_records(dest, run_id_for_file(url)) == [], "no second run of the file"
    record_case("a file finalized before run ids were canonical is not finalized again")
