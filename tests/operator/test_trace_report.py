"""Trace counts in the run summary, the UI table, the markdown report and `tokcap` output."""

from __future__ import annotations

from capture_core.operator.run_markdown import markdown_report
from capture_core.operator.run_report import summarize, summary_table, trace_counts
from capture_core.run.run_layout import LedgerLine, encode_ledger


def _ledger() -> list[LedgerLine]:
    delivered = LedgerLine(
        rollout_id="1-0",
        line=0,
        finalized=True,
        handed_off=True,
        masked=False,
        traces=3,
        owned_calls=7,
        tokens_trained=420,
    )
    masked = LedgerLine(
        rollout_id="1-1",
        line=1,
        finalized=True,
        handed_off=True,
        masked=True,
        mask_reason="unsettled retry groups [['a', 'b']]: nothing extends or names one",
        traces=0,
        owned_calls=0,
        tokens_trained=0,
    )
    return [delivered, masked]


def test_an_all_traces_summary_counts_traces_calls_and_tokens_and_why_nothing_trained() -> None:
    summary = summarize("run", _ledger())
    summary.delivery = "all_traces"
    assert (summary.traces, summary.owned_calls, summary.tokens_trained) == (3, 7, 420)
    assert summary.mask_reasons == {"unsettled retry groups": 1}
    table = {row["metric"]: row["value"] for row in summary_table(summary)}
    assert table["delivery"] == "all_traces" and table["tokens trained"] == 420
    report = markdown_report(summary, _ledger(), [], {})
    assert "## Training traces" in report and "| 1-0 | 3 | 7 | 420 |" in report
    assert (
        "- 1 unresolved retry: " in report
        and "(tokcap docs mask-reasons#unresolved-retry)" in report
    )


def test_a_main_chain_summary_shows_no_trace_counts() -> None:
    lines = [
        line.model_copy(update=dict.fromkeys(("traces", "owned_calls", "tokens_trained")))
        for line in _ledger()
    ]
    summary = summarize("run", lines)
    assert trace_counts(summary) == [] and "delivery" not in {
        r["metric"] for r in summary_table(summary)
    }
    assert b"traces" not in encode_ledger(lines)
    assert b'"tokens_trained":420' in encode_ledger(_ledger())
