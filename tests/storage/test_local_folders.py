"""The local store's folders: what it remembers of them, and views pinned to one.

A long-lived worker creates a folder per rollout it touches, and each retirement removes
folders again; forgetting one must forget what lies beneath it and nothing else, and leave
no index entry behind, so the memory and the cost of a removal do not grow with the
number of rollouts the process has touched. A pinned view (the tombstone sweep's) reads,
lists and deletes only in the folder it pinned, whatever is made again under its name.
"""

from __future__ import annotations

import logging
import os
import shutil
import time

import pytest

from capture_core.errors import UnreadableCaptureError
from capture_core.storage import LocalStore
from capture_core.storage.local.folder_index import KnownFolders
from capture_core.store import TokenCaptureStore


def test_forgetting_a_folder_forgets_exactly_it_and_what_lies_beneath() -> None:
    known = KnownFolders("/root")
    for folder in ("/root/r1/e", "/root/r1", "/root/r10/e", "/root/r2/e", "/root/r2/i"):
        known.add(folder)
    known.forget("/root/r1")
    assert "/root/r1" not in known and "/root/r1/e" not in known
    assert "/root/r10/e" in known  # a sibling whose name starts alike is kept
    known.forget("/root/r2/e")
    assert "/root/r2/i" in known and "/root/r2/e" not in known
    known.forget("/root")
    assert "/root/r10/e" not in known and "/root/r2/i" not in known


def test_retiring_many_rollouts_leaves_no_folder_remembered(tmp_path) -> None:
    store = LocalStore(str(tmp_path))
    for i in range(50):
        store.create(f"r{i}/e/call", b"{}")
        store.create(f"r{i}/FROZEN", b"{}")
    for i in range(50):
        store.delete([f"r{i}/e/call"], durable=False)
    assert not os.path.exists(tmp_path / "r7" / "e")
    known = store._known_dirs
    assert not any("/e" in folder for folder in known._known)
    assert all(not beneath or parent == store.root for parent, beneath in known._beneath.items())
    assert sum(len(beneath) for beneath in known._beneath.values()) == len(known._known)
    store.create("r7/e/again", b"{}")  # a removed folder is made again on the next create
    assert store.get("r7/e/again") == b"{}"


def test_a_pinned_folder_made_again_under_its_name_is_never_reached(tmp_path) -> None:
    """Reads, listings and deletes through a pinned view stay in the folder it pinned."""
    store = LocalStore(str(tmp_path))
    for key in ("r1/e/a", "r1/RETIRED"):
        store.create(key, b"old")
    with store.pinned("r1") as view:
        assert view.list_prefix("r1") == ["r1/RETIRED", "r1/e/a"]
        store.delete(["r1/e/a", "r1/RETIRED"])  # a clear, then the next attempt
        store.create("r1/e/a", b"new")
        assert view.list_prefix("r1") == [] and view.get("r1/e/a") is None
        assert view.delete_each(["r1/e/a", "r1/RETIRED"]) == {}
    assert store.get("r1/e/a") == b"new"
    assert store.list_prefix("r1") == ["r1/e/a"]


def test_a_pinned_view_deletes_its_folder_and_removes_it_once_empty(tmp_path) -> None:
    store = LocalStore(str(tmp_path))
    for key in ("r1/e/a", "r1/x/b", "r1/FROZEN"):
        store.create(key, b"{}")
    with store.pinned("r1") as view:
        assert view.get("r1/FROZEN") == b"{}"
        assert view.delete_each(["r1/e/a", "r1/x/b"], durable=False) == {}
        assert sorted(os.listdir(tmp_path / "r1")) == ["FROZEN"]
        assert view.delete_each(["r1/FROZEN"]) == {}
    assert not os.path.exists(tmp_path / "r1")
    store.create("r1/e/c", b"{}")  # the folders it removed are made again on the next create
    assert store.list_prefix("r1") == ["r1/e/c"]


def test_a_pinned_view_of_a_missing_folder_finds_and_deletes_nothing(tmp_path) -> None:
    store = LocalStore(str(tmp_path))
    with store.pinned("r1") as view:
        store.create("r1/e/a", b"{}")  # made after the pin: not the pinned folder
        assert view.get("r1/e/a") is None and view.list_prefix("r1") == []
        assert view.delete_each(["r1/e/a"]) == {}
    assert store.get("r1/e/a") == b"{}"


def test_a_link_in_a_pinned_folder_is_refused_by_name(tmp_path) -> None:
    store = LocalStore(str(tmp_path))
    store.create("r1/e/a", b"{}")
    os.symlink("/etc/passwd", tmp_path / "r1" / "e" / "b")
    with store.pinned("r1") as view, pytest.raises(UnreadableCaptureError, match="r1/e/b"):
        view.list_prefix("r1")


def test_a_pinned_folder_that_is_a_link_is_refused_by_name_and_not_followed(tmp_path) -> None:
    store = LocalStore(str(tmp_path / "store"))
    store.create("r1/FROZEN", b"{}")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "RETIRED").write_bytes(b"{}")
    os.symlink(outside, tmp_path / "store" / "r2")
    pin = store.pinned("r2")
    with pytest.raises(UnreadableCaptureError, match="folder r2 is a symbolic link"):
        pin.__enter__()
    assert (outside / "RETIRED").read_bytes() == b"{}"


def test_a_clear_refuses_an_id_that_is_a_link_or_a_file_and_deletes_nothing_behind_it(
    tmp_path,
) -> None:
    (tmp_path / "store").mkdir()
    store = TokenCaptureStore(str(tmp_path / "store"))
    outside = tmp_path / "outside"
    (outside / "e").mkdir(parents=True)
    (outside / "e" / "precious").write_bytes(b"keep")
    (outside / "FROZEN").write_bytes(b"keep")
    os.symlink(outside, tmp_path / "store" / "r1")
    (tmp_path / "store" / "r2").write_bytes(b"a file")
    for rollout_id in ("r1", "r2"):
        with pytest.raises(UnreadableCaptureError, match=f"{rollout_id} in the store root"):
            store.delete(rollout_id)
    assert (outside / "e" / "precious").read_bytes() == b"keep"
    assert (outside / "FROZEN").read_bytes() == b"keep"
    assert (tmp_path / "store" / "r2").read_bytes() == b"a file"


def test_a_clear_removes_the_folders_a_crashed_drop_left_empty(tmp_path) -> None:
    store = TokenCaptureStore(str(tmp_path / "store"))
    store.byte_store.create("r1/FROZEN", b"{}")
    for empty in ("e", "i", "x"):
        (tmp_path / "store" / "r1" / empty).mkdir()
    store.delete("r1")
    assert not os.path.exists(tmp_path / "store" / "r1")


def test_a_clear_sets_reserved_entries_aside_and_a_sweep_removes_them_an_hour_later(
    tmp_path,
) -> None:
    """A `.nfs*` entry (a file still open elsewhere on NFS) or a `.DS_Store` is not the store's
    and may not go yet: the clear moves it into the temporaries, so no folder stays under the
    id for the next attempt to write into. Its age counts from the clear, not from its own
    old modification time: the sweep of temporaries removes it an hour after."""
    store = TokenCaptureStore(str(tmp_path / "store"))
    store.byte_store.create("r1/e/c1", b"{}")
    held = tmp_path / "store" / "r1" / "e" / ".nfs0000000001"
    held.write_bytes(b"open elsewhere")
    os.utime(held, (time.time() - 7200, time.time() - 7200))
    (tmp_path / "store" / "r1" / ".DS_Store").write_bytes(b"finder")
    store.delete("r1")
    assert not os.path.exists(tmp_path / "store" / "r1")
    aside = sorted(os.listdir(tmp_path / "store" / ".tmp"))
    assert len(aside) == 2 and all(name.startswith("set-aside-") for name in aside)
    store.sweep_retired(0)
    assert sorted(os.listdir(tmp_path / "store" / ".tmp")) == aside, "cleared just now"
    assert store.byte_store.remove_stale_temporaries(3600, time.time() + 3601) == 2
    assert os.listdir(tmp_path / "store" / ".tmp") == []


def test_a_clear_makes_the_temporaries_folder_again_when_it_was_removed(tmp_path) -> None:
    store = TokenCaptureStore(str(tmp_path / "store"))
    store.byte_store.create("r1/e/c1", b"{}")  # the store now knows `.tmp` exists
    shutil.rmtree(tmp_path / "store" / ".tmp")
    (tmp_path / "store" / "r1" / ".DS_Store").write_bytes(b"finder")
    store.delete("r1")
    assert not os.path.exists(tmp_path / "store" / "r1")
    assert len(os.listdir(tmp_path / "store" / ".tmp")) == 1


@pytest.mark.parametrize("planted", ["file", "link"])
def test_a_reserved_entry_that_cannot_be_set_aside_keeps_its_folder_with_a_warning(
    tmp_path, caplog, planted: str
) -> None:
    """Where the temporaries' folder is a file, or a link planted to another folder, the
    clear still deletes every object, warns by name and leaves the folder as it always did;
    nothing is moved into the link's target, and the sweep deletes nothing there."""
    store = TokenCaptureStore(str(tmp_path / "store"))
    store.byte_store.create("r1/e/c1", b"{}")
    (tmp_path / "store" / "r1" / ".DS_Store").write_bytes(b"finder")
    shutil.rmtree(tmp_path / "store" / ".tmp")
    victim = tmp_path / "victim"
    (victim / "project").mkdir(parents=True)
    os.utime(victim / "project", (0, 0))
    if planted == "file":
        (tmp_path / "store" / ".tmp").write_bytes(b"not a folder")
    else:
        (tmp_path / "store" / ".tmp").symlink_to(victim)
    with caplog.at_level(logging.WARNING):
        store.delete("r1")
        store.sweep_retired(0)
        store.byte_store.remove_stale_temporaries(3600, time.time() + 7200)
    assert os.listdir(tmp_path / "store" / "r1") == [".DS_Store"]
    assert store.byte_store.list_prefix("r1") == []
    assert "r1 in the store root" in caplog.text and "could not be set aside" in caplog.text
    assert "not swept" in caplog.text
    assert os.listdir(victim) == ["project"]


def test_a_clear_sets_aside_the_reserved_entries_of_many_subfolders(tmp_path) -> None:
    """The walk holds one descriptor per level, not one per subfolder waiting its turn."""
    store = TokenCaptureStore(str(tmp_path / "store"))
    store.byte_store.create("r1/e/c1", b"{}")
    for k in range(60):
        (tmp_path / "store" / "r1" / f"x{k}" / "y").mkdir(parents=True)
        (tmp_path / "store" / "r1" / f"x{k}" / "y" / ".DS_Store").write_bytes(b"finder")
    store.delete("r1")
    assert not os.path.exists(tmp_path / "store" / "r1")
    assert len(os.listdir(tmp_path / "store" / ".tmp")) == 60


@pytest.mark.parametrize("stamp", ["\u00b2", "9" * 200, "x", ""])
def test_a_temporary_whose_name_holds_no_time_is_judged_by_its_own_times(
    tmp_path, stamp: str
) -> None:
    """A crafted `set-aside-*` name never stops the sweep: without a plain time in it, the
    entry's own times decide."""
    store = TokenCaptureStore(str(tmp_path / "store"))
    store.byte_store.create("r1/e/c1", b"{}")
    (tmp_path / "store" / ".tmp" / f"set-aside-{stamp}-x").write_bytes(b"left")
    store.sweep_retired(0)
    assert len(os.listdir(tmp_path / "store" / ".tmp")) == 1
    assert store.byte_store.remove_stale_temporaries(3600, time.time() + 3601) == 1
