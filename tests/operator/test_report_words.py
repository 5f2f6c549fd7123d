"""Reports in plain words: the outcome first, the mask rate against the alert threshold, each
mask reason with what to do and its docs section; stored reasons keep their own text.

No Prefect server: summaries are built from ledgers, reports rendered from them.
"""

from __future__ import annotations

import re
from pathlib import Path

import orjson
import pytest

from capture_core.operator.mask_reasons import DOCS, KINDS, OTHER, abstention_words, reason_kind
from capture_core.operator.run_markdown import markdown_report
from capture_core.operator.run_outcome import (
    MASK_ALERT_AUTOMATION,
    MASK_ALERT_EVENT,
    mask_rate_line,
    outcome_line,
    reason_lines,
)
from capture_core.operator.run_report import reason_category, summarize
from capture_core.run.run_layout import LedgerLine
from tests.support.build_result_cases import GOLDEN

REPO = Path(__file__).resolve().parents[2]
ISSUE_REASONS = [
    "1 roots and 2 chains (need one of each)",
    "unresolved retries ['call-485d240d60', 'call-67383766e7']",
    "terminal not attributable: response_id:response_has_no_id; content:no_content_match",
    "capture incomplete: call began but was never captured (intent cmnqwy3bngaydambu)",
    "CaptureRetiredError: rollout 7-0 was already retired after an earlier handoff: snapshot s",
]


def line(n: int, **fields: object) -> LedgerLine:
    base = {"rollout_id": f"r{n}", "line": n, "finalized": True, "handed_off": True}
    return LedgerLine.model_validate({"masked": False, "retired": True, **base, **fields})


def golden_reasons() -> list[str]:
    """Every error and mask reason the recorded build results give."""
    found: list[str] = []

    def walk(value: object) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                if key == "error" and isinstance(inner, str):
                    found.append(inner)
                walk(inner)
        elif isinstance(value, list):
            for inner in value:
                walk(inner)

    walk(orjson.loads(GOLDEN.read_bytes()))
    return found


def docs_anchors() -> set[str]:
    text = (REPO / "docs" / f"{DOCS.split()[-1]}.md").read_text(encoding="utf-8")
    headings = re.findall(r"^#+ (.+)$", text, re.MULTILINE)
    return {re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-") for h in headings}


@pytest.mark.parametrize("reason", ISSUE_REASONS)
def test_each_reported_reason_has_plain_words_what_to_do_and_a_docs_section(reason) -> None:
    for text in (reason, reason_category(reason)):
        kind = reason_kind(text)
        assert kind is not OTHER, text
        assert kind.link == f"{DOCS}#{kind.anchor}"
        assert "roots" not in kind.line() and "response_has_no_id" not in kind.line()


def test_the_reasons_builds_give_all_have_a_kind_but_plain_disk_errors() -> None:
    unknown = {reason_category(r) for r in golden_reasons() if reason_kind(r) is OTHER} - {
        "disk gone"
    }
    assert not unknown, unknown


def test_every_kind_has_its_section_in_the_docs() -> None:
    anchors = docs_anchors()
    assert {kind.anchor for kind in (*KINDS, OTHER)} <= anchors, anchors


def test_categories_carry_no_call_ids() -> None:
    ambiguous = (
        "calls ['call-c'] extend several calls with one token sequence, so their parent is "
        "ambiguous; the only chain left would silently drop them"
    )
    assert reason_category(ambiguous) == (
        "calls extend several calls with one token sequence, so their parent is ambiguous"
    )
    assert reason_category("unresolved retries ['c2']") == "unresolved retries"


def test_abstention_codes_read_as_words() -> None:
    assert abstention_words("response_id_no_match").startswith("the scored response's id")
    assert abstention_words("attribution_error[KeyError]").startswith("a witness could not")


def masked_run(alert: float | None) -> tuple[object, list[LedgerLine]]:
    ledger = [line(n) for n in range(1, 7)]
    ledger.append(line(7, masked=True, retired=False, mask_reason=ISSUE_REASONS[0]))
    summary = summarize("demo-1", ledger)
    summary.mask_alert_threshold = alert
    return summary, ledger


def test_the_outcome_comes_first_and_the_mask_rate_names_the_alert() -> None:
    summary, ledger = masked_run(0.1)
    assert outcome_line(summary).startswith("run demo-1: complete: 7 of 7 rollouts handed off")
    assert "1 masked" in outcome_line(summary) and "6 captures retired" in outcome_line(summary)
    rate = mask_rate_line(summary)
    assert rate.startswith("mask rate 14.3% (1 of 7), above the alert threshold of 10%")
    assert rate.endswith(": the mask rate crossed it, so the run emitted event " + MASK_ALERT_EVENT)
    summary.mask_alert_automation = MASK_ALERT_AUTOMATION
    assert "the mask alert fired" in mask_rate_line(summary)
    summary.mask_alert_threshold = 0.2
    assert "within the alert threshold of 20%: no alert" in mask_rate_line(summary)
    text = markdown_report(summary, ledger, [1.0] * 6, {0: 0.5})
    assert text.splitlines()[0] == "# tokcap run `demo-1`: complete"
    assert text.splitlines()[2] == outcome_line(summary)
    assert mask_rate_line(summary) in text


def test_the_markdown_report_explains_reasons_abstentions_and_the_delivered_fraction() -> None:
    summary, ledger = masked_run(0.1)
    summary.terminal_methods, summary.terminal_abstentions = (
        {"content": 6},
        {"response_id_no_match": 6},
    )
    text = markdown_report(summary, ledger, [0.5, 1.0, 1.0, 1.0, 1.0, 1.0], {})
    (reason,) = reason_lines(summary)
    assert reason.startswith("1 several conversations: ") and f"{DOCS}#" in reason
    assert reason.split(" ", 1)[1] in text
    assert "| 1 roots and 2 chains |" not in text, "no bare category as a reason"
    assert "the scored response's id matches no captured call" in text
    assert "`response_id_no_match`" in text, "the code stays beside its words"
    assert "p10" in text and "a tenth of the unmasked rollouts delivered less" in text
    masked = next(row for row in text.splitlines() if "r7" in row)
    assert masked.startswith("- ") and ISSUE_REASONS[0] in masked, "a list item wraps"


def test_a_gated_run_says_so_first() -> None:
    ledger = [line(1), line(2, handed_off=False, retired=False, gated=True)]
    ledger.append(line(3, rollout_id=None, finalized=False, handed_off=False, not_started=True))
    assert outcome_line(summarize("g", ledger)).startswith(
        "run g: stopped by the mask gate: 1 of 3 rollouts handed off"
    )
