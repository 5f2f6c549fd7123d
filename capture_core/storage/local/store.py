"""`LocalStore`: the byte store on a local (or locally mounted) POSIX filesystem.

A create writes a temporary file, fsyncs it, publishes it with `os.link` and fsyncs the folder.
`os.link` fails if the name exists, so publication is exclusive and atomic: no torn object.
`create_in_place` (sealed entries, intents) creates the name itself with O_EXCL: one commit
fewer, and a crash may leave it torn, which its readers detect.
Temporary files live in `<root>/.tmp/` (`temporaries`), never beside published objects;
every path removes them. A folder or object that cannot be read is an error, never an
omission; symlinks are refused (`reading`). The sweep and the clear work through a folder
pinned by its descriptor (`pinned`).
This module imports only the standard library, `base`, `errors` and this package's
`durability`, `folder_index`, `pinned`, `reading` and `temporaries`.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterable, Iterator, Sequence

from capture_core.errors import (
    CaptureStoreError,
    InvalidInputError,
    LocationMissingError,
    LocationNotADirectoryError,
    LocationNotWritableError,
    UnreadableCaptureError,
)
from capture_core.storage.base import (
    ByteStore,
    FolderView,
    StagedObject,
    check_key,
    check_new_object,
)
from capture_core.storage.local.durability import (
    GroupDirSync,
    fsync_dir,
    remove_quietly,
    write_and_sync,
)
from capture_core.storage.local.folder_index import KnownFolders
from capture_core.storage.local.pinned import PinnedFolder, pin
from capture_core.storage.local.reading import (
    Entries,
    access_error,
    entries_at,
    list_tree,
    names_in,
)
from capture_core.storage.local.temporaries import Temporaries, remove_later


class LocalStore(ByteStore):
    """A byte store rooted at an absolute local path."""

    shares_staged = True
    round_trips = False

    def __init__(self, root: str) -> None:
        if not os.path.isabs(root):
            raise InvalidInputError(f"local store root {root!r} must be an absolute path")
        self.root = os.path.normpath(root)
        self.url = self.root
        self._known_dirs = KnownFolders(self.root)
        self._dir_sync = GroupDirSync()
        self._temporaries = Temporaries(self.root)

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
            raise access_error(exc, f"read {key}") from exc

    def iter_many(self, keys: Sequence[str], chunk: int = 64) -> Iterator[tuple[str, bytes | None]]:
        """Local reads are cheap: one object at a time keeps memory flat."""
        for key in keys:
            yield key, self.get(key)

    def _write_temporary(self, data: bytes) -> str:
        """Write and fsync `data` to a fresh temporary file; return its path."""
        self._ensure_dir(self._temporaries.folder)
        return self._temporaries.write(data)

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
            remove_quietly(tmp)

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
            write_and_sync(fd, data, target)
            try:
                self._dir_sync.sync(folder)
            except FileNotFoundError:
                # A retirement moved the folder aside, or a delete removed it, after the
                # create: the create happened first, and its writer checks the fence next.
                self._forget_dir(folder)
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
            remove_quietly(tmp)
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
            raise access_error(exc, f"check {key}") from exc
        return True

    def list_prefix(self, prefix: str) -> list[str]:
        """Every key below `prefix`. A folder that cannot be read raises; it is never skipped.

        A folder that vanishes while listing (a concurrent delete) lists as empty, like a
        listing taken a moment later. Symlinks and special files are not objects we write:
        they raise, naming the key, rather than reading as missing.
        """
        return list_tree(check_key(prefix), self._entries)

    def _entries(self, folder_key: str) -> Entries:
        return entries_at(self._path(folder_key), folder_key)

    def list_children(self, prefix: str) -> list[str]:
        folder = self._path(prefix) if prefix else self.root
        return names_in(folder, prefix or "the store root")

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
        return self._pin(prefix)

    def _pin(self, prefix: str) -> contextlib.AbstractContextManager[PinnedFolder]:
        return pin(self.root, prefix, self._known_dirs, self._temporaries)

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
        with self._pin(prefix) as folder:
            try:
                folder.set_aside_reserved()
                folder.remove_empty_folders()
            except OSError as exc:
                raise access_error(exc, f"remove the emptied folders of {prefix}") from exc
        return True

    def move_aside(self, prefix: str, names: Sequence[str]) -> list[str]:
        """`ByteStore.move_aside`: each folder is renamed into `<root>/.tmp/` under a fresh
        set-aside name, through the folder `prefix` pinned by its descriptor (a link is never
        followed). The temporaries are on the root's filesystem unless a mount is planted
        below it; a rename refused so (`EXDEV`) leaves the rest to be deleted in place."""
        with self._pin(prefix) as folder:
            return folder.move_aside(prefix, names)

    def remove_moved(self, moved: Sequence[str]) -> None:
        """`ByteStore.remove_moved`: on this process's background remover (`remove_later`)."""
        if moved:
            remove_later(self._temporaries.folder, moved)

    def remove_stale_temporaries(self, older_than_seconds: float, now: float) -> int:
        """`ByteStore.remove_stale_temporaries`: crashed writers' files and what a clear set
        aside, swept from `<root>/.tmp/` (`Temporaries.remove_stale`)."""
        return self._temporaries.remove_stale(older_than_seconds, now)
