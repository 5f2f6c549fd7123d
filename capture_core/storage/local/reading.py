"""Reading a local store's folders: listings, an entry's kind, and a failed access named.

One walk lists the keys below a folder, for the store (folders by name) and for a pinned
view (folders through a descriptor) alike. A folder or entry that cannot be read is an
error, never an omission; a folder that vanishes while listing lists as empty. Symlinks and
special files are not objects the store writes: they raise, naming the key. A permission or
I/O failure becomes the store's error, never "missing".
This module imports only the standard library, `base` and `errors`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable

from capture_core.errors import StoreUnavailableError, UnreadableCaptureError
from capture_core.storage.base import is_reserved

FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW  # open a folder, never through a link

Entries = list[tuple[str, str]]
"""A folder's entries as `(key, kind)`, reserved names left out (see `kind`)."""


def list_tree(prefix: str, entries_of: Callable[[str], Entries]) -> list[str]:
    """Every object key below the folder `prefix`, sorted: `entries_of(folder_key)` reads
    one folder (gone: no entries), and each entry of kind `dir` is read in turn."""
    keys: list[str] = []
    pending = [prefix]
    while pending:
        for key, what in entries_of(pending.pop()):
            if what == "dir":
                pending.append(key)
            elif what == "file":
                keys.append(key)
    return sorted(keys)


def entries_at(path: str, folder_key: str) -> Entries:
    """The entries of the folder at `path`, which holds the keys below `folder_key`."""
    try:
        with os.scandir(path) as listing:
            found = list(listing)
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as exc:
        raise access_error(exc, f"list folder {folder_key}") from exc
    return _entries(found, folder_key)


def entries_through(dir_fd: int, folder: str, folder_key: str) -> Entries:
    """The entries of `folder`, found below the folder `dir_fd` without following a link."""
    try:
        fd = os.open(folder, FOLDER, dir_fd=dir_fd)
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as exc:
        raise access_error(exc, f"list folder {folder_key}") from exc
    try:
        with os.scandir(fd) as listing:
            return _entries(listing, folder_key, fd)
    finally:
        os.close(fd)


def _entries(items: Iterable[os.DirEntry[str]], folder_key: str, fd: int | None = None) -> Entries:
    found: Entries = []
    for item in items:
        if not is_reserved(item.name):
            key = f"{folder_key}/{item.name}"
            found.append((key, kind(item, key, fd)))
    return found


def names_in(path: str, what: str) -> list[str]:
    """The sorted names in the folder at `path` (`what` names it), reserved names left out;
    a folder that does not exist has none."""
    try:
        return sorted(name for name in os.listdir(path) if not is_reserved(name))
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as exc:
        raise access_error(exc, f"list folder {what}") from exc


def kind(item: os.DirEntry[str], key: str, dir_fd: int | None = None) -> str:
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
        raise access_error(exc, f"inspect {key}") from exc
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


def access_error(exc: OSError, what: str) -> OSError:
    """A permission or I/O failure, named, as an error; never read as "missing"."""
    if isinstance(exc, PermissionError):
        return PermissionError(
            f"local store cannot {what}: {exc.strerror or exc} ({exc.filename}); fix the "
            "permissions so the store's user can read and traverse it"
        )
    return StoreUnavailableError(
        f"local store failed to {what}: {exc.strerror or exc} ({exc.filename})"
    )
