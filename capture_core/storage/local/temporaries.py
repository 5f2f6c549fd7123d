"""The local store's temporaries: `<root>/.tmp/`, never beside published objects.

A writer's data goes first into a fresh temporary file there, written and fsynced, which the
store then links or renames to its name. A clear moves entries of reserved names into the
folder (set aside), so their folders can go; a retirement moves a retired rollout's event
folders there, one rename each, and `remove_later` removes them on a background thread, off
the retirement's path. The sweep removes what crashed writers left and whatever was set aside
and not removed (a process killed first), once older than it is told; one that cannot go yet
stays for later. Nothing in the folder is ever read as a capture: its name is reserved.
This module imports only the standard library, `durability` and `reading`.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import shutil
import stat
import threading
import uuid
from collections import deque
from collections.abc import Iterable

from capture_core.storage.local.durability import write_and_sync
from capture_core.storage.local.reading import FOLDER

TMP_DIR = ".tmp"
logger = logging.getLogger(__name__)

_SET_ASIDE = "set-aside"
"""Entries a clear or a retirement moved into the temporaries are named
`set-aside-<unix seconds>-<hex>`."""


class Temporaries:
    """The temporaries' folder of the store rooted at `root`."""

    def __init__(self, root: str) -> None:
        self.folder = os.path.join(root, TMP_DIR)
        self._token = uuid.uuid4().hex[:8]
        self._counter = itertools.count()

    def write(self, data: bytes) -> str:
        """Write and fsync `data` to a fresh temporary file; return its path. The folder must
        exist (the store makes sure of it, as of any folder it writes in)."""
        name = f"{os.getpid()}-{self._token}-{next(self._counter)}"
        tmp = os.path.join(self.folder, name)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        write_and_sync(fd, data, tmp)
        return tmp

    def open(self) -> int:
        """The temporaries' folder, made if missing and opened without following a link: a
        link planted as `.tmp` raises, so nothing is moved into or deleted from its target."""
        with contextlib.suppress(FileExistsError):
            os.mkdir(self.folder)
        return os.open(self.folder, FOLDER)

    def remove_stale(self, older_than_seconds: float, now: float) -> int:
        """Delete temporary files left by crashed writers and entries a clear set aside;
        return how many were removed. Age counts from when an entry was last touched
        (`_born`: for a set-aside entry, no earlier than the clear). One that cannot go yet
        (an NFS `.nfs*` file still open elsewhere) is left for a later sweep, with a warning."""
        try:
            fd = os.open(self.folder, FOLDER)
        except FileNotFoundError:
            return 0
        except OSError as exc:
            logger.warning("temporaries folder %s not swept: %s", self.folder, exc)
            return 0
        removed = 0
        try:
            with os.scandir(fd) as listing:
                items = list(listing)
            for item in items:
                try:
                    if now - _born(item) <= older_than_seconds:
                        continue
                    if item.is_dir(follow_symlinks=False):
                        shutil.rmtree(item.name, dir_fd=fd)
                    else:
                        os.unlink(item.name, dir_fd=fd)
                    removed += 1
                except FileNotFoundError:
                    continue
                except OSError as exc:
                    logger.warning(
                        "temporary %s/%s not removed yet: %s", self.folder, item.name, exc
                    )
        finally:
            os.close(fd)
        return removed


def set_aside_name(now: float) -> str:
    """A fresh name for an entry a clear or a retirement sets aside at `now`."""
    return f"{_SET_ASIDE}-{int(now)}-{uuid.uuid4().hex}"


def _born(item: os.DirEntry[str]) -> float:
    """When a temporary was last touched: its last change or modification (a rename is a
    change on most filesystems, and on NFS the server's clock), or, if later, the time a
    clear set it aside, from its name (a rename may keep the entry's own times)."""
    info = item.stat(follow_symlinks=False)
    touched = max(info.st_mtime, info.st_ctime)
    if item.name.startswith(f"{_SET_ASIDE}-"):
        stamp = item.name[len(_SET_ASIDE) + 1 :].partition("-")[0]
        if stamp.isascii() and stamp.isdigit() and len(stamp) <= 12:
            return max(touched, float(stamp))
    return touched


class _Remover:
    """One background thread per process removing set-aside entries, in the order handed.

    The thread is started when work arrives and ends when none is left; it is not a daemon,
    so a process that exits normally removes everything first. A process killed meanwhile
    leaves the entries to the sweep (`Temporaries.remove_stale`).
    """

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        """A fresh, idle remover: also in a forked child, which has no thread of its own and
        leaves what its parent queued to the parent."""
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._queue: deque[tuple[str, str]] = deque()
        self._running = False

    def add(self, folder: str, names: Iterable[str]) -> None:
        with self._lock:
            self._queue.extend((folder, name) for name in names)
            if self._queue and not self._running:
                self._running = True
                threading.Thread(target=self._run, name="tokcap-set-aside-remover").start()

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._queue:
                    self._running = False
                    self._idle.notify_all()
                    return
                folder, name = self._queue.popleft()
            try:
                _remove_entry(folder, name)
            except Exception:  # never stop the queue: the sweep removes what is left
                logger.exception("set-aside %s/%s left for the sweep", folder, name)

    def wait(self, timeout: float | None) -> bool:
        with self._idle:
            return self._idle.wait_for(lambda: not self._running, timeout)


_REMOVER = _Remover()


def remove_later(folder: str, names: Iterable[str]) -> None:
    """Remove the set-aside entries `names` of the temporaries' `folder` in the background."""
    _REMOVER.add(folder, names)


def wait_removed(timeout: float | None = None) -> bool:
    """Wait until every entry handed to `remove_later` in this process was removed (or left
    to the sweep with a warning); whether that happened within `timeout` seconds."""
    return _REMOVER.wait(timeout)


def _remove_entry(folder: str, name: str) -> None:
    """Remove one set-aside entry through the temporaries' folder, never following a link;
    one that cannot go is logged and left to the sweep."""
    try:
        fd = os.open(folder, FOLDER)
    except OSError as exc:
        logger.warning("set-aside %s/%s left for the sweep: %s", folder, name, exc)
        return
    try:
        if stat.S_ISDIR(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
            shutil.rmtree(name, dir_fd=fd)
        else:
            os.unlink(name, dir_fd=fd)
    except FileNotFoundError:
        pass  # the sweep took it first
    except OSError as exc:
        logger.warning("set-aside %s/%s left for the sweep: %s", folder, name, exc)
    finally:
        os.close(fd)
