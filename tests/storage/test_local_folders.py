"""The local store's memory of folders it created: forgetting is exact and stays small.

A long-lived worker creates a folder per rollout it touches, and each retirement removes
folders again; forgetting one must forget what lies beneath it and nothing else, and leave
no index entry behind, so the memory and the cost of a removal do not grow with the
number of rollouts the process has touched.
"""

from __future__ import annotations

import os

from capture_core.storage import LocalStore
from capture_core.storage.local import _KnownFolders


def test_forgetting_a_folder_forgets_exactly_it_and_what_lies_beneath() -> None:
    known = _KnownFolders("/root")
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
