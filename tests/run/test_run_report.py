"""run_report without a Prefect server: summary counts, reason grouping, markdown report."""

from __future__ import annotations

from capture_core.run.run_layout import LedgerLine
from capture_core.run.run_report import locate, markdown_report, reason_category, summarize


def line(n: int, **fields: object) -> LedgerLine:
    base = {"rollout_id": f"r{n}", "line": n, "finalized": True, "handed_off": True}
    return LedgerLine.model_validate({"masked": False, **base, **fields})


def test_reasons_group_by_their_leading_phrase() -> None:
    assert reason_category("CaptureRetiredError: rollout 7-0 was already retired (s1)") == (
        "was already retired"
    )
    assert reason_category("capture incomplete: lost call") == "capture incomplete"
    assert reason_category(None) == "masked"


def test_summary_counts_each_fate() -> None:
    ledger = [
        line(1, retired=True),
        line(2, masked=True, mask_reason="capture incomplete: x"),
        line(3, handed_off=False, error="upload failed"),
        line(4, rollout_id=None, finalized=False, handed_off=False, error="malformed JSON"),
    ]
    summary = summarize("run", ledger)
    counts = (summary.rollouts, summary.handed_off, summary.masked, summary.retired)
    assert counts == (4, 2, 1, 1)
    assert (summary.failed, summary.malformed_lines) == (1, 1)
    assert summary.mask_reasons == {"capture incomplete": 1}
    assert summary.malformed_line_errors == ["malformed JSON"] and not summary.ok


def test_a_repeated_id_line_is_counted_as_a_duplicate() -> None:
    summary = summarize("run", [line(1, finalized=False, handed_off=False, error="repeated")])
    assert summary.duplicate_lines == 1 and not summary.ok


def test_a_clean_run_is_ok() -> None:
    assert summarize("run", [line(1, retired=True)]).ok


def test_locate_names_the_records_and_ledger() -> None:
    summary = locate(summarize("run", []), "s3://bucket/dest/")
    assert summary.records_prefix == "s3://bucket/dest/run/records/"
    assert summary.ledger == "s3://bucket/dest/run/ledger.jsonl"


def test_markdown_lists_masked_and_failed_rollouts() -> None:
    ledger = [line(1, masked=True, mask_reason="lost | call"), line(2, handed_off=False)]
    text = markdown_report(summarize("run", ledger), ledger, [0.5], {0: 1.25})
    assert "| r1 | 1 | lost \\| call |" in text
    assert "## Failed rollouts and malformed lines (1)" in text
    assert "| 0 | 1.25 |" in text
