"""The run summary and mask-reason grouping of a finalization run, and its summary table
(the markdown report is `run_markdown`).

Reports are derived from receipts, retirement outcomes and the ledger; they hold ids,
counts and reasons, never storage options or credentials.
This module does not import Prefect.
"""

from __future__ import annotations

import re
import shlex
from collections import Counter

from pydantic import BaseModel, Field

from capture_core.builder.terminal import UNATTRIBUTED
from capture_core.builder.trace_envelope import MAIN_CHAIN
from capture_core.operator import version_tally as versions
from capture_core.operator.mask_reasons import (
    abstention_words,
    infrastructure_kind,
    kinds_of,
)
from capture_core.operator.run_outcome import (
    mask_rate_line,
)
from capture_core.run.run_layout import LEDGER, RECORDS, LedgerLine, run_location


class RunSummary(BaseModel):
    """What one finalization run did, for the CLI, the UI and `tokcap status`."""

    run_id: str
    records_prefix: str = ""
    ledger: str = ""
    """Where the run's records and its ledger are (set by `locate`)."""
    rollouts: int = 0
    finalized: int = 0
    masked: int = 0
    handed_off: int = 0
    already_handed_off: int = 0
    retired: int = 0
    retire_failed: int = 0
    failed: int = 0
    """Rollouts finalized but not handed off: their batch failed."""
    gated: int = 0
    """Rollouts finalized but not handed off: the mask gate stopped the run at their batch."""
    not_started: int = 0
    """Input lines the run never finalized: it stopped (the mask gate) before their batch."""
    malformed_lines: int = 0
    duplicate_lines: int = 0
    """Lines refused as input although they name a rollout: a rollout id repeated in the file."""
    mask_reasons: dict[str, int] = Field(default_factory=dict)
    errors: list[str] = Field(default_factory=list)
    malformed_line_errors: list[str] = Field(default_factory=list)
    terminal_methods: dict[str, int] = Field(default_factory=dict)
    terminal_abstentions: dict[str, int] = Field(default_factory=dict)
    awaiting_consumer: int = 0
    acknowledged_unretired: int = 0
    """Captures waiting for the consumer in the ledger whose batch it has acknowledged since:
    the next retire pass retires them (counted by `tokcap status`, which reads the
    acknowledgements as they are now; a run's own summary leaves it 0)."""
    delivery: str = MAIN_CHAIN
    traces: int = 0
    """`all_traces`: training rows handed off, calls they own and tokens they train."""
    owned_calls: int = 0
    tokens_trained: int = 0
    mask_alert_threshold: float | None = None
    """The run's mask alert threshold (`None`: none, or not known where the summary was read)."""
    mask_alert_automation: str | None = None
    """The automation acting on the run's mask alert on its Prefect API (`None`: none, or not
    known where the summary was read), so a line never names one that is not there."""
    weight_versions: versions.VersionTally | None = None
    """The delivered weight versions (`version_tally`); `None` when no record carried them."""

    @property
    def ok(self) -> bool:
        """No failed, gated or unstarted rollout, no failed retirement, no unreadable or
        duplicate input line, no error."""
        return (
            self.failed == 0
            and self.gated == 0
            and self.not_started == 0
            and self.retire_failed == 0
            and self.malformed_lines == 0
            and self.duplicate_lines == 0
            and not self.errors
        )

    @property
    def complete(self) -> bool:
        """`ok`, and no capture waits for a row consumer's acknowledgement to be retired."""
        return self.ok and self.awaiting_consumer + self.acknowledged_unretired == 0


def plural(count: int, noun: str, many: str | None = None) -> str:
    """`1 capture`, `2 captures`; `many` for an irregular plural (`batch`, `batches`)."""
    return f"{count} {noun if count == 1 else many or noun + 's'}"


def tokcap_command(
    command: str, dest: str, run_id: str, store: str, *, source_kwargs: bool, options: bool
) -> str:
    """The `tokcap retrigger` (or `retire`) command line for a run, and which of the run's
    other flags it needs: their values are not repeated (they may hold secrets)."""
    located = (("--dest", dest), ("--run-id", run_id), ("--store", store))
    where = " ".join(f"{flag} {shlex.quote(value)}" for flag, value in located)
    extra = [
        flag
        for flag, given in (("--source-kwarg", source_kwargs), ("--storage-option", options))
        if given
    ]
    also = f" (with the run's {' and '.join(extra)} values)" if extra else ""
    return f"tokcap {command} {where}{also}"


def masked_line(line: int, rollout_id: str | None, reason: str | None) -> str:
    """How logs name one masked rollout: its input line, its id, its one reason."""
    named = f" (rollout {rollout_id})" if rollout_id else ""
    return f"line {line}{named} masked: {reason or 'masked'}"


def reason_category(reason: str | None) -> str:
    """Group mask reasons by their leading phrase: exception names, ids and details dropped.

    `CaptureRetiredError: rollout 7-0 was already retired after ... (snapshot ...)` groups as
    `was already retired after ...`; `capture incomplete: lost call` as `capture incomplete`;
    a parenthesised detail (a snapshot id, the counts that failed) is dropped, and so is a
    list of call ids inside the phrase (`calls ['c3'] extend ...` groups as `calls extend ...`).
    A reason of an infrastructure kind (version skew, an unreadable store) groups as that
    kind's title, so a fleet-wide failure is one line of the summary.
    """
    if not reason:
        return "masked"
    infrastructure = infrastructure_kind(reason)
    if infrastructure is not None:  # one category, not one per rollout or object it names
        return infrastructure.title
    text = reason.strip()
    name, sep, rest = text.partition(": ")
    if sep and rest and name.isidentifier() and name.endswith("Error"):
        text = rest
    text = re.sub(r"^rollout \S+ ", "", text)
    text = re.sub(r" \[[^\]]*\](?= \w)", "", text)
    head = re.split(r": | \[| \(|; ", text, maxsplit=1)[0].strip()
    return head[:80] or "masked"


MAX_LISTED = 50
TOP_ABSTENTIONS = 5


def is_malformed(line: LedgerLine) -> bool:
    """An input line that yielded no record and no rollout id: unreadable, not a rollout
    (a line the run never started is not malformed)."""
    return not line.finalized and line.rollout_id is None and not line.not_started


def retirement_failed(line: LedgerLine) -> bool:
    """A handed-off rollout whose retirement was due but failed: its run is not complete.

    A handed-off line carries an error only when its retirement failed; a capture kept
    deliberately (`kept`) and a retired one are complete.
    """
    return line.handed_off and not line.retired and not line.kept and line.error is not None


def only_malformed_left(ledger: list[LedgerLine]) -> list[LedgerLine]:
    """The run's malformed lines when they alone keep it from completing (every other line
    handed off, none with a failed retirement); empty otherwise, since a re-run can still
    hand off or retire the rest and the run is not bound to its input changing."""
    bad = [line for line in ledger if is_malformed(line)]
    rest = [line for line in ledger if not is_malformed(line)]
    if any(not line.handed_off or retirement_failed(line) for line in rest):
        return []
    return bad


def _by_count(counts: Counter) -> dict[str, int]:
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def summarize(run_id: str, ledger: list[LedgerLine]) -> RunSummary:
    """Counts and mask reasons of a run, from its ledger; the first malformed lines' errors.

    Terminal attribution: rollouts per method (`none` when unattributed; ledgers written
    before it was named say `""`) and the most frequent abstention reasons of the witnesses.
    """
    masked = [line for line in ledger if line.masked and line.finalized]
    reasons = Counter(reason_category(line.mask_reason) for line in masked)
    malformed = [line for line in ledger if is_malformed(line)]
    built = [line for line in ledger if line.terminal_method is not None]
    methods = Counter(line.terminal_method or UNATTRIBUTED for line in built)
    abstentions = Counter(code for line in built for code in line.terminal_abstentions)
    return RunSummary(
        run_id=run_id,
        rollouts=len(ledger),
        finalized=sum(1 for line in ledger if line.finalized),
        masked=len(masked),
        mask_reasons=_by_count(reasons),
        handed_off=sum(1 for line in ledger if line.handed_off),
        already_handed_off=sum(1 for line in ledger if line.handed_off and line.earlier),
        retired=sum(1 for line in ledger if line.retired),
        retire_failed=sum(map(retirement_failed, ledger)),
        failed=sum(
            1 for line in ledger if line.finalized and not line.handed_off and not line.gated
        ),
        gated=sum(1 for line in ledger if line.gated),
        not_started=sum(1 for line in ledger if line.not_started),
        malformed_lines=len(malformed),
        malformed_line_errors=[
            line.error or f"line {line.line}: unreadable" for line in malformed[:MAX_LISTED]
        ],
        duplicate_lines=sum(1 for line in ledger if not line.finalized and line.rollout_id),
        terminal_methods=_by_count(methods),
        terminal_abstentions=dict(list(_by_count(abstentions).items())[:TOP_ABSTENTIONS]),
        awaiting_consumer=sum(1 for line in ledger if line.awaiting_consumer and not line.retired),
        traces=sum(line.traces or 0 for line in ledger if line.handed_off),
        owned_calls=sum(line.owned_calls or 0 for line in ledger if line.handed_off),
        tokens_trained=sum(line.tokens_trained or 0 for line in ledger if line.handed_off),
        weight_versions=versions.tally_versions(ledger),
    )


def locate(summary: RunSummary, dest: str) -> RunSummary:
    """Fill in where the run's records and ledger are at `dest`."""
    summary.records_prefix = run_location(dest, summary.run_id, RECORDS) + "/"
    summary.ledger = run_location(dest, summary.run_id, LEDGER)
    return summary


def trace_counts(summary: RunSummary) -> list[tuple[str, object]]:
    """The delivery and, for `all_traces`, what the handed-off envelopes train (else none)."""
    if summary.delivery == MAIN_CHAIN:
        return []
    return [
        ("delivery", summary.delivery),
        ("training traces (rows)", summary.traces),
        ("calls owned", summary.owned_calls),
        ("tokens trained", summary.tokens_trained),
    ]


def stopped_counts(summary: RunSummary) -> list[tuple[str, int]]:
    """The lines a stopped run left: gated and never started (none for a run that ran on)."""
    counts = [
        ("not handed off (mask gate)", summary.gated),
        ("not started (run stopped)", summary.not_started),
    ]
    return [(name, value) for name, value in counts if value]


def terminal_words(summary: RunSummary) -> str:
    """`the scored call was named by content in 6 rollouts; ...`: attribution in words."""
    named = ", ".join(f"{method} in {n}" for method, n in summary.terminal_methods.items())
    text = f"the scored call was named by {named}"
    if summary.terminal_abstentions:
        code, count = next(iter(summary.terminal_abstentions.items()))
        text += f"; most frequent abstention: {abstention_words(code)} ({count})"
    return text


def summary_table(summary: RunSummary) -> list[dict[str, object]]:
    return [
        *({"metric": name, "value": value} for name, value in trace_counts(summary)),
        {"metric": "rollouts", "value": summary.rollouts},
        {"metric": "handed off", "value": summary.handed_off},
        {"metric": "already handed off (earlier run)", "value": summary.already_handed_off},
        {"metric": "masked", "value": summary.masked},
        *(
            {"metric": f"masked: {kind.title}", "value": n}
            for kind, n in kinds_of(summary.mask_reasons)
        ),
        {"metric": "mask rate", "value": mask_rate_line(summary)},
        {"metric": "retired", "value": summary.retired},
        {"metric": "retirement failed", "value": summary.retire_failed},
        {"metric": "failed", "value": summary.failed},
        *({"metric": name, "value": value} for name, value in stopped_counts(summary)),
        {"metric": "malformed input lines", "value": summary.malformed_lines},
        {"metric": "duplicate rollout id lines", "value": summary.duplicate_lines},
        *(
            {"metric": f"terminal attributed by: {k}", "value": v}
            for k, v in summary.terminal_methods.items()
        ),
        *(
            {"metric": f"terminal abstention: {k}", "value": v}
            for k, v in summary.terminal_abstentions.items()
        ),
        *versions.version_table(summary.weight_versions),
    ]


def spans(numbers: list[int], most: int = 10) -> str:
    """`1-6, 9`: numbers as runs of consecutive ones (the first `most` runs)."""
    runs: list[list[int]] = []
    for n in sorted(set(numbers)):
        if runs and n == runs[-1][-1] + 1:
            runs[-1].append(n)
        else:
            runs.append([n])
    text = ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs[:most])
    return text + (", ..." if len(runs) > most else "")
