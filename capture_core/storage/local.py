"""`LocalStore`: the byte store on a local (or locally mounted) POSIX filesystem.

A create writes a temporary file, fsyncs it, publishes it with `os.link` and fsyncs the folder.
`os.link` fails if the name exists, so publication is exclusive and atomic: no torn object.
`create_in_place` (sealed entries, intents) creates the name itself with O_EXCL: one commit
fewer, and a crash may leave it torn, which its readers detect.
Temporary files live in `<root>/.tmp/`, never beside published objects; every path removes them.
A folder or object that cannot be read is an error, never an omission; symlinks are refused.
This module imports only the standard library, `base` and `errors`.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence

from capture_core.errors import (
    CaptureStoreError,
    InvalidInputError,
    LocationMissingError,
    LocationNotADirectoryError,
    LocationNotWritableError,
    StoreUnavailableError,
    UnreadableCaptureError,
    error_text,
    is_transient,
)
from capture_core.storage.base import (
    ByteStore,
    FolderView,
    StagedObject,
    check_key,
    check_new_object,
    is_reserved,
)

TMP_DIR = ".tmp"
logger = logging.getLogger(__name__)

_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW  # open a folder, never through a link


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


class _GroupDirSync:
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


class _KnownFolders:
    """Folders this process made sure exist, so a create skips probing for them.

    Forgetting a folder forgets the known folders beneath it too, at a cost in their number,
    not in every folder known: a long-lived worker knows one per rollout it touched.
    """

    def __init__(self, root: str) -> None:
        self._root = root
        self._known: set[str] = set()
        self._beneath: dict[str, set[str]] = {}
        self._lock = threading.Lock()

    def __contains__(self, folder: str) -> bool:
        return folder in self._known

    def add(self, folder: str) -> None:
        with self._lock:
            if folder not in self._known:
                self._known.add(folder)
                for parent in self._parents(folder):
                    self._beneath.setdefault(parent, set()).add(folder)

    def forget(self, folder: str) -> None:
        with self._lock:
            for gone in (folder, *self._beneath.pop(folder, ())):
                if gone not in self._known:
                    continue
                self._known.discard(gone)
                for parent in self._parents(gone):
                    beneath = self._beneath.get(parent)
                    if beneath is not None:
                        beneath.discard(gone)
                        if not beneath:
                            del self._beneath[parent]

    def _parents(self, folder: str) -> Iterator[str]:
        while folder != self._root and folder.startswith(self._root):
            folder = os.path.dirname(folder)
            yield folder


class LocalStore(ByteStore):
    """A byte store rooted at an absolute local path."""

    shares_staged = True
    round_trips = False

    def __init__(self, root: str) -> None:
        if not os.path.isabs(root):
            raise InvalidInputError(f"local store root {root!r} must be an absolute path")
        self.root = os.path.normpath(root)
        self.url = self.root
        self._known_dirs = _KnownFolders(self.root)
        self._dir_sync = _GroupDirSync()
        self._tmp_dir = os.path.join(self.root, TMP_DIR)
        self._tmp_token = uuid.uuid4().hex[:8]
        self._tmp_counter = itertools.count()

    def __reduce__(self) -> tuple[type[LocalStore], tuple[str]]:
        return (LocalStore, (self.root,))

    def _path(self, key: str) -> str:
        return f"{self.root}/{check_key(key)}"

    def _ensure_dir(self, path: str) -> None:
        """Create a folder and its missing parents, fsyncing each parent that gained an entry."""
        if path in self._known_dirs:
            return
        missing: list[str] = []
        probe = path
        while not os.path.isdir(probe):
            missing.append(probe)
            probe = os.path.dirname(probe)
        for folder in reversed(missing):
            try:
                os.mkdir(folder)
            except FileExistsError:
                continue
            fsync_dir(os.path.dirname(folder))
        self._known_dirs.add(path)

    def _forget_dir(self, path: str) -> None:
        self._known_dirs.forget(path)

    def probe(self, must_exist: bool) -> None:
        if os.path.isdir(self.root):
            if not os.access(self.root, os.W_OK):
                raise LocationNotWritableError(
                    f"store root {self.root} is not writable; fix its permissions"
                )
            return
        if os.path.exists(self.root):
            raise LocationNotADirectoryError(f"store root {self.root} is not a directory")
        if must_exist:
            raise LocationMissingError(
                f"store root {self.root} does not exist; check the path (captures live there)"
            )

    def get(self, key: str) -> bytes | None:
        try:
            with open(self._path(key), "rb") as f:
                return f.read()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise _access_error(exc, f"read {key}") from exc

    def iter_many(self, keys: Sequence[str], chunk: int = 64) -> Iterator[tuple[str, bytes | None]]:
        """Local reads are cheap: one object at a time keeps memory flat."""
        for key in keys:
            yield key, self.get(key)

    def _write_temporary(self, data: bytes) -> str:
        """Write and fsync `data` to a fresh temporary file; return its path."""
        self._ensure_dir(self._tmp_dir)
        name = f"{os.getpid()}-{self._tmp_token}-{next(self._tmp_counter)}"
        tmp = os.path.join(self._tmp_dir, name)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        _write_and_sync(fd, data, tmp)
        return tmp

    def create(self, key: str, data: bytes) -> bool:
        check_new_object(key, data)
        with self.staged(data) as staged:
            return self.create_staged(key, staged)

    @contextlib.contextmanager
    def staged(self, data: bytes) -> Iterator[StagedObject]:
        """A durable temporary file holding `data`; each `create_staged` links it."""
        check_new_object("a staged object", data)
        tmp = self._write_temporary(data)
        try:
            yield StagedObject(data, tmp)
        finally:
            _remove_quietly(tmp)

    def create_staged(self, key: str, staged: StagedObject) -> bool:
        """Link the staged file as `key`, then sync its folder: no data write, no data fsync."""
        target = f"{self.root}/{check_new_object(key, staged.data)}"
        if staged.path is None:
            raise InvalidInputError(f"{key}: not staged by this store; use its staged()")
        return self._publish(staged.path, target, os.path.dirname(target))

    def create_in_place(self, key: str, data: bytes) -> bool:
        """O_EXCL create of the final name, write, fsync, fsync of the folder (grouped).

        Exclusive like `create`, with one journal commit fewer and no temporary file: the
        same syscalls as a raw durable create. A failed write removes its own torn object.
        """
        target = f"{self.root}/{check_new_object(key, data)}"
        folder = target.rpartition("/")[0]
        for _attempt in range(3):
            self._ensure_dir(folder)
            try:
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                return False
            except FileNotFoundError:
                self._forget_dir(folder)  # removed by a concurrent delete; recreate it
                continue
            _write_and_sync(fd, data, target)
            self._dir_sync.sync(folder)
            return True
        raise CaptureStoreError(
            f"could not create {target}: its folder keeps disappearing (a concurrent "
            "delete of the rollout?); the write is safe to retry"
        )

    def replace(self, key: str, data: bytes) -> None:
        target = self._path(key)
        folder = os.path.dirname(target)
        tmp = self._write_temporary(data)
        try:
            self._ensure_dir(folder)
            os.replace(tmp, target)
        except BaseException:
            _remove_quietly(tmp)
            raise
        self._dir_sync.sync(folder)

    def _publish(self, tmp: str, target: str, folder: str) -> bool:
        for _attempt in range(3):
            self._ensure_dir(folder)
            try:
                os.link(tmp, target)
            except FileExistsError:
                return False
            except FileNotFoundError:
                if not os.path.exists(tmp):
                    raise CaptureStoreError(
                        f"could not publish {target}: its temporary {tmp} was removed while "
                        "in use (a sweep of temporaries older than an hour, or another tool "
                        "cleaning .tmp/); the write is safe to retry"
                    ) from None
                self._forget_dir(folder)  # removed by a concurrent delete; recreate it
                continue
            try:
                self._dir_sync.sync(folder)
            except FileNotFoundError:
                # A concurrent delete removed the new object and its folder after the link:
                # the create happened, then the delete, so there is nothing left to sync.
                self._forget_dir(folder)
            return True
        raise CaptureStoreError(
            f"could not publish {target}: its folder keeps disappearing (a concurrent "
            "delete of the rollout?); the write is safe to retry"
        )

    def exists(self, key: str) -> bool:
        """Whether the object exists; a permission or I/O error raises instead of reading as no."""
        try:
            os.stat(self._path(key))
        except (FileNotFoundError, NotADirectoryError):
            return False
        except OSError as exc:
            raise _access_error(exc, f"check {key}") from exc
        return True

    def list_prefix(self, prefix: str) -> list[str]:
        """Every key below `prefix`. A folder that cannot be read raises; it is never skipped.

        A folder that vanishes while listing (a concurrent delete) lists as empty, like a
        listing taken a moment later. Symlinks and special files are not objects we write:
        they raise, naming the key, rather than reading as missing.
        """
        keys: list[str] = []
        pending = [check_key(prefix)]
        while pending:
            folder_key = pending.pop()
            try:
                with os.scandir(self._path(folder_key)) as listing:
                    found = list(listing)
            except (FileNotFoundError, NotADirectoryError):
                continue
            except OSError as exc:
                raise _access_error(exc, f"list folder {folder_key}") from exc
            for item in found:
                if is_reserved(item.name):
                    continue
                key = f"{folder_key}/{item.name}"
                kind = _kind(item, key)
                if kind == "dir":
                    pending.append(key)
                elif kind == "file":
                    keys.append(key)
        return sorted(keys)

    def list_children(self, prefix: str) -> list[str]:
        folder = self._path(prefix) if prefix else self.root
        try:
            return sorted(name for name in os.listdir(folder) if not is_reserved(name))
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as exc:
            raise _access_error(exc, f"list folder {prefix or 'the store root'}") from exc

    def delete(self, keys: Iterable[str], *, durable: bool = True) -> None:
        folders: set[str] = set()
        for key in keys:
            path = self._path(key)
            try:
                os.unlink(path)
            except FileNotFoundError:
                continue
            folders.add(os.path.dirname(path))
        for folder in sorted(folders, key=len, reverse=True):
            self._prune(folder, durable)

    def _prune(self, folder: str, durable: bool) -> None:
        """Remove now-empty folders up to the root; `durable`: fsync the first one kept."""
        while folder != self.root and folder.startswith(self.root):
            try:
                os.rmdir(folder)
            except OSError as exc:
                if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
                    if durable:
                        fsync_dir(folder)
                    return
                if exc.errno != errno.ENOENT:
                    raise
            self._forget_dir(folder)
            folder = os.path.dirname(folder)
        if durable:
            fsync_dir(self.root)

    def pinned(self, prefix: str) -> contextlib.AbstractContextManager[FolderView]:
        """The folder `prefix` held open: the view works through its descriptor, so a folder
        removed and made again under that name meanwhile is never reached (`ByteStore`)."""
        return self._pinned_folder(prefix)

    @contextlib.contextmanager
    def _pinned_folder(self, prefix: str) -> Iterator[_PinnedFolder]:
        path = self._path(prefix)
        try:
            fd: int | None = os.open(path, _FOLDER)
        except FileNotFoundError:
            fd = None  # gone already: the view finds nothing and deletes nothing
        except OSError as exc:
            if os.path.islink(path):
                raise UnreadableCaptureError(
                    f"folder {prefix} is a symbolic link; the store never writes links, so it "
                    "was planted or copied in: replace it with the real folder or remove it"
                ) from exc
            if not isinstance(exc, NotADirectoryError):
                raise _access_error(exc, f"open folder {prefix}") from exc
            fd = None  # a file: no folder to find anything in
        try:
            yield _PinnedFolder(self, prefix, fd)
        finally:
            if fd is not None:
                os.close(fd)

    def delete_folder(self, prefix: str) -> bool:
        """`ByteStore.delete_folder`: the store's emptied folders below `prefix` and the folder
        itself are removed. Entries of reserved names in them (an NFS `.nfs*` file, a
        `.DS_Store`) are moved into the temporaries first, so no folder stays under `prefix`:
        a later write makes a new one, never the one a paused sweep may hold. A link or a file
        where the folder should be is refused by name: nothing behind it is listed or deleted."""
        path = self._path(prefix)
        if os.path.islink(path) or (os.path.lexists(path) and not os.path.isdir(path)):
            raise UnreadableCaptureError(
                f"{prefix} in the store root {self.root} is not a folder the store made (a "
                "symbolic link or a file, planted or copied in); nothing was deleted: remove "
                "it or replace it with the real folder, then clear again"
            )
        if not self.delete_prefix(prefix):
            return False
        with self._pinned_folder(prefix) as folder:
            try:
                folder.set_aside_reserved()
                folder.remove_empty_folders()
            except OSError as exc:
                raise _access_error(exc, f"remove the emptied folders of {prefix}") from exc
        return True

    def _open_temporaries(self) -> int:
        """The temporaries' folder, made if missing and opened without following a link: a
        link planted as `.tmp` raises, so nothing is moved into or deleted from its target."""
        with contextlib.suppress(FileExistsError):
            os.mkdir(self._tmp_dir)
        return os.open(self._tmp_dir, _FOLDER)

    def remove_stale_temporaries(self, older_than_seconds: float, now: float) -> int:
        """Delete temporary files left by crashed writers and entries a clear set aside;
        return how many were removed. Age counts from when an entry was last touched
        (`_born`: for a set-aside entry, no earlier than the clear). One that cannot go yet
        (an NFS `.nfs*` file still open elsewhere) is left for a later sweep, with a warning."""
        try:
            fd = os.open(self._tmp_dir, _FOLDER)
        except FileNotFoundError:
            return 0
        except OSError as exc:
            logger.warning("temporaries folder %s not swept: %s", self._tmp_dir, exc)
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
                        "temporary %s/%s not removed yet: %s", self._tmp_dir, item.name, exc
                    )
        finally:
            os.close(fd)
        return removed


_SET_ASIDE = "set-aside"
"""Entries a clear moved into the temporaries are named `set-aside-<unix seconds>-<hex>`."""


def _set_aside_name(now: float) -> str:
    """A fresh name for an entry a clear sets aside at `now`."""
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


def _kind(item: os.DirEntry[str], key: str, dir_fd: int | None = None) -> str:
    """`dir`, `file`, or `gone` (removed while listing); anything else raises, naming the key.
    `dir_fd`: the folder the listing was taken through, for a listing of a descriptor."""
    try:
        if item.is_symlink():
            where = item.path if dir_fd is None else item.name
            target = os.readlink(where, dir_fd=dir_fd)
            state = "dangling" if not _resolves(where, dir_fd) else "pointing elsewhere"
            raise UnreadableCaptureError(
                f"object {key} is a symbolic link ({state}, to {target!r}); the store never "
                "writes links, so it was planted or copied in: replace it with the real object "
                "or remove it"
            )
        if item.is_dir(follow_symlinks=False):
            return "dir"
        if item.is_file(follow_symlinks=False):
            return "file"
    except FileNotFoundError:
        return "gone"
    except OSError as exc:
        raise _access_error(exc, f"inspect {key}") from exc
    raise UnreadableCaptureError(
        f"object {key} is not a regular file (a socket, pipe or device?); move it out of the "
        "store root"
    )


def _resolves(path: str, dir_fd: int | None) -> bool:
    try:
        os.stat(path, dir_fd=dir_fd)
    except OSError:
        return False
    return True


class _PinnedFolder:
    """`FolderView` of one local folder held by its descriptor (`LocalStore.pinned`).

    Keys are resolved below the descriptor, never through the folder's name, so what the
    view reads, lists and deletes is that folder's, whatever now bears its name. `fd` None:
    the folder was gone when pinned.
    """

    def __init__(self, store: LocalStore, prefix: str, fd: int | None) -> None:
        self._store, self._prefix, self._fd = store, check_key(prefix), fd

    def _relative(self, key: str) -> str:
        if key == self._prefix:
            return "."
        if not check_key(key).startswith(f"{self._prefix}/"):
            raise InvalidInputError(f"key {key} is not below the pinned folder {self._prefix}")
        return key[len(self._prefix) + 1 :]

    def get(self, key: str) -> bytes | None:
        if self._fd is None:
            return None
        try:
            with open(self._relative(key), "rb", opener=self._opener) as f:
                return f.read()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise _access_error(exc, f"read {key}") from exc

    def _opener(self, path: str, flags: int) -> int:
        return os.open(path, flags, dir_fd=self._fd)

    def list_prefix(self, prefix: str) -> list[str]:
        """Every key below `prefix` in the pinned folder, as `LocalStore.list_prefix` lists."""
        keys: list[str] = []
        pending = [self._relative(prefix)] if self._fd is not None else []
        while pending:
            folder = pending.pop()
            folder_key = self._prefix if folder == "." else f"{self._prefix}/{folder}"
            try:
                fd = os.open(folder, _FOLDER, dir_fd=self._fd)
            except (FileNotFoundError, NotADirectoryError):
                continue
            except OSError as exc:
                raise _access_error(exc, f"list folder {folder_key}") from exc
            try:
                with os.scandir(fd) as listing:
                    for item in listing:
                        if is_reserved(item.name):
                            continue
                        key = f"{folder_key}/{item.name}"
                        kind = _kind(item, key, fd)
                        if kind == "dir":
                            pending.append(key[len(self._prefix) + 1 :])
                        elif kind == "file":
                            keys.append(key)
            finally:
                os.close(fd)
        return sorted(keys)

    def delete_each(self, keys: Iterable[str], *, durable: bool = True) -> dict[str, str]:
        """Delete objects of the pinned folder like `ByteStore.delete_each`: return each key
        that could not be deleted, with why. Each object is unlinked in its folder, whose last
        part is opened without following a link (the capture layout is one level deep). Then
        the folders left empty are removed, the pinned one only while its name still means it."""
        keys = list(keys)
        failed: dict[str, str] = {}
        if self._fd is None or not keys:
            return failed
        by_folder: dict[str, list[str]] = {}
        for key in keys:
            by_folder.setdefault(os.path.dirname(self._relative(key)), []).append(key)
        for folder, folder_keys in by_folder.items():
            self._unlink_in(folder, folder_keys, failed)
        try:
            self.remove_empty_folders()
        except OSError as exc:
            _report(failed, keys[:1], exc)
        if durable:
            os.fsync(self._fd)
        return failed

    def _unlink_in(self, folder: str, keys: list[str], failed: dict[str, str]) -> None:
        try:
            fd = os.open(folder or ".", _FOLDER, dir_fd=self._fd)
        except FileNotFoundError:
            return  # gone: nothing of it to delete
        except OSError as exc:  # a link or a file where the folder was: never followed
            _report(failed, keys, exc)
            return
        try:
            for key in keys:
                try:
                    os.unlink(os.path.basename(key), dir_fd=fd)
                except FileNotFoundError:
                    continue
                except OSError as exc:
                    _report(failed, [key], exc)
        finally:
            os.close(fd)

    def set_aside_reserved(self) -> None:
        """Move every entry of a reserved name below the pinned folder into the store's
        temporaries, so the folders can be removed. Each folder is opened from its parent's
        descriptor without following a link, so the walk never leaves the pinned folder,
        whatever is renamed meanwhile; it holds one descriptor per level it is down. An entry
        that cannot be moved (a filesystem that refuses, a link planted as `.tmp`) stays,
        with a warning, and keeps its folder."""
        if self._fd is None:
            return
        try:
            temporaries = self._store._open_temporaries()
        except OSError as exc:
            self._warn_kept(self._prefix, exc)
            return
        # (folder, where, its subfolders still to visit: None until it is listed)
        stack: list[tuple[int, str, list[str] | None]] = []
        try:
            stack.append((os.dup(self._fd), self._prefix, None))
            while stack:
                fd, where, below = stack[-1]
                if below is None:
                    below = self._set_aside_in(fd, where, temporaries)
                    stack[-1] = (fd, where, below)
                if not below:
                    stack.pop()
                    os.close(fd)
                    continue
                name = below.pop()
                child = self._open_below(fd, name, f"{where}/{name}")
                if child is not None:
                    stack.append((child, f"{where}/{name}", None))
        finally:
            for fd, _, _ in stack:
                os.close(fd)
            os.close(temporaries)

    def _set_aside_in(self, fd: int, where: str, temporaries: int) -> list[str]:
        """Set aside the reserved entries of one folder; return its subfolders' names."""
        with os.scandir(fd) as listing:
            items = list(listing)
        below = []
        for item in items:
            if is_reserved(item.name):
                try:
                    name = _set_aside_name(time.time())
                    os.rename(item.name, name, src_dir_fd=fd, dst_dir_fd=temporaries)
                except FileNotFoundError:
                    continue  # gone meanwhile
                except OSError as exc:
                    self._warn_kept(f"{where}/{item.name}", exc)
            elif item.is_dir(follow_symlinks=False):
                below.append(item.name)
        return below

    def _open_below(self, fd: int, name: str, where: str) -> int | None:
        """A subfolder opened from its parent, or `None` when it is gone or no folder now."""
        try:
            return os.open(name, _FOLDER, dir_fd=fd)
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                self._warn_kept(where, exc)
            return None

    def _warn_kept(self, where: str, exc: OSError) -> None:
        logger.warning(
            "%s in the store root %s could not be set aside (%s); its folder stays, and the "
            "next write under %s reuses it",
            where,
            self._store.root,
            exc,
            self._prefix,
        )

    def remove_empty_folders(self) -> None:
        """Remove every empty folder of the store's below the pinned one (reserved names are
        not the store's), deepest first, then the pinned folder itself once nothing is left in
        it and its name still means it. A failure other than a folder not being empty raises."""
        if self._fd is None:
            return
        found: list[str] = []
        pending = ["."]
        while pending:
            folder = pending.pop()
            try:
                fd = os.open(folder, _FOLDER, dir_fd=self._fd)
            except OSError:
                continue  # gone, or not ours to open: left as it is
            try:
                with os.scandir(fd) as listing:
                    below = [
                        os.path.normpath(f"{folder}/{item.name}")
                        for item in listing
                        if not is_reserved(item.name) and item.is_dir(follow_symlinks=False)
                    ]
            finally:
                os.close(fd)
            found.extend(below)
            pending.extend(below)
        for folder in reversed(found):
            try:
                os.rmdir(folder, dir_fd=self._fd)
            except OSError as exc:
                if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT):
                    raise
                continue
            self._store._forget_dir(self._store._path(f"{self._prefix}/{folder}"))
        self._remove_pinned()

    def _remove_pinned(self) -> None:
        """Remove the emptied pinned folder by its name, if the name still means it."""
        assert self._fd is not None
        fd = os.open(".", _FOLDER, dir_fd=self._fd)
        try:
            with os.scandir(fd) as listing:
                if next(listing, None) is not None:
                    return  # not empty: nothing to try (a read-only root would refuse anyway)
        finally:
            os.close(fd)
        path = self._store._path(self._prefix)
        pinned = os.fstat(self._fd)
        try:
            named = os.stat(path, follow_symlinks=False)
        except FileNotFoundError:
            return
        if (named.st_dev, named.st_ino) != (pinned.st_dev, pinned.st_ino):
            return  # made again under that name: the newer folder is not ours to remove
        try:
            os.rmdir(path)
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT):
                raise
            return
        self._store._forget_dir(path)


def _report(failed: dict[str, str], keys: list[str], exc: OSError) -> None:
    """Record why `keys` could not be deleted; an unreachable store raises instead."""
    if is_transient(exc):
        raise exc
    for key in keys:
        failed[key] = error_text(exc)


def _access_error(exc: OSError, what: str) -> OSError:
    """A permission or I/O failure, named, as an error; never read as "missing"."""
    if isinstance(exc, PermissionError):
        return PermissionError(
            f"local store cannot {what}: {exc.strerror or exc} ({exc.filename}); fix the "
            "permissions so the store's user can read and traverse it"
        )
    return StoreUnavailableError(
        f"local store failed to {what}: {exc.strerror or exc} ({exc.filename})"
    )


def _write_and_sync(fd: int, data: bytes, path: str) -> None:
    """Write all of `data` to the new file `fd`, fsync and close it; on failure remove `path`."""
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        _remove_quietly(path)
        raise
    os.close(fd)


def _remove_quietly(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
