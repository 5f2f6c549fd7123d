"""Terminal attribution in the run ledger, summary table and markdown report."""

from __future__ import annotations

import asyncio
import logging

from capture_core.operator.run_markdown import markdown_report
from capture_core.operator.run_progress import ledger_lines
from capture_core.operator.run_report import reason_category, summarize, summary_table
from capture_core.run.batch_finalize import finalize_batch
from capture_core.run.finalize import finalize_rollout
from capture_core.run.receipt import HandoffReceipt
from capture_core.run.rollout_io import BatchPlan, ParsedLine
from capture_core.store import TokenCaptureStore
from capture_core.testing.agent_captures import CaptureMix, agent_rollout, write_capture


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
    assert methods == [m or "none" for m in expected], "the ledger names no method as the report"
    assert methods[6] == "none" and set(methods[:6]) - {"none"}
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
    counted = {m: methods.count(m) for m in set(methods)}
    assert summary.terminal_methods == counted and summary.terminal_methods["none"] >= 1
    assert summary.terminal_abstentions, "every unattributed witness left a reason"
    top_reason, top_count = next(iter(summary.terminal_abstentions.items()))
    table = {row["metric"]: row["value"] for row in summary_table(summary)}
    assert table[f"terminal abstention: {top_reason}"] == top_count
    assert table["terminal attributed by: none"] == counted["none"]
    report = markdown_report(summary, [], [], {})
    assert "## Terminal attribution" in report and f"(`{top_reason}`) | {top_count} |" in report


def test_a_lost_call_is_the_one_reason_of_its_rollout_in_log_ledger_and_report(
    tmp_path, caplog
) -> None:
    """Each lost-call rollout masks for its root cause, capture incomplete, even where its
    attributed chain also crosses the gap; the finalizer warns once per masked rollout."""
    store = TokenCaptureStore(str(tmp_path / "store"))
    mix = CaptureMix(lost_call=1.0, explicit=0.0, declared=0.0)
    rollouts = [agent_rollout(4, i, seed=5, mix=mix, parent_fields=True) for i in range(8)]
    for rollout in rollouts:
        write_capture(store, rollout)
    lines = [ParsedLine(line=n, record=r.record) for n, r in enumerate(rollouts, start=1)]
    plan = BatchPlan(index=0, start=0, end=1, first_line=1, lines=8, sha256="0" * 64)
    with caplog.at_level(logging.WARNING, logger="capture_core"):
        batch = asyncio.run(finalize_batch("run", plan, lines, store))
    reasons = [outcome.mask_reason or "" for outcome in batch.outcomes]
    errors = {p.record["_ng_token_capture"].get("error", "")[:20] for p in lines}
    assert len(errors) > 2, "the lost calls also broke chains and contradicted lineage"
    assert all(outcome.masked for outcome in batch.outcomes)
    assert all(r.startswith("capture incomplete: ") for r in reasons), reasons
    assert all("never captured" in r for r in reasons), reasons
    assert {reason_category(r) for r in reasons} == {"capture incomplete"}
    assert not [r for r in caplog.records if r.name.startswith("capture_core.builder")], (
        "the builder's own steps do not warn beside the one mask warning"
    )

    result = dict(rollouts[0].record)
    with caplog.at_level(logging.WARNING, logger="capture_core"):
        caplog.clear()
        built = asyncio.run(finalize_rollout(result, store))
    assert built is not None and built.mask_reason() == reasons[0]
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warned == [f"rollout {rollouts[0].rollout_id} masked: {reasons[0]}"]
