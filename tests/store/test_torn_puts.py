"""Local puts write their final name in place: a torn object is a lost call, never corruption.

A crash mid-put leaves an empty or cut-off entry. Freezing reads it as a call that was lost
(the rollout masks, its capture is kept); a retry of that call reports the loss; a failed
write removes its own torn object; prompts extending a parent are digested from its state.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from capture_core.consumer import trajectories_from_source
from capture_core.errors import CaptureConflictError
from capture_core.records import TokenEntry
from capture_core.store import TokenCaptureStore, compact
from capture_core.store import tokcap_writes as store_module
from capture_core.store.capture_layout import call_key
from tests.support.reliability_figures import record_case

pytestmark = pytest.mark.integrity

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def turns(rollout_id: str, count: int) -> list[TokenEntry]:
    prompt, out = [11, 12, 13], []
    for i in range(count):
        gen = [100 + i, 200 + i]
        out.append(
            TokenEntry(
                rollout_id=rollout_id,
                model_call_id=f"turn-{i}",
                prompt_token_ids=list(prompt),
                generation_token_ids=gen,
                generation_log_probs=[-0.5, -0.25],
            )
        )
        prompt = prompt + gen + [7]
    return out


def tear(root: str, rollout_id: str, call: str, keep: int | None) -> str:
    """Cut an entry's object to `keep` bytes (None: leave it empty), as a crash would."""
    path = os.path.join(root, rollout_id, "e", call_key(call))
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data[:keep] if keep is not None else b"")
    return path


@pytest.mark.parametrize("keep", [None, 40])
def test_a_torn_entry_is_a_lost_call_and_masks(tmp_path, keep: int | None) -> None:
    root = str(tmp_path)
    store = TokenCaptureStore(root)
    for item in turns("r1", 3):
        store.put_now(item)
    tear(root, "r1", "turn-1", keep)
    snapshot = TokenCaptureStore(root).freeze_now("r1")
    assert snapshot.incomplete
    assert [e.model_call_id for e in snapshot.entries] == ["turn-0"], "no call built on a hole"
    assert any("is torn" in r and "the call is lost" in r for r in snapshot.incomplete_reasons)
    built = asyncio_run(trajectories_from_source("r1", TokenCaptureStore(root)))
    assert built["mask_sample"] and built["metrics"]["capture_incomplete"], built
    assert "error" not in built, "an incomplete build is masked without an invented error"
    record_case("torn local put (crash mid-write)", records_lost=0, wrong_tokens_delivered=0)


def test_garbage_that_is_not_a_cut_off_object_is_still_corruption(tmp_path) -> None:
    for torn in (b"", b"\x00" * 16, b'{"c":', b'{"c":[1,2', b'{"c":[1,2\x00\x00'):
        assert compact.is_torn(torn), torn
    for damaged in (b"\x00not json", b"{not json", b'{"a": 1}', b'{"c":1x}'):
        assert not compact.is_torn(damaged), damaged


def test_retrying_a_call_whose_put_was_torn_reports_the_loss(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(store_module, "SETTLE_SECONDS", 0.2)
    root = str(tmp_path)
    store = TokenCaptureStore(root)
    first, second = turns("r1", 2)
    store.put_now(first)
    store.put_now(second)
    tear(root, "r1", "turn-1", 25)
    with pytest.raises(CaptureConflictError, match="was interrupted"):
        TokenCaptureStore(root).put_now(second)
    snapshot = TokenCaptureStore(root).freeze_now("r1")
    assert snapshot.incomplete and any("interrupted" in r for r in snapshot.incomplete_reasons)
    record_case("retry over a torn put reads as a success", records_lost=0)


FAIL_MID_WRITE = """
import os, resource, signal, sys
from capture_core.records import TokenEntry
from capture_core.store import TokenCaptureStore
store = TokenCaptureStore(sys.argv[1])
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, resource.RLIM_INFINITY))
try:
    store.put_now(TokenEntry(rollout_id="r1", model_call_id="big",
        prompt_token_ids=list(range(100_000)), generation_token_ids=[1],
        generation_log_probs=[-0.5]))
except OSError as exc:
    print("failed:", os.strerror(exc.errno))
"""


def test_a_failed_in_place_write_removes_its_torn_object(tmp_path) -> None:
    root = str(tmp_path)
    TokenCaptureStore(root).put_now(turns("r1", 1)[0])
    result = subprocess.run(
        [sys.executable, "-c", FAIL_MID_WRITE, root],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert result.stdout.strip() == "failed: File too large", result
    assert os.listdir(os.path.join(root, "r1", "e")) == [call_key("turn-0")]
    assert not TokenCaptureStore(root).freeze_now("r1").incomplete
    record_case("failed in-place write leaves a torn entry", records_lost=0)


def test_long_chain_stores_deltas_and_rebuilds_exactly(tmp_path) -> None:
    root = str(tmp_path)
    store = TokenCaptureStore(root)
    calls = turns("r1", 40)
    for item in calls:
        store.put_now(item)
    sizes = [
        os.path.getsize(os.path.join(root, "r1", "e", call_key(c.model_call_id))) for c in calls
    ]
    assert max(sizes[1:]) < 2 * min(sizes[1:]), "each put stores only its new tokens"
    snapshot = TokenCaptureStore(root).freeze_now("r1")
    assert not snapshot.incomplete
    by_id = {e.model_call_id: e for e in snapshot.entries}
    assert [by_id[c.model_call_id] for c in calls] == calls


def test_a_parent_mutated_after_its_put_is_not_trusted(tmp_path) -> None:
    root = str(tmp_path)
    store = TokenCaptureStore(root)
    first, second = turns("r1", 2)
    store.put_now(first)
    first.prompt_token_ids[1] = 999  # the caller reuses its buffer after the put
    store.put_now(second)
    snapshot = TokenCaptureStore(root).freeze_now("r1")
    assert not snapshot.incomplete
    assert {e.model_call_id: e for e in snapshot.entries}["turn-1"] == second
    record_case("caller mutates a stored prompt list", wrong_tokens_delivered=0)


def asyncio_run(awaitable):  # type: ignore[no-untyped-def]
    import asyncio

    return asyncio.run(awaitable)
