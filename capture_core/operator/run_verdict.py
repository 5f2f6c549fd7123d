"""What an operator is told about a run: one state word, the exit code, and a command only
when nothing else will act.

The destination says what a run handed off; the Prefect API says whether anything still
acts on it: a flow run running now (its last heartbeat), one scheduled or waiting for a
worker, or a retrigger. `decide` joins the two, so `tokcap status` and `tokcap runs` use the
same word for the same run. Without the API a run that has not ended cannot be told live
or dead: it is `interrupted`, and the reason says the API could not tell (retriggering a
live run is safe; waiting forever on a dead one is not).
This module does not import Prefect.
"""

from __future__ import annotations

import time
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
        if run.flow == RETRIGGER_FLOW:
            reason = f"its retrigger, {_named(run)}, starts {_when(run.expected_start, now)}"
            return _verdict("retrigger-scheduled", reason, run)
        reason = f"{_named(run)} is {run.state_name}, waiting for a worker"
        return _verdict("queued", reason, run)
    return None


def ended_run(facts: FlowFacts) -> FlowRunFact | None:
    """The flow run that acted last, among those that no longer act."""
    ended = [r for r in facts.runs if r.state_type not in WAITING_TYPES | LIVE_TYPES]
    return max(ended, key=lambda r: r.updated) if ended else None


def decide(dest: DestState, facts: FlowFacts | None, now: float | None = None) -> Verdict | None:
    """The run's verdict from its destination (`dest`) and its flow runs (`facts`, `None`
    when no `PREFECT_API_URL` is set); `None` for a run nothing knows (a bad run id)."""
    now = time.time() if now is None else now
    if dest == "ok":
        return _verdict("complete", "every rollout handed off")
    if facts is not None and facts.reachable:
        live = live_verdict(facts, now)
        if live is not None:
            return live
        last = ended_run(facts)
        if last is not None and last.state_name == NEEDS_ATTENTION:
            why = f"{_named(last)} ended {NEEDS_ATTENTION}: {last.message}".rstrip(": ")
            return _verdict("needs-attention", why, last)
    return _dest_verdict(dest, facts, now)


def _dest_verdict(dest: DestState, facts: FlowFacts | None, now: float) -> Verdict | None:
    """The verdict when no flow run acts on the run (or the API could not be asked)."""
    told = facts is not None and facts.reachable
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
