"""Terminal attribution in the run ledger, summary table and markdown report."""

from __future__ import annotations

import asyncio

from capture_core.run.handoff import HandoffReceipt, finalize_batch
from capture_core.run.rollout_io import BatchPlan, ParsedLine
from capture_core.run.run_progress import ledger_lines
from capture_core.run.run_report import markdown_report, summarize, summary_table
from capture_core.store import TokenCaptureStore
from capture_core.testing.agent_captures import agent_rollout, write_capture


def test_the_report_counts_rollouts_per_method_and_the_top_abstentions(tmp_path) -> None:
    store = TokenCaptureStore(str(tmp_path / "store"))
    rollouts = [agent_rollout(1, i, seed=3) for i in range(6)]
    for rollout in rollouts:
        write_capture(store, rollout)
    lines = [ParsedLine(line=n, record=r.record) for n, r in enumerate(rollouts)]
    lines.append(ParsedLine(line=6, record={"_ng_task_index": 2, "_ng_rollout_index": 0}))
    plan = BatchPlan(index=0, start=0, end=1, first_line=0, lines=7, sha256="0" * 64)
    batch = asyncio.run(finalize_batch("run", plan, lines, store))
    methods = [o.terminal_method for o in batch.outcomes]
    expected = [p.record["_ng_token_capture"]["terminal_attribution"]["method"] for p in lines]
    assert methods == expected and methods[6] == "" and set(methods[:6]) - {""}
    receipt = HandoffReceipt(
        run_id="run",
        batch=0,
        receipt_key=batch.receipt_key,
        part_key=batch.part_key,
        sha256="x",
        bytes=len(batch.part),
        records=7,
        rollouts=batch.outcomes,
    )
    summary = summarize("run", ledger_lines([receipt], {}, {}))
    counted = {m or "none": methods.count(m) for m in set(methods)}
    assert summary.terminal_methods == counted and summary.terminal_methods["none"] >= 1
    assert summary.terminal_abstentions, "every unattributed witness left a reason"
    top_reason, top_count = next(iter(summary.terminal_abstentions.items()))
    table = {row["metric"]: row["value"] for row in summary_table(summary)}
    assert table[f"terminal abstention: {top_reason}"] == top_count
    assert table["terminal attributed by: none"] == counted["none"]
    report = markdown_report(summary, [], [], {})
    assert "## Terminal attribution" in report and f"| {top_reason} | {top_count} |" in report
