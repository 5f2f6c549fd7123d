"""The local store's folder index: the folders this process made sure exist.

A create whose folder is in the index skips probing the disk for it. A delete that removes
a folder forgets it and every known folder beneath it, at a cost in their number, not in
every folder known: a long-lived worker knows one per rollout it touched, and retiring a
rollout leaves no entry of it behind.
This module imports only the standard library.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator


class KnownFolders:
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
