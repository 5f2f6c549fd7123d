"""Every page the output names exists where tokcap is installed: `tokcap docs TOPIC#SECTION`.

The product's printable strings (every string constant in capture_core, tasks and flows
that is not a docstring) are walked: none names a repository path `docs/NAME.md` (an
installed wheel has none beside the user's files), and each `tokcap docs ...` they name,
and each mask reason's section, prints. `tests/packaging/test_wheel.py` runs the same
references against a virtualenv holding only the built wheel.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

from capture_core.operator.mask_reasons import KINDS, OTHER
from tests.support.pipeline_helpers import REPO, run_cli
from tokcap.flows.cli.checks import UsageError
from tokcap.flows.cli.docs import page, topics

PRODUCT = ("capture_core", "tasks", "flows")
REPO_PATH = re.compile(r"\bdocs/[\w.-]+\.md")
DOCS_REF = re.compile(r"tokcap docs ([a-z][a-z0-9-]*(?:#[a-z0-9-]+)?)")


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            value = body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                found.add(id(value))
    return found


@cache
def printable_strings() -> tuple[tuple[str, str], ...]:
    """(where, text) for every string constant of the product that is not a docstring."""
    found = []
    for package in PRODUCT:
        for path in sorted(Path(REPO, package).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            skip = _docstrings(tree)
            for node in ast.walk(tree):
                text = node.value if isinstance(node, ast.Constant) else None
                if isinstance(text, str) and id(node) not in skip:
                    found.append((f"{path.relative_to(REPO)}:{node.lineno}", text))
    return tuple(found)


def docs_references() -> list[str]:
    """Every `tokcap docs` reference the product can print, mask reason sections included."""
    found = {ref for _, text in printable_strings() for ref in DOCS_REF.findall(text)}
    found |= {DOCS_REF.search(kind.link).group(1) for kind in (*KINDS, OTHER)}
    return sorted(found)


def test_no_printable_string_names_a_repository_docs_path() -> None:
    named = [
        f"{where}: {text[:80]}" for where, text in printable_strings() if REPO_PATH.search(text)
    ]
    assert named == []


def test_the_walk_finds_the_references_it_checks() -> None:
    references = docs_references()
    assert "mask-reasons" in references and "pipeline#the-inbox" in references
    assert "mask-reasons#version-skew" in references and len(references) > 15


@pytest.mark.parametrize("reference", docs_references())
def test_each_named_page_and_section_prints(reference: str) -> None:
    section = reference.partition("#")[2]
    text = page(reference)
    assert text.strip(), reference
    if section:
        heading = text.splitlines()[0]
        assert heading.startswith("#") and section.split("-")[0] in heading.lower(), heading


def test_docs_lists_the_pages_and_refuses_an_unknown_one_naming_the_close_match() -> None:
    listed = run_cli(["docs"], None)
    assert listed.returncode == 0, listed.stderr
    assert set(topics()) == {Path(p).stem for p in Path(REPO, "docs").glob("*.md")}
    assert all(any(line.startswith(t) for line in listed.stdout.splitlines()) for t in topics())
    wrong = run_cli(["docs", "mask-reason"], None)
    assert wrong.returncode == 2 and wrong.stdout == ""
    assert "did you mean mask-reasons?" in wrong.stderr
    with pytest.raises(UsageError, match="no section 'nowhere'; its sections: .*version-skew"):
        page("mask-reasons#nowhere")


def test_a_section_runs_past_comments_in_its_code_blocks() -> None:
    """A `# comment` line in a fenced code block is code, not a heading that ends a section."""
    text = page("dataset#rowstream-every-run-of-a-destination-across-ranks")
    assert "# One reader feeding a single-controller trainer" in text
    assert "# N data-parallel ranks, each reading its own share directly:" in text
    assert text.count("\n## ") == 0, "the section stops at the next heading of its level"
    with pytest.raises(UsageError) as unknown:
        page("dataset#no-such-section")
    assert "one-reader-feeding" not in str(unknown.value), "code comments are not sections"
