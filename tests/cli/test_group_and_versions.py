"""`tokcap finalize --group-by/--max-group-size` are checked before any server starts, and
`tokcap status` shows the weight versions a run delivered (read from its ledger)."""

from __future__ import annotations

from pathlib import Path

import pytest

from capture_core.run.rollout_io import file_sha256
from capture_core.run.run_layout import LedgerLine, RunLayout, RunManifest
from capture_core.storage import open_byte_store
from capture_core.testing.synthetic import rollout_record
from tests.support.claimed_runs import claimed_layout
from tests.support.pipeline_helpers import finalize_args, write_rollouts
from tokcap.flows.cli.main import main


def claimed_run(tmp_path: Path, **settings: object) -> list[str]:
    """A run id claimed for a rollout file with `settings`; the finalize arguments reusing it."""
    store, dest = str(tmp_path / "store"), str(tmp_path / "dest")
    (tmp_path / "store").mkdir()
    rollouts = write_rollouts(str(tmp_path / "in.jsonl"), [rollout_record(1, 0)])
    manifest = RunManifest(
        run_id="r",
        rollouts=rollouts,
        rollouts_sha256=file_sha256(rollouts),
        store=store,
        builder="prefix_merging",
        batch_size=500,
        batches=1,
        **settings,
    )
    RunLayout(open_byte_store(dest), "r").claim(manifest)
    return finalize_args(rollouts, store, dest, "r")


def test_a_run_id_grouped_by_task_refuses_a_finalize_without_it(tmp_path, capsys) -> None:
    argv = claimed_run(tmp_path, group_by="task")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert (
        "group by task is now None" in err and "Rerun with the original input and settings" in err
    )


def test_a_grouping_the_cli_does_not_know_is_a_usage_error(tmp_path, capsys) -> None:
    argv = claimed_run(tmp_path)
    with pytest.raises(SystemExit) as exited:
        main([*argv, "--group-by", "prompt"])
    assert exited.value.code == 2
    assert (
        "--group-by: invalid choice: 'prompt' (choose from 'none', 'task')"
        in capsys.readouterr().err
    )
    with pytest.raises(SystemExit):
        main([*argv, "--group-by", "task", "--max-group-size", "0"])


def test_status_shows_the_weight_versions_delivered(tmp_path, capsys) -> None:
    dest = str(tmp_path / "dest")
    layout = claimed_layout(open_byte_store(dest), "v", batch_size=500)
    figures = [([2, 4], {"2": 5, "4": 3}), ([4, 4], {"4": 9})]
    layout.write_ledger(
        [
            LedgerLine(
                rollout_id=f"1-{n}",
                line=n + 1,
                finalized=True,
                handed_off=True,
                retired=True,
                weight_versions=span,
                weight_version_tokens=tokens,
                unknown_version_tokens=0,
            )
            for n, (span, tokens) in enumerate(figures)
        ]
    )
    assert main(["status", "--dest", dest, "--run-id", "v"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "weight versions delivered: 2 to 4; 1 of 2 rollouts span more than one version" in out
    assert "tokens per weight version: 2: 5, 4: 12" in out
