"""Checks run as another user need nothing from the clone, so the suite passes from any folder.

A clone in a 0700 folder (as `mktemp -d` makes, and many home folders are) cannot be reached
by another user; tests/support/other_user.py loads the code first and changes user after.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from tests.support.other_user import other_ids, run_as_other_user, traversable_folder

ROOT = Path(__file__).resolve().parents[2]
HELPER = ROOT / "tests" / "support" / "other_user.py"
CHANGES_USER = re.compile(
    r"\bsetpriv\b|\bset(?:res|re|e)?[ug]id\(|\bsetgroups\(|\bpreexec_fn\b|\brunuser\b"
    r"|\bsudo\b|[\"']su[\"']|\b(?:user|group|extra_groups)="
)


def test_the_check_runs_code_loaded_from_a_folder_the_other_user_cannot_enter(tmp_path) -> None:
    private = tmp_path / "clone"
    private.mkdir(mode=0o700)
    (private / "private_module.py").write_text("ANSWER = 'loaded from the private folder'\n")
    result = run_as_other_user(
        f"import os, sys\nsys.path.insert(0, {str(private)!r})\nimport private_module",
        "print(private_module.ANSWER, os.geteuid())\n"
        "try:\n    os.listdir(sys.path[0])\nexcept PermissionError:\n    print('private')\n",
    )
    assert result.returncode == 0, result.stderr
    ids = other_ids()
    expected = f"loaded from the private folder {os.geteuid() if ids is None else ids[0]}\n"
    if ids is not None:  # as root the check runs as a user the 0700 folder keeps out
        expected += "private\n"
    assert result.stdout == expected, result


def test_the_check_meets_a_real_permission_error_as_any_user() -> None:
    with traversable_folder() as path:
        locked = os.path.join(path, "locked")
        os.mkdir(locked, mode=0)
        try:
            result = run_as_other_user(
                "import os, sys",
                "try:\n    os.listdir(sys.argv[1])\n"
                "except PermissionError as exc:\n    print('refused', exc.errno)\n",
                locked,
            )
        finally:
            os.chmod(locked, 0o755)  # so the owner, when not root, can remove it
    assert result.returncode == 0, result.stderr
    assert result.stdout == "refused 13\n", result.stdout


def test_an_import_in_the_check_is_refused_by_name() -> None:
    result = run_as_other_user("import sys", "import colorsys")
    assert result.returncode != 0
    assert "colorsys imported by the check: import it in `prepare`" in result.stderr, result


def test_no_test_changes_user_except_through_the_shared_helper() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for folder in ("tests", "capture_core/testing", "bench")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if path not in (HELPER, Path(__file__).resolve())
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if CHANGES_USER.search(line)
    ]
    assert offenders == [], "change user only through tests/support/other_user.py"
