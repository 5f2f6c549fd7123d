"""Store-level attack cases: racing retirement, unreadable folders, digests, local URLs,
temporary files, damaged tombstones and the reasons that name each cause.

Interleavings are built deterministically by pausing one client at its byte store (the
boundary where the store's steps become visible to other clients), and checked again as a
real race between processes on local disk and S3 (moto).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import orjson
import pytest

from capture_core.consumer import trajectories_from_source
from capture_core.errors import (
    CaptureFencedError,
    CaptureRetiredError,
    InvalidRecordError,
    UnreadableCaptureError,
)
from capture_core.records import TokenEntry
from capture_core.storage import ByteStore, LocalStore
from capture_core.store import TokenCaptureStore, compact
from capture_core.store.capture_entries import encode_entry
from capture_core.store.capture_layout import call_key
from tests.support.backends import PROCESS_SHARED_BACKENDS, store_location
from tests.support.other_user import hand_over, run_as_other_user, traversable_folder
from tests.support.reliability_figures import record_case

pytestmark = pytest.mark.integrity

SPAWN = multiprocessing.get_context("spawn")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def entry(
    rollout_id: str, call: str, prompt: list[int], gen: list[int], **extra: Any
) -> TokenEntry:
    return TokenEntry(
        rollout_id=rollout_id,
        model_call_id=call,
        prompt_token_ids=prompt,
        generation_token_ids=gen,
        generation_log_probs=[-0.25 - i / 8 for i in range(len(gen))],
        output_items=[{"type": "message", "role": "assistant", "content": []}],
        **extra,
    )


def two_turns(rollout_id: str) -> list[TokenEntry]:
    first = entry(rollout_id, "turn-0", [11, 12, 13], [21, 22])
    second = entry(
        rollout_id, "turn-1", [11, 12, 13, 21, 22, 31], [41, 42, 43], routed_experts=[[1, 2]]
    )
    return [first, second]


class PausingBytes(ByteStore):
    """A byte store that runs `hook(key)` once, just before the first create matching `when`."""

    def __init__(self, inner: ByteStore, when: Callable[[str], bool], hook: Callable[[], None]):
        self.inner, self.when, self.hook, self.fired = inner, when, hook, False
        self.url = inner.url

    def create(self, key: str, data: bytes) -> bool:
        if not self.fired and self.when(key):
            self.fired = True
            self.hook()
        return self.inner.create(key, data)

    def get(self, key: str) -> bytes | None:
        return self.inner.get(key)

    def replace(self, key: str, data: bytes) -> None:
        self.inner.replace(key, data)

    def exists(self, key: str) -> bool:
        return self.inner.exists(key)

    def list_prefix(self, prefix: str) -> list[str]:
        return self.inner.list_prefix(prefix)

    def list_children(self, prefix: str) -> list[str]:
        return self.inner.list_children(prefix)

    def delete(self, keys: Iterable[str], *, durable: bool = True) -> None:
        self.inner.delete(keys, durable=durable)

    def probe(self, must_exist: bool) -> None:
        self.inner.probe(must_exist)


def pause(store: TokenCaptureStore, when: Callable[[str], bool], hook: Callable[[], None]) -> None:
    store._bytes = PausingBytes(store.byte_store, when, hook)


def retired_key(key: str) -> bool:
    return key.endswith("/RETIRED")


@pytest.fixture(params=PROCESS_SHARED_BACKENDS)
def root(request: pytest.FixtureRequest, tmp_path) -> tuple[str, dict[str, object]]:
    return store_location(request.param, request, tmp_path)


# -- 2: drop against a concurrent loss report ----------------------------------------------


def test_loss_reported_while_drop_is_deciding_wins_and_drop_deletes_nothing(root) -> None:
    url, options = root
    dropper, reporter = TokenCaptureStore(url, options), TokenCaptureStore(url, options)
    for item in two_turns("r1"):
        dropper.put_now(item)
    snapshot = dropper.freeze_now("r1")
    reported: list[str] = []

    def report_loss() -> None:  # runs after drop checked the version, before it decides
        reporter.mark_incomplete_now("r1", "turn-2", "turn-2 timed out")
        reported.append("acknowledged")

    pause(dropper, retired_key, report_loss)
    dropped = dropper.drop_now("r1", snapshot.snapshot_id, snapshot.version)
    assert reported == ["acknowledged"]
    assert not dropped, "an acknowledged loss report and a successful drop: both succeeded"
    after = TokenCaptureStore(url, options).freeze_now("r1")
    assert after.incomplete and any("turn-2 timed out" in r for r in after.incomplete_reasons)
    assert len(after.entries) == 2, "the refused drop deleted nothing"
    record_case("drop vs mark_incomplete: loss reported mid-drop", records_lost=0)


def test_drop_that_decides_first_makes_the_late_loss_report_raise(root) -> None:
    url, options = root
    dropper, reporter = TokenCaptureStore(url, options), TokenCaptureStore(url, options)
    for item in two_turns("r2"):
        dropper.put_now(item)
    snapshot = dropper.freeze_now("r2")
    at_decision, go_on = threading.Event(), threading.Event()
    outcome: list[str] = []

    def report_loss() -> None:
        try:
            reporter.mark_incomplete_now("r2", "turn-2")
            outcome.append("acknowledged")
        except CaptureRetiredError:
            outcome.append("retired")

    def wait_for_the_drop() -> None:  # the reporter, paused after its marker is durable
        at_decision.set()
        assert go_on.wait(30), "the drop never finished"

    pause(reporter, retired_key, wait_for_the_drop)
    thread = threading.Thread(target=report_loss)

    def start_reporter() -> None:  # the dropper, paused after its version check
        thread.start()
        at_decision.wait(60)

    pause(dropper, retired_key, start_reporter)
    dropped = dropper.drop_now("r2", snapshot.snapshot_id, snapshot.version)
    go_on.set()
    thread.join(30)
    assert at_decision.is_set(), "the loss report never contested the retirement"
    assert (dropped, outcome) == (True, ["retired"]), "exactly one side may succeed"
    record_case("drop vs mark_incomplete: drop decides first", records_lost=0)


def test_intent_racing_freeze_and_drop_raises(root) -> None:
    url, options = root
    caller, finalizer = TokenCaptureStore(url, options), TokenCaptureStore(url, options)
    caller.put_now(two_turns("r3")[0])
    retired: list[bool] = []

    def freeze_and_drop() -> None:  # runs after begin_call saw no fence, before its write
        snapshot = finalizer.freeze_now("r3")
        retired.append(finalizer.drop_now("r3", snapshot.snapshot_id, snapshot.version))

    pause(caller, lambda key: "/i/" in key, freeze_and_drop)
    with pytest.raises(CaptureFencedError, match="must not start"):
        caller.begin_call_now("r3", "turn-1")
    assert retired == [True]
    record_case("begin_call racing freeze and drop", records_lost=0)


def test_put_racing_freeze_and_drop_raises(root) -> None:
    url, options = root
    caller, finalizer = TokenCaptureStore(url, options), TokenCaptureStore(url, options)
    first, second = two_turns("r4")
    caller.put_now(first)
    retired: list[bool] = []

    def freeze_and_drop() -> None:
        snapshot = finalizer.freeze_now("r4")
        retired.append(finalizer.drop_now("r4", snapshot.snapshot_id, snapshot.version))

    pause(caller, lambda key: "/e/" in key, freeze_and_drop)
    with pytest.raises(CaptureFencedError, match="stored while the rollout was being frozen"):
        caller.put_now(second)
    assert retired == [True]
    record_case("put racing freeze and drop", records_lost=0)


def race_drop(url: str, options: dict, rollout_id: str, snapshot: tuple[str, int], barrier) -> bool:
    store = TokenCaptureStore(url, options)
    barrier.wait(timeout=60)
    return store.drop_now(rollout_id, *snapshot)


def race_report(url: str, options: dict, rollout_id: str, barrier) -> bool:
    store = TokenCaptureStore(url, options)
    barrier.wait(timeout=60)
    try:
        store.mark_incomplete_now(rollout_id, "lost-call", "lost in the race")
    except CaptureRetiredError:
        return False
    return True


def test_drop_and_loss_report_in_two_processes_never_both_succeed(root) -> None:
    url, options = root
    trials = 60 if url.startswith("s3://") else 150
    store = TokenCaptureStore(url, options)
    tally = {"drop won": 0, "report won": 0}
    with SPAWN.Manager() as manager, SPAWN.Pool(2) as pool:
        for trial in range(trials):
            rollout_id = f"race-{trial}-{uuid.uuid4().hex[:6]}"
            store.put_now(two_turns(rollout_id)[0])
            snap = store.freeze_now(rollout_id)
            barrier = manager.Barrier(2)
            drop = pool.apply_async(
                race_drop, (url, options, rollout_id, (snap.snapshot_id, snap.version), barrier)
            )
            report = pool.apply_async(race_report, (url, options, rollout_id, barrier))
            dropped, acknowledged = drop.get(timeout=120), report.get(timeout=120)
            assert not (dropped and acknowledged), f"trial {trial}: both drop and report succeeded"
            assert dropped or acknowledged, f"trial {trial}: neither side succeeded"
            if acknowledged:
                after = store.freeze_now(rollout_id)
                assert after.incomplete and after.entries, f"trial {trial}: evidence lost"
            tally["drop won" if dropped else "report won"] += 1
    assert sum(tally.values()) == trials
    record_case("drop vs mark_incomplete: two-process race", records_lost=0)


# -- 3: unreadable folders -----------------------------------------------------------------

PREPARE_FREEZE = """
import asyncio, sys
from capture_core.consumer import trajectories_from_source
from capture_core.store import TokenCaptureStore
"""

FREEZE = """
store = TokenCaptureStore(sys.argv[1])
try:
    store.freeze_now("r1")
except Exception as exc:
    print("freeze raised:", type(exc).__name__, exc)
else:
    print("freeze returned a snapshot")
built = asyncio.run(trajectories_from_source("r1", TokenCaptureStore(sys.argv[1])))
print("masked:", built["mask_sample"], "|", built.get("error"))
"""


@pytest.fixture()
def shared_dir() -> Iterator[str]:
    """A store folder outside pytest's private temp tree, so another user can reach it."""
    with traversable_folder() as path:
        yield path


@pytest.mark.parametrize("folder", ["x", "i"])
def test_unreadable_lost_call_or_intent_folder_fails_the_freeze(shared_dir, folder) -> None:
    root = os.path.join(shared_dir, "store")
    store = TokenCaptureStore(root)
    for item in two_turns("r1"):
        store.put_now(item)
    if folder == "x":
        store.mark_incomplete_now("r1", "turn-2", "turn-2 was lost")
    else:
        store.begin_call_now("r1", "turn-2")
    hand_over(root)
    os.chmod(os.path.join(root, "r1", folder), 0)
    try:
        result = run_as_other_user(PREPARE_FREEZE, FREEZE, root)
    finally:
        os.chmod(os.path.join(root, "r1", folder), 0o755)
    assert result.returncode == 0, result.stderr
    assert f"freeze raised: PermissionError local store cannot list folder r1/{folder}" in (
        result.stdout
    ), result.stdout
    assert "masked: True" in result.stdout and f"r1/{folder}" in result.stdout, result.stdout
    record_case(f"unreadable {'lost-call' if folder == 'x' else 'intent'} folder", records_lost=0)


def test_permission_error_on_a_check_is_not_read_as_absent(shared_dir) -> None:
    root = os.path.join(shared_dir, "store")
    TokenCaptureStore(root).put_now(two_turns("r1")[0])
    hand_over(root)
    os.chmod(os.path.join(root, "r1"), 0o600)  # listable names, but nothing inside reachable
    try:
        result = run_as_other_user(
            "import sys\nfrom capture_core.storage import LocalStore",
            "try:\n    print(LocalStore(sys.argv[1]).exists('r1/FROZEN'))\n"
            "except PermissionError as exc:\n    print('raised', exc)\n",
            root,
            timeout=60,
        )
    finally:
        os.chmod(os.path.join(root, "r1"), 0o755)
    assert result.stdout.startswith("raised local store cannot check r1/FROZEN"), result
    record_case("unreachable fence read as absent", records_lost=0)


# -- 6: digests over every token-bearing field ---------------------------------------------


def edit_one_digit(data: bytes, field: bytes) -> bytes:
    """Change one digit of the first number after `field` in the raw stored bytes."""
    at = data.index(field) + len(field)
    while not chr(data[at]).isdigit():
        at += 1
    digit = b"7" if data[at : at + 1] != b"7" else b"8"
    return data[:at] + digit + data[at + 1 :]


def replace_object(store: TokenCaptureStore, key: str, data: bytes) -> None:
    store.byte_store.delete([key])
    assert store.byte_store.create(key, data)


@pytest.mark.parametrize(
    ("what", "field"),
    [
        ("generation ids of the last call", b'"g":['),
        ("log probs of the last call", b'"l":['),
        ("routed experts of the last call", b'"x":['),
        ("prompt delta of the last call", b'"d":['),
    ],
)
def test_one_digit_edit_of_any_token_field_masks_with_a_digest_reason(root, what, field) -> None:
    url, options = root
    store = TokenCaptureStore(url, options)
    for item in two_turns("r1"):
        store.put_now(item)
    key = f"r1/e/{call_key('turn-1')}"
    replace_object(store, key, edit_one_digit(store.byte_store.get(key) or b"", field))
    with pytest.raises(UnreadableCaptureError, match=f"object {key}.*fail their digest check"):
        TokenCaptureStore(url, options).freeze_now("r1")
    built = asyncio_run(trajectories_from_source("r1", TokenCaptureStore(url, options)))
    assert built["mask_sample"] and "digest check" in built["error"]
    assert built["rebuilt_response"] is None
    record_case(f"one-digit edit: {what}", wrong_tokens_delivered=0)


def asyncio_run(awaitable: Any) -> Any:
    import asyncio

    return asyncio.run(awaitable)


def test_missing_seal_or_prompt_digest_is_corruption(root) -> None:
    url, options = root
    store = TokenCaptureStore(url, options)
    for item in two_turns("r1"):
        store.put_now(item)
    key = f"r1/e/{call_key('turn-1')}"
    data = store.byte_store.get(key) or b""
    unsealed = orjson.loads(data)
    del unsealed["s"]
    replace_object(store, key, orjson.dumps(unsealed, option=orjson.OPT_SORT_KEYS))
    with pytest.raises(UnreadableCaptureError, match="no digest although its stored schema"):
        store.freeze_now("r1")
    replace_object(store, key, data)
    root_key = f"r1/e/{call_key('turn-0')}"
    no_digest = orjson.loads(store.byte_store.get(root_key) or b"")
    del no_digest["s"]
    no_digest["p"]["h"] = None
    resealed = compact.seal(orjson.dumps(no_digest, option=orjson.OPT_SORT_KEYS))
    replace_object(store, root_key, resealed)
    snapshot = TokenCaptureStore(url, options).freeze_now("r1")
    assert snapshot.incomplete and not snapshot.entries
    assert any("has no digest, which is required" in r for r in snapshot.incomplete_reasons)
    built = asyncio_run(trajectories_from_source("r1", TokenCaptureStore(url, options)))
    assert built["mask_sample"] and "has no digest" in built["error"], built["error"]
    assert "no token records" not in built["error"], "the reason names the real cause"
    record_case("missing digest where the schema requires one", wrong_tokens_delivered=0)
    record_case("root digest failure reads as 'no token records'", wrong_tokens_delivered=0)


def reseal(store: TokenCaptureStore, key: str, mutate: Callable[[dict], object]) -> None:
    """Edit a stored object and seal it again: bytes no tokcap writer stores, sealed."""
    data = orjson.loads(store.byte_store.get(key) or b"{}")
    del data["s"]
    mutate(data)
    replace_object(store, key, compact.seal(orjson.dumps(data, option=orjson.OPT_SORT_KEYS)))


@pytest.mark.parametrize(
    ("what", "mutate", "problem"),
    [
        ("log probs one short", lambda d: d["l"].pop(), "generation_token_ids has 3 ids"),
        ("a call id that is a number", lambda d: d.__setitem__("c", 7), "valid string"),
        ("a carrier index past its items", lambda d: d.__setitem__("k", 4), "does not index"),
        ("a newer record schema", lambda d: d.__setitem__("e", {"schema_version": 9}), "newer"),
        ("a log prob of -1e39", lambda d: d["l"].__setitem__(0, -1e39), "beyond float32's"),
        ("a log prob of 1e39", lambda d: d["l"].__setitem__(1, 1e39), "beyond float32's"),
        ("a log prob of -3.5e38", lambda d: d["l"].__setitem__(2, -3.5e38), "beyond float32's"),
    ],
)
def test_a_sealed_entry_breaking_a_record_rule_is_refused_by_name(
    root, what: str, mutate: Callable[[dict], object], problem: str
) -> None:
    url, options = root
    store = TokenCaptureStore(url, options)
    for item in two_turns("r1"):
        store.put_now(item)
    key = f"r1/e/{call_key('turn-1')}"
    reseal(store, key, mutate)
    with pytest.raises(UnreadableCaptureError, match=f"{key} is not a readable.*{problem}"):
        TokenCaptureStore(url, options).freeze_now("r1")
    record_case(f"sealed entry breaking a record rule: {what}", wrong_tokens_delivered=0)


# -- entries changed after they were built -------------------------------------------------

CHANGED_AFTER_BUILD: dict[str, tuple[Callable[[TokenEntry], object], str]] = {
    "a -100 pad and its log prob appended": (
        lambda e: (e.generation_token_ids.append(-100), e.generation_log_probs.append(-0.5)),
        "generation_token_ids holds -100 at position 3",
    ),
    "a -100 pad in the prompt": (
        lambda e: e.prompt_token_ids.__setitem__(4, -100),
        "prompt_token_ids holds -100 at position 4",
    ),
    "an id without its log prob": (
        lambda e: e.generation_token_ids.append(44),
        "generation_token_ids has 4 ids but generation_log_probs has 3",
    ),
    "a NaN log prob": (
        lambda e: e.generation_log_probs.__setitem__(1, float("nan")),
        "generation_log_probs holds a NaN",
    ),
    "an id that is text": (
        lambda e: e.generation_token_ids.__setitem__(0, "41"),
        "generation_token_ids holds '41' at position 0",
    ),
    "an id that is a float": (
        lambda e: e.generation_token_ids.__setitem__(2, 43.5),
        "generation_token_ids holds 43.5 at position 2",
    ),
    "a log prob of -1e39": (
        lambda e: e.generation_log_probs.__setitem__(0, -1e39),
        "generation_log_probs holds a NaN or infinite value, one beyond float32's range",
    ),
    "a log prob of 1e39": (
        lambda e: e.generation_log_probs.__setitem__(0, 1e39),
        "generation_log_probs holds a NaN or infinite value, one beyond float32's range",
    ),
    "a log prob of -3.5e38": (
        lambda e: e.generation_log_probs.__setitem__(2, -3.5e38),
        "generation_log_probs holds a NaN or infinite value, one beyond float32's range",
    ),
}


@pytest.mark.parametrize("method", ["put_now", "put"])
@pytest.mark.parametrize("what", CHANGED_AFTER_BUILD)
def test_an_entry_changed_after_it_was_built_is_refused_at_put_by_field(
    root, what: str, method: str
) -> None:
    """No intent was recorded: the refused put itself reports the call lost, so the rollout
    (whose first call is stored) is masked rather than delivered without its second call."""
    url, options = root
    store = TokenCaptureStore(url, options)
    first, second = two_turns("r1")
    store.put_now(first)
    change, problem = CHANGED_AFTER_BUILD[what]
    change(second)
    with pytest.raises(InvalidRecordError) as refused:
        if method == "put":
            asyncio_run(store.put(second))
        else:
            store.put_now(second)
    message = str(refused.value)
    assert message.startswith(f"rollout r1: call 'turn-1' was refused at put: {problem}"), message
    assert "marked incomplete and will be masked" in message
    assert store.byte_store.list_prefix("r1/e") == [f"r1/e/{call_key('turn-0')}"], "not stored"
    snapshot = TokenCaptureStore(url, options).freeze_now("r1")
    assert [e.model_call_id for e in snapshot.entries] == ["turn-0"] and snapshot.incomplete
    assert any(problem in reason for reason in snapshot.incomplete_reasons)
    built = asyncio_run(trajectories_from_source("r1", TokenCaptureStore(url, options)))
    assert built["mask_sample"] and built["metrics"]["capture_incomplete"] is True
    record_case(f"entry changed after it was built, then put ({method}): {what}")


class ChangingAfterCheck(TokenCaptureStore):
    """Changes the caller's entry the moment the put has checked it, before it is encoded:
    a writer thread still editing an entry it handed over."""

    change: Callable[[TokenEntry], object] = staticmethod(lambda entry: None)

    def storable(self, entry: Any) -> Any:
        checked = super().storable(entry)
        type(self).change(entry)
        return checked


def test_a_put_stores_what_it_checked_though_the_caller_changes_its_entry(root) -> None:
    """The generation is stored from the checked copy; a prompt changed after the check
    fails its digest, which was taken from the checked ids, so the rollout masks."""
    url, options = root
    first, second = two_turns("r1")
    expected = second.model_copy(deep=True)

    class PadsTheGeneration(ChangingAfterCheck):
        change = staticmethod(
            lambda e: (
                e.generation_token_ids.__setitem__(0, -100),
                e.generation_log_probs.append(-1e39),
            )
        )

    TokenCaptureStore(url, options).put_now(first)
    PadsTheGeneration(url, options).put_now(second)
    snapshot = TokenCaptureStore(url, options).freeze_now("r1")
    assert not snapshot.incomplete, snapshot.incomplete_reasons
    stored = {e.model_call_id: e for e in snapshot.entries}
    assert stored["turn-1"] == expected, "what was checked, not the caller's later edit"

    class PadsThePrompt(ChangingAfterCheck):
        change = staticmethod(lambda e: e.prompt_token_ids.__setitem__(-1, -100))

    first, second = two_turns("r2")
    TokenCaptureStore(url, options).put_now(first)
    PadsThePrompt(url, options).put_now(second)
    snapshot = TokenCaptureStore(url, options).freeze_now("r2")
    assert [e.model_call_id for e in snapshot.entries] == ["turn-0"]
    (reason,) = snapshot.incomplete_reasons
    assert call_key("turn-1") in reason and "fails its digest check" in reason, reason
    built = asyncio_run(trajectories_from_source("r2", TokenCaptureStore(url, options)))
    assert built["mask_sample"] and built["metrics"]["capture_incomplete"] is True
    record_case("entry changed by the caller while its put runs", wrong_tokens_delivered=0)


def test_a_sealed_field_of_a_convertible_type_reads_as_validation_converts_it(root) -> None:
    url, options = root
    store = TokenCaptureStore(url, options)
    for item in two_turns("r1"):
        store.put_now(item)
    reseal(store, f"r1/e/{call_key('turn-1')}", lambda d: d.update(t=5))
    snapshot = TokenCaptureStore(url, options).freeze_now("r1")
    assert not snapshot.incomplete, snapshot.incomplete_reasons
    second = next(e for e in snapshot.entries if e.model_call_id == "turn-1")
    assert type(second.created_at) is float and second.created_at == 5.0
    assert second.prompt_token_ids == two_turns("r1")[1].prompt_token_ids
    record_case("sealed entry with an integer timestamp", wrong_tokens_delivered=0)


def test_digest_less_legacy_objects_mask_the_rollout_by_name(root) -> None:
    url, options = root
    store = TokenCaptureStore(url, options)
    first, second = two_turns("r1")
    store.put_now(first)
    legacy = f"r1/e/{call_key('turn-1')}"
    store.byte_store.create(legacy, encode_entry(second))
    built = asyncio_run(trajectories_from_source("r1", TokenCaptureStore(url, options)))
    assert built["mask_sample"] and built["rebuilt_response"] is None
    assert legacy in built["error"] and "stored schema 1" in built["error"], built["error"]
    record_case("legacy stored schema 1 object without digest", wrong_tokens_delivered=0)


def test_sealing_costs_bytes_linear_in_the_delta(tmp_path) -> None:
    store = TokenCaptureStore(str(tmp_path))
    prompt = list(range(50_000))
    store.put_now(entry("r1", "a", prompt, [1, 2]))
    store.put_now(entry("r1", "b", [*prompt, 1, 2, 3], [4]))
    size = len(store.byte_store.get(f"r1/e/{call_key('b')}") or b"")
    assert size < 400, f"a one-token delta is stored in {size} bytes"
    assert TokenCaptureStore(str(tmp_path)).freeze_now("r1").entries[1].prompt_token_ids


# -- 8: every local form is the local backend ----------------------------------------------


def test_every_local_url_form_takes_the_local_backend(tmp_path) -> None:
    path = str(tmp_path / "store")
    forms = [path, f"file://{path}", f"local://{path}"]
    stores = [TokenCaptureStore(form) for form in forms]
    assert [type(store.byte_store) for store in stores] == [LocalStore] * 3
    stores[2].put_now(two_turns("r1")[0])
    snapshots = [store.freeze_now("r1") for store in stores]
    assert len({(s.snapshot_id, s.version) for s in snapshots}) == 1
    record_case("local:// took the non-atomic fsspec path", records_lost=0)


@pytest.mark.parametrize("url", ["ftp://127.0.0.1:9/captures", "simplecache::memory://x/y"])
def test_filesystem_without_atomic_create_is_refused(url: str) -> None:
    with pytest.raises(ValueError, match="atomic create-only write"):
        TokenCaptureStore(url)
    record_case(f"non-atomic filesystem refused ({url.split(':', 1)[0]})", records_lost=0)


# -- 9: temporary files --------------------------------------------------------------------

WRITE_UNDER_SIZE_LIMIT = """
import os, resource, signal, sys
from capture_core.records import TokenEntry
from capture_core.store import TokenCaptureStore
store = TokenCaptureStore(sys.argv[1])
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead
resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, resource.RLIM_INFINITY))
big = list(range(100_000))
for label, write in (
    ("create", lambda: store.put_now(TokenEntry(rollout_id="r1", model_call_id="big",
        prompt_token_ids=big, generation_token_ids=[1], generation_log_probs=[-0.5]))),
    ("replace", lambda: store.byte_store.replace("reports/ledger", b"x" * 200_000)),
):
    try:
        write()
    except OSError as exc:
        print(label, "failed:", os.strerror(exc.errno))
    else:
        print(label, "succeeded")
"""


def test_a_failed_write_removes_its_temporary_file(tmp_path) -> None:
    root = str(tmp_path / "store")
    TokenCaptureStore(root).put_now(two_turns("r0")[0])  # creates the folders
    result = subprocess.run(
        [sys.executable, "-c", WRITE_UNDER_SIZE_LIMIT, root],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert result.stdout.splitlines() == [
        "create failed: File too large",
        "replace failed: File too large",
    ], result
    assert os.listdir(os.path.join(root, ".tmp")) == [], "a partial temporary file was left"
    assert not os.path.exists(os.path.join(root, "reports", "ledger"))
    record_case("full disk leaves a partial temporary file", records_lost=0)


def test_a_normal_run_of_every_operation_leaves_no_temporary_file(tmp_path) -> None:
    root = str(tmp_path / "store")
    store = TokenCaptureStore(root)
    for rollout_id in ("r1", "r2", "r3"):
        store.begin_call_now(rollout_id, "turn-0")
        for item in two_turns(rollout_id):
            store.put_now(item)
            store.put_now(item)
    store.mark_incomplete_now("r2", "turn-9")
    snapshot = store.freeze_now("r1")
    assert store.drop_now("r1", snapshot.snapshot_id, snapshot.version)
    store.freeze_now("r2")
    store.mark_incomplete_now("r2", "turn-10")
    store.delete("r3")
    store.byte_store.replace("reports/ledger", b"one")
    store.byte_store.replace("reports/ledger", b"two")
    assert store.sweep_retired(0) == 1
    leftovers = [
        os.path.join(folder, name)
        for folder, _dirs, files in os.walk(root)
        for name in files
        if folder.endswith(".tmp")
    ]
    assert leftovers == []
    record_case("normal run leaves temporary files", records_lost=0)


# -- 10: one damaged tombstone -------------------------------------------------------------


def test_sweep_names_a_damaged_tombstone_skips_it_and_continues(root, caplog) -> None:
    url, options = root
    store = TokenCaptureStore(url, options)
    for rollout_id in ("a1", "b2", "c3"):
        store.put_now(two_turns(rollout_id)[0])
        snapshot = store.freeze_now(rollout_id)
        assert store.drop_now(rollout_id, snapshot.snapshot_id, snapshot.version)
    replace_object(store, "b2/RETIRED", b"\x00garbage")
    with caplog.at_level(logging.WARNING, logger="capture_core.store"):
        assert store.sweep_retired(0) == 2
    assert store.byte_store.list_prefix("a1") == store.byte_store.list_prefix("c3") == []
    assert store.byte_store.list_prefix("b2") == ["b2/FROZEN", "b2/RETIRED"]
    assert any("skipped rollout b2" in r.getMessage() for r in caplog.records), caplog.text
    record_case("one unreadable tombstone aborts the sweep", records_lost=0)


# -- 12: reasons name the real cause -------------------------------------------------------


def test_dangling_symlink_is_named_as_a_link_not_as_vanished(tmp_path) -> None:
    root = str(tmp_path / "store")
    store = TokenCaptureStore(root)
    store.put_now(two_turns("r1")[0])
    link = os.path.join(root, "r1", "e", call_key("turn-1"))
    os.symlink(str(tmp_path / "nowhere"), link)
    with pytest.raises(UnreadableCaptureError, match=r"is a symbolic link \(dangling"):
        store.freeze_now("r1")
    built = asyncio_run(trajectories_from_source("r1", TokenCaptureStore(root)))
    assert built["mask_sample"] and "symbolic link" in built["error"]
    assert "vanished" not in built["error"]
    record_case("dangling symlink reads as 'vanished while freezing'", wrong_tokens_delivered=0)


def test_a_refused_put_to_a_frozen_rollout_leaves_its_snapshot_retirable(root) -> None:
    """A late put is refused as any late put is; its snapshot stands and can be retired."""
    url, options = root
    store = TokenCaptureStore(url, options)
    first, second = two_turns("r1")
    store.put_now(first)
    snapshot = store.freeze_now("r1")
    second.generation_token_ids.append(-100)
    second.generation_log_probs.append(-0.5)
    with pytest.raises(InvalidRecordError, match="generation_token_ids.*already frozen"):
        store.put_now(second)
    assert TokenCaptureStore(url, options).freeze_now("r1") == snapshot, "nothing changed"
    assert store.drop_now("r1", snapshot.snapshot_id, snapshot.version)
    with pytest.raises(InvalidRecordError, match="already frozen"):
        store.put_now(second)
    record_case("entry changed after it was built, put after its rollout was frozen")


def _both_stores(tmp_path) -> list:
    from capture_core.store.nemo_gym_store import NemoGymFileStore

    (tmp_path / "gym").mkdir()
    return [TokenCaptureStore(str(tmp_path / "tokcap")), NemoGymFileStore(tmp_path / "gym")]


@pytest.mark.integrity
def test_values_a_store_cannot_encode_are_refused_and_their_call_lost(tmp_path) -> None:
    """A writer appending NumPy numbers or a float subclass after the entry was built: they
    pass the check as the numbers they are, but a store that cannot encode them refuses
    the put by name and reports the call lost, so the rollout never trains without it."""
    import numpy as np

    class Half(float):
        pass

    for store in _both_stores(tmp_path):
        entry = TokenEntry(
            rollout_id="n-0",
            model_call_id="c",
            prompt_token_ids=[1, 2],
            generation_token_ids=[3],
            generation_log_probs=[-0.5],
        )
        entry.generation_token_ids.extend([np.int64(5), 6])
        entry.generation_log_probs.extend([np.float32(-0.25), Half(-0.125)])
        with pytest.raises(InvalidRecordError, match="cannot be encoded"):
            store.put_now(entry)
        snapshot = store.freeze_now("n-0")
        assert snapshot.incomplete and not snapshot.entries
    record_case("numbers a store cannot encode, appended after an entry was built")


@pytest.mark.integrity
@pytest.mark.parametrize("big", [2**63, 2**64])
def test_an_id_beyond_int64_is_refused_and_its_call_lost_in_either_store(tmp_path, big) -> None:
    for store in _both_stores(tmp_path):
        entry = TokenEntry(
            rollout_id="b-0",
            model_call_id="c",
            prompt_token_ids=[1, 2],
            generation_token_ids=[3],
            generation_log_probs=[-0.5],
        )
        entry.generation_token_ids.append(big)
        entry.generation_log_probs.append(-0.5)
        with pytest.raises(InvalidRecordError, match="generation_token_ids"):
            store.put_now(entry)
        snapshot = store.freeze_now("b-0")
        assert snapshot.incomplete and not snapshot.entries
    record_case("a token id beyond int64 at put")
