"""Inbox bookkeeping: which rollout files are finalized, and which inbox pass holds each one.

A file's run id is derived from its name and full URL, so each file maps to one run.
A run is complete when its ledger shows every rollout handed off and retired (or kept on
purpose), no unreadable line, and no capture waiting for a row consumer's acknowledgement.
A file whose content is not the one its run's manifest records (re-published under the
same name) is never done: the pass refuses it by name.
Each attempt is a numbered create-only claim, so of two passes racing for a file one wins.
A claim lives while its holder renews it; a holder that died loses it after its lease.
Claim times are wall-clock seconds, so leases must exceed the clock skew between machines.
A holder checks its claim before each write that decides its run's state (`check_claim`).
A retrigger waits out a claim whose holder stopped renewing it, and leaves a renewed one.
This module does not import Prefect.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Literal

from pydantic import BaseModel

from capture_core.errors import ClaimLostError, UnreadableManifestError
from capture_core.run.rollout_io import file_fingerprint, file_sha256
from capture_core.run.run_layout import RunLayout
from capture_core.storage import ByteStore, open_byte_store

logger = logging.getLogger(__name__)

RENEWALS_PER_LEASE = 4  # `keep_claim` renews a claim every quarter of its lease
MIN_CLAIM_LEASE_SECONDS = 10.0
"""The shortest lease a claim may have: a renewal is due every quarter lease and must land
(a store write, with its retries on a loaded machine) within the three quarters left, and
the lapse must outlast the clock skew between machines; shorter leases let a live pass lose
its file, so two passes could finalize one file at once."""


def run_id_for_file(url: str) -> str:
    """A valid, stable run id: the file's stem plus a digest of its full URL."""
    stem = url.rstrip("/").rsplit("/", 1)[-1].rsplit(".", 1)[0]
    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", stem).strip("-._")[:80] or "rollouts"
    return f"{safe}-{hashlib.sha256(url.encode()).hexdigest()[:10]}"


class InboxEntry(BaseModel):
    """A rollout file of the inbox, by URL, and the run it is finalized into."""

    url: str
    run_id: str


def replaced_file(
    dest: ByteStore, run_id: str, url: str, storage_options: Mapping[str, Any] | None = None
) -> str | None:
    """Why the file at `url` is not the input its run recorded (or cannot be shown to be: its
    manifest is unreadable), or `None` when it is (or the run has not started).

    A file re-published under its name maps to the same run id; its run must never call it
    done. The file is read in full only under a fingerprint not seen with the recorded digest
    (the manifest's, or the last one found to match, which is then remembered).
    """
    layout = RunLayout(dest, run_id)
    try:
        manifest = layout.read_manifest()
    except UnreadableManifestError as exc:  # its input cannot be told: refused, by name
        return str(exc)
    if manifest is None:
        return None
    recorded = manifest.rollouts_sha256
    try:
        fingerprint = file_fingerprint(url, storage_options)
        known = (manifest.rollouts_fingerprint, layout.read_input_seen(recorded))
        if fingerprint is not None and fingerprint in known:
            return None
        digest = file_sha256(url, storage_options)
    except FileNotFoundError:  # it left the inbox since it was listed: nothing to refuse
        return None
    if digest == recorded:
        if fingerprint is not None:
            layout.record_input_seen(fingerprint, digest)
        return None
    return (
        f"{url} was replaced after run {run_id} started on it: the file's sha256 is now "
        f"{digest[:12]}, the run recorded {recorded[:12]}. The inbox finalizes "
        "one content per file name, so nothing of the new content was finalized. Publish new "
        "rollouts under a new file name, then move this file out of the inbox or restore its "
        "recorded content"
    )


class Claim(BaseModel):
    """One inbox pass's hold on one file: attempt `number` of run `run_id`."""

    run_id: str
    number: int
    owner: str
    token: str
    lease_seconds: float
    claimed_at: float
    max_attempts: int | None = None
    """The attempts the claiming pass allows the file before giving it up; `None` on claims
    recorded before the limit was, so a reader cannot tell whether another pass will come."""


class ClaimDecision(BaseModel):
    """What `take_claim` decided for a file.

    `claimed`: this pass holds `claim` and must finalize the file, then `release_claim`.
    `held`: another live pass (`held_by`) holds it; leave the file to that pass.
    `done`: the run completed meanwhile (judged by the caller after claiming, from the run's
    report: the claim is then released as ended). `given_up`: `attempts` reached the limit.
    """

    status: Literal["claimed", "held", "done", "given_up"]
    attempts: int
    claim: Claim | None = None
    held_by: str | None = None


def claim_numbers(dest: ByteStore, run_id: str) -> list[int]:
    """The numbers of every claim (attempt) made on a run, ascending."""
    return RunLayout(dest, run_id).attempt_numbers()


def attempts(dest: ByteStore, run_id: str) -> int:
    """How many passes have claimed this run's file so far."""
    return len(claim_numbers(dest, run_id))


def read_claim(dest: ByteStore, run_id: str, number: int) -> Claim | None:
    body = RunLayout(dest, run_id).read_attempt(number, "claim")
    return None if body is None else Claim.model_validate(body)


def claim_is_live(dest: ByteStore, claim: Claim, now: float) -> bool:
    """Whether the claim is unreleased and renewed within its lease."""
    layout = RunLayout(dest, claim.run_id)
    if dest.exists(layout.attempt_key(claim.number, "end")):
        return False
    beat = layout.read_attempt(claim.number, "beat")
    last = max(claim.claimed_at, beat["at"] if beat else 0.0)
    return now - last < claim.lease_seconds


def take_claim(
    dest: ByteStore,
    run_id: str,
    owner: str,
    token: str,
    lease_seconds: float,
    max_attempts: int,
    now: float | None = None,
) -> ClaimDecision:
    """Claim the next attempt on a run unless a live claim holds it or attempts ran out.

    The claim is created create-only, so of passes racing for one number exactly one wins.
    Repeating the call with the same `token` (a retry after a lost reply) finds its own claim.
    """
    now = time.time() if now is None else now
    numbers = claim_numbers(dest, run_id)
    if numbers:
        last = read_claim(dest, run_id, numbers[-1])
        if last is not None and last.token == token:
            return ClaimDecision(status="claimed", attempts=len(numbers), claim=last)
        if last is not None and claim_is_live(dest, last, now):
            return ClaimDecision(status="held", attempts=len(numbers), held_by=last.owner)
    if len(numbers) >= max_attempts:
        return ClaimDecision(status="given_up", attempts=len(numbers))
    claim = Claim(
        run_id=run_id,
        number=numbers[-1] + 1 if numbers else 0,
        owner=owner,
        token=token,
        lease_seconds=lease_seconds,
        claimed_at=now,
        max_attempts=max_attempts,
    )
    if not RunLayout(dest, run_id).create_attempt(claim.number, "claim", claim.model_dump()):
        winner = read_claim(dest, run_id, claim.number)
        if winner is None or winner.token != token:
            return ClaimDecision(
                status="held",
                attempts=claim.number + 1,
                held_by=winner.owner if winner else "an unreadable claim",
            )
    return ClaimDecision(status="claimed", attempts=claim.number + 1, claim=claim)


class HeldClaim(BaseModel):
    """The live claim a run's file is held by: its attempt, holder, last renewal and lapse.

    `key` names this claim as last renewed, so whoever saw it can tell later, by content and
    never by clock, whether it was renewed (or replaced) since.
    """

    number: int
    owner: str
    renewed_at: float
    lapses_at: float
    end_key: str = ""
    """The marker under the destination that ends this claim, as its holder's release does."""

    @property
    def key(self) -> str:
        return f"attempt-{self.number}-renewed-{self.renewed_at!r}"


def held_claim(dest: ByteStore, run_id: str, now: float | None = None) -> HeldClaim | None:
    """The run's latest claim while it is live (unreleased, renewed within its lease), with
    when it lapses unless renewed; `None` when nothing holds the file."""
    numbers = claim_numbers(dest, run_id)
    claim = read_claim(dest, run_id, numbers[-1]) if numbers else None
    if claim is None or not claim_is_live(dest, claim, time.time() if now is None else now):
        return None
    beat = RunLayout(dest, run_id).read_attempt(claim.number, "beat")
    renewed = max(claim.claimed_at, beat["at"] if beat else 0.0)
    return HeldClaim(
        number=claim.number,
        owner=claim.owner,
        renewed_at=renewed,
        lapses_at=renewed + claim.lease_seconds,
        end_key=RunLayout(dest, run_id).attempt_key(claim.number, "end"),
    )


def outwait_silent_claim(
    dest: ByteStore,
    run_id: str,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> bool:
    """Wait while the run's latest claim stays live and unrenewed; whether it lapsed or ended.

    A holder that died (a killed worker) renews nothing more: its claim lapses within one
    lease of its last renewal, and this returns `True`, so the caller may take the file over.
    A renewal, or a newer claim, while waiting shows a live pass: `False`, leave it the file.
    Renewals are compared by content, never by clock, so clock skew only moves the lapse.
    """
    layout = RunLayout(dest, run_id)
    numbers = layout.attempt_numbers()
    claim = read_claim(dest, run_id, numbers[-1]) if numbers else None
    if claim is None:
        return True
    beat = layout.read_attempt(claim.number, "beat")
    poll = min(10.0, max(1.0, claim.lease_seconds / 20))
    while claim_is_live(dest, claim, clock()):
        sleep(poll)
        renewed = layout.read_attempt(claim.number, "beat") != beat
        if renewed or layout.attempt_numbers()[-1] != claim.number:
            return False
    return True


def check_claim(dest: ByteStore, claim: Claim, now: float | None = None) -> None:
    """Raise `ClaimLostError` unless `claim` is the run's latest claim, unreleased and live.

    A holder checks this before each write that decides the run's state, so a pass that was
    paused past its lease and resumed never overwrites what the pass that took over wrote.
    """
    numbers = claim_numbers(dest, claim.run_id)
    latest = read_claim(dest, claim.run_id, numbers[-1]) if numbers else None
    if latest is None or latest.number != claim.number or latest.token != claim.token:
        holder = f"attempt {latest.number + 1} ({latest.owner})" if latest else "nobody"
        reason = f"it is now held by {holder}"
    elif not claim_is_live(dest, claim, time.time() if now is None else now):
        reason = "it ended or its lease lapsed"
    else:
        return
    raise ClaimLostError(
        f"run {claim.run_id}: this pass (attempt {claim.number + 1}, {claim.owner}) lost its "
        f"claim: {reason}. It stopped without writing anything more under the run; the pass "
        "that holds the claim finishes it"
    )


def renew_claim(dest: ByteStore, claim: Claim, now: float | None = None) -> None:
    """Extend the claim's lease from now."""
    at = time.time() if now is None else now
    RunLayout(dest, claim.run_id).replace_attempt(claim.number, "beat", {"at": at})


def release_claim(dest: ByteStore, claim: Claim, ok: bool) -> None:
    """End the claim, so the next pass need not wait for its lease to lapse."""
    body = {"owner": claim.owner, "ok": ok, "at": time.time()}
    RunLayout(dest, claim.run_id).create_attempt(claim.number, "end", body)


@contextmanager
def keep_claim(
    dest: str, claim: Claim, storage_options: Mapping[str, Any] | None = None
) -> Iterator[None]:
    """Renew the claim from a background thread, four times per lease, while the body runs.

    A renewal that fails is logged and retried at the next beat; a holder whose renewals
    keep failing for a whole lease may lose the file to another pass.
    """
    store = open_byte_store(dest, storage_options)
    stop = threading.Event()
    interval = claim.lease_seconds / RENEWALS_PER_LEASE

    def beat() -> None:
        while not stop.wait(interval):
            try:
                renew_claim(store, claim)
            except Exception as exc:
                logger.warning("could not renew the claim on run %s: %s", claim.run_id, exc)

    thread = threading.Thread(target=beat, name=f"claim-{claim.run_id}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=max(5.0, interval))
        store.close()
