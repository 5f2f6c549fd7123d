"""What a retrigger sees of a file's claim: who holds it until when, and what it then does."""

from __future__ import annotations

from capture_core.run.inbox import held_claim, release_claim, renew_claim, take_claim
from capture_core.storage import open_byte_store
from tokcap.flows.retrigger_deferral import claim_plan

LEASE = 30.0


def test_a_live_claim_lapses_one_lease_after_its_last_renewal(tmp_path) -> None:
    dest = open_byte_store(str(tmp_path / "dest"))
    assert held_claim(dest, "run-a", now=100.0) is None, "nothing holds an unclaimed file"
    claim = take_claim(dest, "run-a", "pass 1", "t1", LEASE, 3, now=100.0).claim
    assert claim is not None
    seen = held_claim(dest, "run-a", now=110.0)
    assert seen is not None and (seen.number, seen.owner) == (0, "pass 1")
    assert seen.lapses_at == 130.0
    renew_claim(dest, claim, now=120.0)
    renewed = held_claim(dest, "run-a", now=125.0)
    assert renewed is not None and renewed.lapses_at == 150.0
    assert renewed.key != seen.key, "a renewal shows in the key"
    assert held_claim(dest, "run-a", now=150.0) is None, "lapsed"
    release_claim(dest, claim, ok=False)
    assert held_claim(dest, "run-a", now=125.0) is None, "released"


def test_a_retrigger_defers_once_and_leaves_a_renewed_claim_to_its_holder(tmp_path) -> None:
    dest = open_byte_store(str(tmp_path / "dest"))
    claim = take_claim(dest, "run-b", "pass 1", "t1", LEASE, 3, now=100.0).claim
    assert claim is not None
    seen = held_claim(dest, "run-b", now=110.0)
    assert seen is not None
    assert claim_plan(None, None) == "run"
    assert claim_plan(seen, None) == "defer"
    assert claim_plan(seen, seen.key) == "outwait", "not lapsed yet: the seconds left"
    renew_claim(dest, claim, now=125.0)
    renewed = held_claim(dest, "run-b", now=126.0)
    assert claim_plan(renewed, seen.key) == "run", "a live holder renewed it: never deferred again"
    assert claim_plan(None, seen.key) == "run"
