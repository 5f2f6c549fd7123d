"""Both capture stores are one `CaptureStore`; `open_capture_store` is the one way to pick one."""

from __future__ import annotations

import asyncio
import os

import pytest

from capture_core.errors import MixedLayoutError, TokcapError
from capture_core.protocols import TokenSink, TokenSource
from capture_core.store import CaptureStore, NemoGymFileStore, TokenCaptureStore, open_capture_store
from capture_core.testing.synthetic import RolloutShape, synthetic_rollout


def gym_directory(root: str) -> str:
    """A directory NeMo Gym's writer filled: one rollout in its file-store layout."""
    os.makedirs(root)
    store = NemoGymFileStore(root)
    for entry in synthetic_rollout("5-1", RolloutShape(turns=2)):
        store.put_now(entry)
    return root


def test_the_factory_opens_nemo_gym_s_directory_in_place_and_anything_else_as_tokcap(
    tmp_path,
) -> None:
    gym = open_capture_store(gym_directory(str(tmp_path / "gym")))
    ours = open_capture_store(str(tmp_path / "ours"))
    memory = open_capture_store("memory://factory-test")
    assert type(gym) is NemoGymFileStore and gym.root == str(tmp_path / "gym")
    assert type(ours) is TokenCaptureStore and type(memory) is TokenCaptureStore
    for store in (gym, ours, memory):
        assert isinstance(store, CaptureStore)
        assert isinstance(store, TokenSink) and isinstance(store, TokenSource)
    assert len(gym.freeze_now("5-1").entries) == 2


def test_the_constructor_keeps_opening_nemo_gym_s_directory_for_compatibility(tmp_path) -> None:
    root = gym_directory(str(tmp_path / "gym"))
    assert TokenCaptureStore(root) == open_capture_store(root) == NemoGymFileStore(root)


def test_a_directory_with_both_layouts_is_refused_by_the_factory(tmp_path) -> None:
    root = gym_directory(str(tmp_path / "gym"))
    os.makedirs(os.path.join(root, "5-2", "e"))
    open(os.path.join(root, "5-2", "FROZEN"), "w").close()
    with pytest.raises(MixedLayoutError) as refused:
        open_capture_store(root)
    assert isinstance(refused.value, TokcapError) and root in str(refused.value)


def test_capability_flags_say_how_the_stores_differ(tmp_path) -> None:
    gym = open_capture_store(gym_directory(str(tmp_path / "gym")))
    ours = open_capture_store(str(tmp_path / "ours"))
    assert (ours.shared_across_hosts, ours.keeps_loss_reasons) == (True, True)
    assert (gym.shared_across_hosts, gym.keeps_loss_reasons) == (False, False)
    asyncio.run(ours.mark_incomplete("7-1", "call-1", "server restarted"))
    asyncio.run(gym.mark_incomplete("5-1", "call-1", "server restarted"))
    assert "server restarted" in " ".join(ours.freeze_now("7-1").incomplete_reasons)
    assert "server restarted" not in " ".join(gym.freeze_now("5-1").incomplete_reasons)


def test_probe_is_one_method_on_both_stores(tmp_path) -> None:
    missing = str(tmp_path / "missing")
    for store in (TokenCaptureStore(missing), NemoGymFileStore(missing)):
        with pytest.raises(FileNotFoundError, match="missing"):
            store.probe(must_exist=True)
    TokenCaptureStore(missing).probe(must_exist=False)
    open_capture_store(gym_directory(str(tmp_path / "gym"))).probe(must_exist=True)


def test_the_async_forms_are_written_once_on_the_base() -> None:
    pairs = ("put", "begin_call", "mark_incomplete", "freeze", "drop", "close", "append")
    for store in (TokenCaptureStore, NemoGymFileStore):
        assert all(name not in vars(store) for name in pairs), store
        assert not getattr(store, "__abstractmethods__", None)
