"""What an operator is told about a run: one state word, the exit code, and a command only
when nothing else will act.

The destination says what a run handed off; the Prefect API says whether anything still
acts on it: a flow run running now (its last heartbeat), one scheduled or waiting for a
worker, or a retrigger; the inbox claims on a run's file say whether a pass holds it or all
its attempts ended. `decide` joins them, so `tokcap status` and `tokcap runs` use the same
word for the same run; `judge` reads the destination again before calling a person, since
a run may complete while the API is read. Exit 3 only while something will act: the shipped
automations count only within their window, and only for runs of tokcap's deployments.
Without the API a run that has not ended cannot be told live or dead: it is `interrupted`,
and the reason says the API could not tell (retriggering a live run is safe; waiting
forever on a dead one is not).
This module does not import Prefect.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Literal

from pydantic import BaseModel, Field

RunState = Literal[
    "queued",
    "running",
    "retrigger-scheduled",
    "retriggering",
    "needs-attention",
    "interrupted",
    "failed",
    "complete",
]
EXIT_CODES: dict[str, int] = {
    "complete": 0,
    "queued": 3,
    "running": 3,
    "retrigger-scheduled": 3,
    "retriggering": 3,
    "failed": 1,
    "needs-attention": 1,
    "interrupted": 1,
}
"""0: complete; 3: something will still act (wait); 1: only a person can (act). 2 is a bad
argument, never a state."""

DestState = Literal["absent", "placed", "started", "failed", "ok"]
"""The destination's view: no manifest (`absent`; `placed` when the run's file waits in the
inbox), a manifest without a ledger that covers the receipts (`started`), or a ledger that
shows a failure (`failed`) or none (`ok`)."""

RETRIGGER_FLOW = "retrigger-failed"
NEEDS_ATTENTION = "NeedsAttention"
SILENCE_SECONDS = 90.0
"""A flow run silent (no heartbeat, no start) this long is taken as dead: the shipped
automation marks such a run Crashed after the same 90 s."""
WAITING_TYPES = frozenset({"SCHEDULED", "PENDING", "PAUSED"})
LIVE_TYPES = frozenset({"RUNNING", "CANCELLING"})
RETRIGGERED_TYPES = frozenset({"FAILED", "CRASHED"})
MARK_SECONDS = 60.0
"""How long after a run of a tokcap deployment is marked Failed or Crashed (or after it
went silent past `SILENCE_SECONDS`) the shipped automations are expected to have acted."""
LATE_SECONDS = 120.0
"""A Scheduled retrigger this far past its start time was taken by no worker."""
AUTOMATION_ACTS = "the shipped automation retriggers it (expected within a minute)"


class FlowRunFact(BaseModel):
    """One flow run behind a tokcap run, as the Prefect API records it."""

    id: str
    name: str
    flow: str
    state_type: str
    """Prefect's state type: SCHEDULED, PENDING, RUNNING, COMPLETED, FAILED, CRASHED, ..."""
    state_name: str
    message: str = ""
    expected_start: float | None = None
    """When a scheduled run is due to start (epoch seconds)."""
    last_sign: float | None = None
    """Its last heartbeat, else its start (epoch seconds)."""
    updated: float = 0.0
    """When its state was last set, to order the ended runs."""
    automated: bool = False
    """A run of a tokcap-tagged deployment: the shipped automations act on it (a run the
    CLI started has no deployment, and no automation retriggers it)."""
    pool: str = ""
    """The work pool a deployment's run waits in."""


class ClaimFacts(BaseModel):
    """The inbox claims (attempts) on a run's file, as its destination records them:
    `holder` and `renewed_at` name the latest claim while it is live."""

    attempts: int = 0
    holder: str | None = None
    renewed_at: float | None = None
    max_attempts: int | None = None
    """The limit the latest claim's pass gives the file up at (`None`: not recorded)."""


class FlowFacts(BaseModel):
    """What the Prefect API knows of a run: `reachable` False (with `why_not`) when it could
    not be asked; otherwise its flow runs and whether a submit event announced its file."""

    reachable: bool
    why_not: str = ""
    runs: list[FlowRunFact] = Field(default_factory=list)
    announced: bool = False


class Verdict(BaseModel):
    """The run's state, exit code, the reason in words, whether a person must act (the
    caller then names the command that completes the run) and the flow run it rests on."""

    state: RunState
    exit_code: int
    reason: str
    act: bool
    flow_run: FlowRunFact | None = None


def _verdict(state: RunState, reason: str, run: FlowRunFact | None = None) -> Verdict:
    code = EXIT_CODES[state]
    return Verdict(state=state, exit_code=code, reason=reason, act=code == 1, flow_run=run)


def _ago(at: float | None, now: float) -> str:
    return "never" if at is None else f"{max(0, round(now - at))} s ago"


def _when(at: float | None, now: float) -> str:
    if at is None:
        return "as soon as a worker is free"
    clock = time.strftime("%H:%M:%S UTC", time.gmtime(at))
    return f"at {clock} (in {max(0, round(at - now))} s)" if at > now else f"now (due {clock})"


def _named(run: FlowRunFact) -> str:
    return f"flow run {run.name!r} ({run.id})"


def is_silent(run: FlowRunFact, now: float) -> bool:
    """Whether a running flow run sent no heartbeat for `SILENCE_SECONDS`: its process died."""
    return run.last_sign is not None and now - run.last_sign > SILENCE_SECONDS


def live_verdict(facts: FlowFacts, now: float) -> Verdict | None:
    """The state a flow run still acting gives the run, or `None` when none acts."""
    running = [r for r in facts.runs if r.state_type in LIVE_TYPES and not is_silent(r, now)]
    waiting = [r for r in facts.runs if r.state_type in WAITING_TYPES]
    for run in sorted(running, key=lambda r: r.flow != RETRIGGER_FLOW):
        word: RunState = "retriggering" if run.flow == RETRIGGER_FLOW else "running"
        return _verdict(
            word, f"{_named(run)} is running, last heartbeat {_ago(run.last_sign, now)}", run
        )
    for run in sorted(waiting, key=lambda r: (r.flow != RETRIGGER_FLOW, r.expected_start or 0)):
        return _waiting_verdict(run, now)
    return None


def _waiting_verdict(run: FlowRunFact, now: float) -> Verdict:
    """A flow run not started: paused (a person resumes it), a retrigger no worker took
    past its start time, a retrigger scheduled, or a run waiting for a worker."""
    if run.state_type == "PAUSED":
        reason = (
            f"{_named(run)} is paused ({run.state_name}): resume it in the Prefect UI, or "
            f"cancel it (prefect flow-run cancel {run.id}) and complete the run"
        )
        return _verdict("needs-attention", reason, run)
    late = run.expected_start is not None and now - run.expected_start > LATE_SECONDS
    if run.flow == RETRIGGER_FLOW and run.state_type == "SCHEDULED" and late:
        pool = f" --pool {run.pool}" if run.pool else ""
        reason = (
            f"its retrigger, {_named(run)}, was due {_ago(run.expected_start, now)} and no "
            f"worker has taken it: if none runs, start one with `prefect worker start{pool}`"
        )
        return _verdict("needs-attention", reason, run)
    if run.flow == RETRIGGER_FLOW:
        reason = f"its retrigger, {_named(run)}, starts {_when(run.expected_start, now)}"
        return _verdict("retrigger-scheduled", reason, run)
    reason = f"{_named(run)} is {run.state_name}, waiting for a worker"
    return _verdict("queued", reason, run)


def automation_verdict(facts: FlowFacts, now: float) -> Verdict | None:
    """`retrigger-scheduled` while the shipped automations are about to act on a run of a
    tokcap deployment: it went silent under `SILENCE_SECONDS + MARK_SECONDS` ago (it is
    marked Crashed, then retriggered), or was marked Failed or Crashed under `MARK_SECONDS`
    ago (the retrigger is being scheduled). `None` otherwise, and for runs the CLI started."""
    for run in facts.runs:
        silent_for = now - run.last_sign if run.last_sign is not None else None
        dying = run.state_type in LIVE_TYPES and silent_for is not None
        if run.automated and dying and silent_for < SILENCE_SECONDS + MARK_SECONDS:
            return _verdict("retrigger-scheduled", f"{_named(run)}: {AUTOMATION_ACTS}", run)
    last = ended_run(facts)
    if (
        last is not None
        and last.automated
        and last.state_type in RETRIGGERED_TYPES
        and last.state_name != NEEDS_ATTENTION
        and now - last.updated < MARK_SECONDS
    ):
        why = f"{_named(last)} ended {last.state_name} {_ago(last.updated, now)}: "
        return _verdict("retrigger-scheduled", why + AUTOMATION_ACTS, last)
    return None


def claim_verdict(facts: FlowFacts, claims: ClaimFacts | None, now: float) -> Verdict | None:
    """`running` when the file's claim was renewed after Prefect last took its flow run
    for dead (marked Crashed or Failed, or silent past `SILENCE_SECONDS`): its holder is
    alive (heartbeats lost while the API restarted, a paused process woken late)."""
    if claims is None or claims.holder is None or claims.renewed_at is None:
        return None
    marks = [r.updated for r in facts.runs if r.state_type in RETRIGGERED_TYPES]
    marks += [
        r.last_sign + SILENCE_SECONDS
        for r in facts.runs
        if r.state_type in LIVE_TYPES and r.last_sign is not None and is_silent(r, now)
    ]
    if not marks or claims.renewed_at <= max(marks):
        return None
    reason = (
        f"{claims.holder} holds its inbox file and renewed its claim "
        f"{_ago(claims.renewed_at, now)}, after Prefect took its flow run for dead"
    )
    return _verdict("running", reason)


def ended_run(facts: FlowFacts) -> FlowRunFact | None:
    """The flow run that acted last, among those that no longer act."""
    ended = [r for r in facts.runs if r.state_type not in WAITING_TYPES | LIVE_TYPES]
    return max(ended, key=lambda r: r.updated) if ended else None


def decide(
    dest: DestState,
    facts: FlowFacts | None,
    now: float | None = None,
    claims: ClaimFacts | None = None,
) -> Verdict | None:
    """The run's verdict from its destination (`dest`), its flow runs (`facts`, `None`
    when no `PREFECT_API_URL` is set) and its inbox claims (`claims`, `None` when not read);
    `None` for a run nothing knows (a bad run id)."""
    now = time.time() if now is None else now
    if dest == "ok":
        return _verdict("complete", "every rollout handed off")
    if facts is not None and facts.reachable:
        acting = (
            live_verdict(facts, now)
            or claim_verdict(facts, claims, now)
            or _attention_verdict(facts)
            or automation_verdict(facts, now)
        )
        if acting is not None:
            return acting
    return _dest_verdict(dest, facts, claims)


def is_settled(verdict: Verdict | None) -> bool:
    """Whether the verdict is complete or something still acts: only a verdict that calls
    a person is worth re-reading the destination for (the run may have completed since)."""
    return verdict is None or verdict.exit_code != 1


def judge(
    read_dest: Callable[[], DestState],
    read_facts: Callable[[], FlowFacts | None],
    claims: ClaimFacts | None = None,
    now: float | None = None,
) -> Verdict | None:
    """`decide` on the destination read first, then the flow runs; when that calls a person,
    on the destination read again: a run whose flow wrote its ledger and ended between the
    two reads is complete, not interrupted (a destination only moves toward complete)."""
    dest = read_dest()
    if dest == "ok":
        return decide(dest, None, now, claims)
    facts = read_facts()
    verdict = decide(dest, facts, now, claims)
    if is_settled(verdict):
        return verdict
    return decide(read_dest(), facts, now, claims) or verdict


def _attention_verdict(facts: FlowFacts) -> Verdict | None:
    last = ended_run(facts)
    if last is None or last.state_name != NEEDS_ATTENTION:
        return None
    why = f"{_named(last)} ended {NEEDS_ATTENTION}: {last.message}".rstrip(": ")
    return _verdict("needs-attention", why, last)


def _dest_verdict(
    dest: DestState, facts: FlowFacts | None, claims: ClaimFacts | None
) -> Verdict | None:
    """The verdict when no flow run acts on the run (or the API could not be asked)."""
    told = facts is not None and facts.reachable
    if dest in ("absent", "placed") and claims is not None and claims.attempts:
        return _claims_verdict(claims)
    if dest == "failed":
        return _verdict("failed", "its ledger shows rollouts not handed off")
    if dest == "started" or (dest == "absent" and told and facts and facts.runs):
        reason = f"could not tell whether it is live: {_why_not(facts)}"
        if told:
            reason = f"stopped, and nothing is scheduled to complete it{_silent_note(facts)}"
        return _verdict("interrupted", reason)
    if dest == "placed" or (facts is not None and facts.announced):
        announced = facts is not None and facts.announced
        how = "placed in the inbox and announced" if announced else "placed in the inbox"
        then = "waiting for a worker" if announced else "the inbox's next pass takes it"
        unasked = (
            "" if told else f"; could not ask Prefect whether a run took it: {_why_not(facts)}"
        )
        return _verdict("queued", f"file {how}, not started: {then}{unasked}")
    return None


def _claims_verdict(claims: ClaimFacts) -> Verdict:
    """No manifest, but inbox passes claimed the file: one starting it (`queued`), or
    attempts that all ended before the run recorded its manifest (`needs-attention`)."""
    if claims.holder is not None:
        reason = f"{claims.holder} claimed its inbox file and is starting the run"
        return _verdict("queued", reason)
    if claims.max_attempts is not None and claims.attempts < claims.max_attempts:
        reason = (
            f"{claims.attempts} of {claims.max_attempts} inbox attempts on its file ended before "
            f"the run started (no manifest): the inbox's next pass tries it again"
        )
        return _verdict("queued", reason)
    reason = (
        f"{claims.attempts} inbox attempt(s) on its file ended before the run started (no "
        "manifest); the inbox gives a file up after its max_attempts. Read the attempts' "
        "flow-run logs (prefect flow-run ls --flow-name finalize-inbox-file), fix the cause, "
        "then finalize the file as a new run (a new file name in the inbox, or tokcap "
        "finalize with a new --run-id)"
    )
    return _verdict("needs-attention", reason)


def fix_input_advice(run_id: str) -> str:
    """What completes a run whose only shortfall is malformed input lines: a retrigger reads
    the same input and fails the same way (`tokcap retrigger` says so too)."""
    return (
        "Fix or remove those lines and finalize them as a new run (a new file name in the "
        f"inbox, or tokcap finalize with a new --run-id); the other lines of run {run_id} are "
        "handed off already"
    )


def _silent_note(facts: FlowFacts | None) -> str:
    """A note naming a flow run Prefect still shows Running although it went silent."""
    silent = [r for r in facts.runs if r.state_type in LIVE_TYPES] if facts else []
    if not silent:
        return ""
    return (
        f" ({_named(silent[0])} is still Running in Prefect but sent no heartbeat for over "
        f"{SILENCE_SECONDS:.0f} s: its process is gone)"
    )


def _why_not(facts: FlowFacts | None) -> str:
    if facts is None:
        return "no PREFECT_API_URL is set"
    return facts.why_not or "the Prefect API did not answer"
