"""`tokcap demo --rollouts N`: a realistic run of N rollouts, made by the installed package.

The demo runs as a real subprocess against the session's Prefect server; its outputs are
read back from its destination and with `tokcap status --json`.
"""

from __future__ import annotations

import re

import orjson
import pytest

from capture_core.run.run_layout import read_ledger
from capture_core.storage import open_byte_store
from tests.support.pipeline_helpers import run_cli
from tokcap.flows.demo import DEFAULT_ROLLOUTS, SCRIPTED, demo_rollouts

pytestmark = pytest.mark.usefixtures("prefect_api")


def demo_run_id(stdout: str) -> str:
    return re.search(r"^run (demo-\S+): ", stdout, re.MULTILINE).group(1)


def test_demo_of_n_rollouts_attributes_terminals_and_leaves_out_the_auxiliary_call(
    tmp_path, prefect_api: str
) -> None:
    count = 20
    result = run_cli(["demo", "--workdir", str(tmp_path), "--rollouts", str(count)], prefect_api)
    assert result.returncode == 0, result.stderr[-2000:]
    assert f": {count} rollouts" in result.stdout
    assert (
        f"{count - DEFAULT_ROLLOUTS} more from the seeded agent-capture generator" in result.stdout
    )
    run_id, dest = demo_run_id(result.stdout), str(tmp_path / "dest")
    with open(tmp_path / "rollouts.jsonl", "rb") as f:
        assert len(f.read().splitlines()) == count
    ledger = {line.rollout_id: line for line in read_ledger(open_byte_store(dest), run_id)}
    assert len(ledger) == count and all(line.handed_off for line in ledger.values())
    auxiliary = ledger["1-2"]
    assert not auxiliary.masked, auxiliary.mask_reason
    assert auxiliary.terminal_method not in (None, ""), "the scored call was named"
    assert ledger["1-1"].masked, "the lost call still masks its rollout"
    status = run_cli(["status", "--dest", dest, "--run-id", run_id, "--json"], prefect_api)
    summary = orjson.loads(status.stdout)["summary"]
    assert summary["rollouts"] == count and summary["handed_off"] == count
    attributed = {k: v for k, v in summary["terminal_methods"].items() if k != "none"}
    assert sum(attributed.values()) >= DEFAULT_ROLLOUTS - 2, summary["terminal_methods"]


def test_the_demo_says_its_outcome_first_in_words_and_what_happened_to_each_case(
    tmp_path, prefect_api: str
) -> None:
    result = run_cli(["demo", "--workdir", str(tmp_path)], prefect_api)
    assert result.returncode == 0, result.stderr[-2000:]
    out = result.stdout
    assert "{'" not in out + result.stderr, "no Python dict in the summary or the log lines"
    summary = out.split("\nrun demo-", 1)[1].splitlines()
    assert re.match(r"\S+: complete: 7 of 7 rollouts handed off, 1 masked", summary[0])
    assert "mask rate 14.3% (1 of 7), above the alert threshold of 10%: " in out
    assert re.search(r"^  1 lost call: .*; collect the rollout again .*#lost-call\)$", out, re.M)
    cases = out.split("What happened to each scripted case:\n", 1)[1].splitlines()[:7]
    fates = dict(re.match(r"  (\d-\d) .* -> (.*)$", case).groups() for case in cases)
    assert list(fates) == [rid for rid, _shape, _why in SCRIPTED]
    assert fates["1-1"].startswith("handed off masked (lost call; trainers skip it)")
    assert "capture kept as evidence" in fates["1-1"]
    assert fates["1-3"] == "handed off unchanged (it already carried token ids), capture retired"
    assert "calls off the scored chain left out" in fates["1-2"], fates["1-2"]
    assert all(fates[rid].endswith("capture retired") for rid in ("0-0", "0-1", "1-0", "1-2"))


def test_the_demo_rollouts_are_the_scripted_cases_then_generated_ones() -> None:
    few, many = demo_rollouts(3), demo_rollouts(12)
    assert [r.rollout_id for r in few] == ["0-0", "0-1", "0-2"]
    ids = [r.rollout_id for r in many]
    assert len(set(ids)) == 12 and ids[:3] == ["0-0", "0-1", "0-2"] and ids[7] == "2-0"
    assert [r.record for r in demo_rollouts(12)] == [r.record for r in many], "seeded"
