"""The pinned view: one local folder held by its descriptor, for the sweep and the clear.

`pin` opens a store folder without following a link and yields a `PinnedFolder` (the
`FolderView` of `LocalStore.pinned`). Its reads, listings and deletes resolve keys below the
descriptor, never through the folder's name, so a pass that paused between judging a
rollout's objects and deleting them reaches none of a folder made again under that name.
The clear also uses it to set reserved entries aside into the temporaries and to remove the
emptied folders, the pinned one only while its name still means it.
This module imports only the standard library, `base`, `errors`, `folder_index`, `reading`
and `temporaries`.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
import time
from collections.abc import Iterable, Iterator

from capture_core.errors import (
    InvalidInputError,
    UnreadableCaptureError,
    error_text,
    is_transient,
)
from capture_core.storage.base import check_key, is_reserved
from capture_core.storage.local.folder_index import KnownFolders
from capture_core.storage.local.reading import (
    FOLDER,
    Entries,
    access_error,
    entries_through,
    list_tree,
)
from capture_core.storage.local.temporaries import Temporaries, set_aside_name

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def pin(
    root: str, prefix: str, known: KnownFolders, temporaries: Temporaries
) -> Iterator[PinnedFolder]:
    """The folder `prefix` of the store at `root`, held open while the view is in use.

    A folder gone already yields a view that finds and deletes nothing; so does a file where
    the folder should be. A link there is refused by name and never followed.
    """
    path = f"{root}/{check_key(prefix)}"
    try:
        fd: int | None = os.open(path, FOLDER)
    except FileNotFoundError:
        fd = None  # gone already: the view finds nothing and deletes nothing
    except OSError as exc:
        if os.path.islink(path):
            raise UnreadableCaptureError(
                f"folder {prefix} is a symbolic link; the store never writes links, so it "
                "was planted or copied in: replace it with the real folder or remove it"
            ) from exc
        if not isinstance(exc, NotADirectoryError):
            raise access_error(exc, f"open folder {prefix}") from exc
        fd = None  # a file: no folder to find anything in
    try:
        yield PinnedFolder(root, prefix, fd, known, temporaries)
    finally:
        if fd is not None:
            os.close(fd)


class PinnedFolder:
    """`FolderView` of one local folder held by its descriptor (`LocalStore.pinned`).

    Keys are resolved below the descriptor, never through the folder's name, so what the
    view reads, lists and deletes is that folder's, whatever now bears its name. `fd` None:
    the folder was gone when pinned.
    """

    def __init__(
        self,
        root: str,
        prefix: str,
        fd: int | None,
        known: KnownFolders,
        temporaries: Temporaries,
    ) -> None:
        self._root, self._prefix, self._fd = root, check_key(prefix), fd
        self._known, self._temporaries = known, temporaries

    def _path(self, key: str) -> str:
        """The path that names `key` now (which may no longer be the pinned folder's)."""
        return f"{self._root}/{check_key(key)}"

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
            raise access_error(exc, f"read {key}") from exc

    def _opener(self, path: str, flags: int) -> int:
        return os.open(path, flags, dir_fd=self._fd)

    def list_prefix(self, prefix: str) -> list[str]:
        """Every key below `prefix` in the pinned folder, as `LocalStore.list_prefix` lists."""
        if self._fd is None:
            return []
        self._relative(prefix)
        return list_tree(prefix, self._entries)

    def _entries(self, folder_key: str) -> Entries:
        assert self._fd is not None
        return entries_through(self._fd, self._relative(folder_key), folder_key)

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
            fd = os.open(folder or ".", FOLDER, dir_fd=self._fd)
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
            temporaries = self._temporaries.open()
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

    def move_aside(self, prefix: str, names: Iterable[str]) -> list[str]:
        """Move each folder `name` directly below the pinned one (`prefix`) into the store's
        temporaries with one rename, under a fresh set-aside name; return those names. An
        entry that is missing or no folder (a planted link stays, for the listing to refuse by
        name) is not moved. A rename the filesystem refuses (`EXDEV`: the temporaries on another
        filesystem) stops the moves with a warning naming why; the caller deletes the rest."""
        moved: list[str] = []
        if self._relative(prefix) != ".":
            raise InvalidInputError(f"{prefix} is not the pinned folder {self._prefix}")
        if self._fd is None:
            return moved
        try:
            temporaries = self._temporaries.open()
        except OSError as exc:
            self._warn_not_moved(exc)
            return moved
        try:
            for name in names:
                try:
                    info = os.stat(name, dir_fd=self._fd, follow_symlinks=False)
                    if not stat.S_ISDIR(info.st_mode):
                        continue
                    aside = set_aside_name(time.time())
                    os.rename(name, aside, src_dir_fd=self._fd, dst_dir_fd=temporaries)
                except FileNotFoundError:
                    continue
                except OSError as exc:
                    self._warn_not_moved(exc)
                    break
                moved.append(aside)
                self._known.forget(self._path(f"{self._prefix}/{name}"))
        finally:
            os.close(temporaries)
        return moved

    def _warn_not_moved(self, exc: OSError) -> None:
        logger.warning(
            "folders of %s in the store root %s not moved into the temporaries (%s); they are "
            "deleted object by object instead",
            self._prefix,
            self._root,
            exc,
        )

    def _set_aside_in(self, fd: int, where: str, temporaries: int) -> list[str]:
        """Set aside the reserved entries of one folder; return its subfolders' names."""
        with os.scandir(fd) as listing:
            items = list(listing)
        below = []
        for item in items:
            if is_reserved(item.name):
                try:
                    name = set_aside_name(time.time())
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
            return os.open(name, FOLDER, dir_fd=fd)
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                self._warn_kept(where, exc)
            return None

    def _warn_kept(self, where: str, exc: OSError) -> None:
        logger.warning(
            "%s in the store root %s could not be set aside (%s); its folder stays, and the "
            "next write under %s reuses it",
            where,
            self._root,
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
                fd = os.open(folder, FOLDER, dir_fd=self._fd)
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
            self._known.forget(self._path(f"{self._prefix}/{folder}"))
        self._remove_pinned()

    def _remove_pinned(self) -> None:
        """Remove the emptied pinned folder by its name, if the name still means it."""
        assert self._fd is not None
        fd = os.open(".", FOLDER, dir_fd=self._fd)
        try:
            with os.scandir(fd) as listing:
                if next(listing, None) is not None:
                    return  # not empty: nothing to try (a read-only root would refuse anyway)
        finally:
            os.close(fd)
        path = self._path(self._prefix)
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
        self._known.forget(path)


def _report(failed: dict[str, str], keys: list[str], exc: OSError) -> None:
    """Record why `keys` could not be deleted; an unreachable store raises instead."""
    if is_transient(exc):
        raise exc
    for key in keys:
        failed[key] = error_text(exc)
