"""run_report without a Prefect server: summary counts, reason grouping, markdown report."""

from __future__ import annotations

from capture_core.operator.run_markdown import markdown_report
from capture_core.operator.run_report import locate, reason_category, summarize
from capture_core.run.run_layout import LedgerLine


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
    assert "- r1 (line 1): other reason: `lost | call`" in text
    assert "## Failed rollouts and malformed lines (1)" in text
    assert "| 0 | 1.25 |" in text


def _delivered_row(text: str) -> list[float]:
    rows = text.split("## Delivered fraction (unmasked rollouts)", 1)[1].splitlines()
    return [float(cell) for cell in rows[4].strip("| ").split(" | ")]


def test_delivered_percentiles_never_leave_the_sample_range() -> None:
    for sample in ([0.8333, 1.0, 1.0, 1.0, 1.0], [1.0, 0.5], [0.2], [0.9, 1.0, 1.0]):
        ledger = [line(n, delivered_fraction=f) for n, f in enumerate(sample, start=1)]
        text = markdown_report(summarize("run", ledger), ledger, sample, {})
        low, p10, p50, p90, high = _delivered_row(text)
        assert (low, high) == (min(sample), max(sample))
        assert all(low <= p <= high for p in (p10, p50, p90)), (sample, p10, p50, p90)
        assert p10 <= p50 <= p90


def test_rollouts_handed_off_by_an_earlier_run_are_counted_from_the_ledger() -> None:
    ledger = [line(n, earlier=n <= 4) for n in range(1, 8)]
    summary = summarize("run", ledger)
    assert (summary.already_handed_off, summary.handed_off) == (4, 7)
