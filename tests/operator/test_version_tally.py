"""What operators see of weight versions: ledger figures, the run's tally, report and CLI.

Records are built by hand with the `token_provenance` key exactly as the design of issue 50
fixes it (section 2), as finalize hands them off.
"""

from __future__ import annotations

from typing import Any

import orjson

from capture_core.operator.run_markdown import markdown_report
from capture_core.operator.run_report import summarize, summary_table
from capture_core.operator.version_tally import NO_PROVENANCE
from capture_core.run.ledger_versions import version_figures
from capture_core.run.run_layout import LedgerLine, encode_ledger
from tokcap.flows.cli.output import print_summary


def provenance(tokens: dict[int, int], unknown: int = 0) -> dict[str, Any]:
    """A `token_provenance` key whose calls sampled `tokens` (version: count)."""
    known = sorted(tokens)
    return {
        "schema_version": 1,
        "calls": {"c0": {"start_weight_version": known[0]} if known else None},
        "chain": ["c0"],
        "versions": {
            "min": known[0] if known else None,
            "max": known[-1] if known else None,
            "tokens": {str(v): n for v, n in tokens.items()},
            "unknown_tokens": unknown,
        },
    }


def line(n: int, record: dict[str, Any], masked: bool = False) -> LedgerLine:
    """The ledger line finalize writes for a handed-off record (figures as `_outcome` adds them)."""
    figures = version_figures(record, masked)
    return LedgerLine(
        rollout_id=f"7-{n}", line=n, masked=masked, finalized=True, handed_off=True, **figures
    )


def test_each_line_carries_min_max_or_null_and_a_record_without_the_key_none() -> None:
    spanning = line(1, {"token_provenance": provenance({3: 10, 5: 4}, unknown=2)})
    unknown = line(2, {"token_provenance": provenance({}, unknown=9)})
    plain = line(3, {"reward": 1.0})
    masked = line(4, {"token_provenance": provenance({3: 1})}, masked=True)
    encoded = [
        orjson.loads(raw) for raw in encode_ledger([spanning, unknown, plain, masked]).splitlines()
    ]
    assert encoded[0]["weight_versions"] == [3, 5]
    assert encoded[0]["weight_version_tokens"] == {"3": 10, "5": 4}
    assert encoded[0]["unknown_version_tokens"] == 2
    assert encoded[1]["weight_versions"] is None and encoded[1]["unknown_version_tokens"] == 9
    for without in encoded[2:]:
        assert not {"weight_versions", "weight_version_tokens", "unknown_version_tokens"} & set(
            without
        )
    before = LedgerLine(rollout_id="7-3", line=3, finalized=True, handed_off=True)
    assert encode_ledger([plain]) == encode_ledger([before]), "ledgers without provenance unchanged"
    assert LedgerLine.model_validate(encoded[0]).weight_versions == [3, 5]


def test_the_summary_report_and_cli_show_min_max_spanning_and_tokens_per_version(capsys) -> None:
    ledger = [
        line(1, {"token_provenance": provenance({3: 10, 5: 4})}),
        line(2, {"token_provenance": provenance({4: 6})}),
        line(3, {"token_provenance": provenance({}, unknown=7)}),
        line(4, {"token_provenance": provenance({9: 100})}, masked=True),
    ]
    summary = summarize("run-v", ledger)
    tally = summary.weight_versions
    assert tally is not None
    assert (tally.min, tally.max, tally.spanning, tally.rollouts) == (3, 5, 1, 3)
    assert tally.tokens == {"3": 10, "4": 6, "5": 4} and tally.unknown_tokens == 7
    table = {row["metric"]: row["value"] for row in summary_table(summary)}
    assert table["weight version min"] == 3 and table["weight version max"] == 5
    assert table["rollouts spanning weight versions"] == 1
    assert (
        table["tokens of weight version 4"] == 6 and table["tokens of unknown weight version"] == 7
    )
    report = markdown_report(summary, ledger, [], {})
    assert "## Weight versions" in report and "| 5 | 4 |" in report and "| unknown | 7 |" in report
    assert "weight versions delivered: 3 to 5; 1 of 3 rollouts span more than one version" in report
    print_summary(summary)
    out = capsys.readouterr().out
    assert "tokens per weight version: 3: 10, 4: 6, 5: 4" in out
    assert "7 generated tokens of unknown version" in out


def test_a_run_whose_calls_held_no_provenance_says_so_in_one_line(capsys) -> None:
    ledger = [line(n, {"token_provenance": provenance({}, unknown=5)}) for n in (1, 2)]
    summary = summarize("run-none", ledger)
    print_summary(summary)
    out = capsys.readouterr().out
    said = [text for text in out.splitlines() if NO_PROVENANCE in text]
    assert said == [
        f"weight versions: {NO_PROVENANCE} (2 rollouts, 10 generated tokens of unknown version)"
    ]
    assert "tokens per weight version" not in out
    table = summary_table(summary)
    assert [row for row in table if "weight version" in str(row["metric"])] == [
        {"metric": "weight versions", "value": NO_PROVENANCE}
    ]
    report = markdown_report(summary, ledger, [], {})
    assert report.count(NO_PROVENANCE) == 1 and "| weight version | tokens |" not in report


def test_a_run_without_the_key_shows_nothing_new(capsys) -> None:
    ledger = [line(1, {"reward": 1.0})]
    summary = summarize("run-old", ledger)
    assert summary.weight_versions is None
    print_summary(summary)
    assert "weight version" not in capsys.readouterr().out
    assert "Weight versions" not in markdown_report(summary, ledger, [], {})
