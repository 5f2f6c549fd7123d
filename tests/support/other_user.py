"""Run a Python check as a user that file modes bind, from a clone anywhere.

Root ignores file modes, so as root the check runs as `nobody` (uid 65534 where no such
user exists); any other user keeps its own uid, which modes already bind.
The subprocess starts as the invoking user, runs `prepare` (the imports) and only then drops
its privileges, so the other user never has to reach the clone, its virtual environment or
the interpreter: a clone in a 0700 folder works, as does a Python under a 0700 home.
After `prepare` every import is refused, as any user and from any location, so a check that
passes here passes from any clone: import everything the check needs in `prepare`.
This is the one place a test changes user; tests/packaging/test_other_user.py checks that.
"""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NOBODY_ID = 65534

DROP_PRIVILEGES = """
import os as _os

_os.setgroups([])
_os.setresgid({gid}, {gid}, {gid})
_os.setresuid({uid}, {uid}, {uid})
assert _os.geteuid() == {uid} and _os.getegid() == {gid}, "privileges were not dropped"
"""

REFUSE_IMPORTS = """
import sys as _sys


class _RefuseImports:
    def find_spec(self, name, path=None, target=None):
        raise ImportError(f"{name} imported by the check: import it in `prepare`")


_sys.meta_path.insert(0, _RefuseImports())
"""


def other_ids() -> tuple[int, int] | None:
    """(uid, gid) the check runs as when it is not the invoking user (as root), else None."""
    if os.geteuid() != 0:
        return None
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        return NOBODY_ID, NOBODY_ID
    return nobody.pw_uid, nobody.pw_gid


def hand_over(root: str) -> None:
    """Give every folder and file under `root` to the check's user, so only modes decide.

    A no-op when the check runs as the invoking user, who owns them already.
    """
    ids = other_ids()
    if ids is None:
        return
    for path, _dirs, files in os.walk(root):
        for name in [path, *(os.path.join(path, f) for f in files)]:
            os.chown(name, ids[0], -1)


@contextmanager
def traversable_folder() -> Iterator[str]:
    """A fresh folder the check's user can reach (not pytest's private temp tree), removed after.

    Fails naming the ancestor when the temporary folder lies under one that user cannot
    traverse, since the check could then not reach the store for a reason the test did not set.
    """
    path = tempfile.mkdtemp(prefix="tokcap-perm-")
    try:
        os.chmod(path, 0o755)
        if other_ids() is not None:
            for parent in Path(path).parents:
                if not os.stat(parent).st_mode & stat.S_IXOTH:
                    raise RuntimeError(
                        f"{parent} cannot be traversed by another user, so a check run as one "
                        f"cannot reach {path}: set TMPDIR to a folder others can traverse"
                    )
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def run_as_other_user(
    prepare: str, check: str, *args: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run `prepare` as the invoking user, then `check` as a user modes bind; `args` in sys.argv."""
    ids = other_ids()
    drop = "" if ids is None else DROP_PRIVILEGES.format(uid=ids[0], gid=ids[1])
    program = "\n".join([prepare, drop, REFUSE_IMPORTS, check])
    return subprocess.run(
        [sys.executable, "-c", program, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )
