"""Durability on a local disk: the syscalls that make a local store's write survive a crash.

A new file is written in full, fsynced and closed; a failed write removes it, so no torn
file stays behind a raised error. A folder's new, renamed or removed names are made durable
by an fsync of the folder. Concurrent writers of one folder share those folder fsyncs: one
fsync covers every writer that linked its name before it started.
This module imports only the standard library.
"""

from __future__ import annotations

import contextlib
import os
import threading


def fsync_dir(path: str) -> None:
    """Make a folder's entries (new, renamed or removed names) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _FolderSyncState:
    __slots__ = ("busy", "issued", "synced", "waiters")

    def __init__(self) -> None:
        self.issued = self.synced = self.waiters = 0
        self.busy = False


class GroupDirSync:
    """Shares folder fsyncs between concurrent writers of one folder.

    A writer takes a ticket after its `link`; an fsync that starts after that covers it.
    One thread syncs on behalf of everyone who took a ticket before it started.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._folders: dict[str, _FolderSyncState] = {}

    def sync(self, folder: str) -> None:
        with self._cond:
            state = self._folders.setdefault(folder, _FolderSyncState())
            state.issued += 1
            state.waiters += 1
            ticket = state.issued
            try:
                while state.synced < ticket:
                    if state.busy:
                        self._cond.wait()
                        continue
                    state.busy, covered = True, state.issued
                    self._cond.release()
                    try:
                        fsync_dir(folder)
                    finally:
                        self._cond.acquire()
                        state.busy = False
                        self._cond.notify_all()
                    state.synced = max(state.synced, covered)
            finally:
                state.waiters -= 1
                if state.waiters == 0:
                    del self._folders[folder]


def write_and_sync(fd: int, data: bytes, path: str) -> None:
    """Write all of `data` to the new file `fd`, fsync and close it; on failure remove `path`."""
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        remove_quietly(path)
        raise
    os.close(fd)


def remove_quietly(path: str) -> None:
    """Remove a file of our own; one already gone is fine."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
