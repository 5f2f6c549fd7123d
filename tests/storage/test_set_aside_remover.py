"""The background remover of set-aside entries (`remove_later`): what it removes, what it
never follows, and that one entry it cannot remove never stops it for the rest."""

from __future__ import annotations

import os
import sys

import pytest

from capture_core.storage.local.temporaries import (
    TMP_DIR,
    remove_later,
    set_aside_name,
    wait_removed,
)


def _set_aside_folder(tmp: str, files: int) -> str:
    name = set_aside_name(0)
    os.makedirs(os.path.join(tmp, name))
    for i in range(files):
        with open(os.path.join(tmp, name, f"{i:04d}"), "wb") as f:
            f.write(b"x")
    return name


def _deep_tree(tmp: str, depth: int) -> str:
    """A set-aside folder nested deeper than the interpreter's recursion limit."""
    name = set_aside_name(0)
    os.mkdir(os.path.join(tmp, name))
    fd = os.open(os.path.join(tmp, name), os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(depth):
        os.mkdir("d", dir_fd=fd)
        inner = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = inner
    os.close(fd)
    return name


def _remove_deep_tree(tmp: str, name: str) -> None:
    """Remove a tree `_deep_tree` made, without recursion (pytest's own cleanup of `tmp_path`
    recurses and would fail on it at the end of the session)."""
    fd, depth = os.open(os.path.join(tmp, name), os.O_RDONLY | os.O_DIRECTORY), 0
    while "d" in os.listdir(fd):
        inner = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd, depth = inner, depth + 1
    for _ in range(depth):
        parent = os.open("..", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        os.rmdir("d", dir_fd=parent)
        fd = parent
    os.close(fd)
    os.rmdir(os.path.join(tmp, name))


def test_a_link_planted_in_a_moved_folder_is_removed_never_followed(tmp_path) -> None:
    tmp, outside = tmp_path / TMP_DIR, tmp_path / "outside"
    tmp.mkdir()
    outside.mkdir()
    (outside / "keep").write_bytes(b"not the store's")
    name = _set_aside_folder(str(tmp), 3)
    os.symlink(outside, tmp / name / "link")
    os.symlink(outside, tmp / "set-aside-0-linked")
    remove_later(str(tmp), [name, "set-aside-0-linked"])
    assert wait_removed(120)
    assert os.listdir(tmp) == []
    assert (outside / "keep").read_bytes() == b"not the store's"


@pytest.mark.integrity
def test_an_entry_that_cannot_be_removed_never_stops_the_remover(tmp_path) -> None:
    tmp = tmp_path / TMP_DIR
    tmp.mkdir()
    deep = _deep_tree(str(tmp), sys.getrecursionlimit() + 200)
    try:
        after = _set_aside_folder(str(tmp), 2)
        remove_later(str(tmp), [deep, after])
        assert wait_removed(120), "the remover went on after the entry it could not remove"
        later = _set_aside_folder(str(tmp), 2)
        remove_later(str(tmp), [later])
        assert wait_removed(120)
        assert sorted(os.listdir(tmp)) == [deep], "the rest was removed; the deep one waits"
    finally:
        _remove_deep_tree(str(tmp), deep)
