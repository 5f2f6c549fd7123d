"""`tokcap docs [TOPIC[#SECTION]]`: print a page the output names, from the installed package.

Messages and reports name a page as `tokcap docs TOPIC#SECTION` in their text (a mask
reason's section by its kind's `link`), never as a repository path: an installed wheel has
no `docs/` folder beside the user's files. The pages ship as package data of `tokcap.docs`;
SECTION is a heading's anchor (lower case, dashes).
"""

from __future__ import annotations

import argparse
import difflib
import re
from importlib import resources
from typing import Any

from tokcap.flows.cli.checks import UsageError

PACKAGE = "tokcap.docs"
_HEADING = re.compile(r"^(#{1,6})\s+(.*\S)\s*$")


def topics() -> dict[str, str]:
    """Every shipped page by topic (its file name without `.md`), with its first heading."""
    found = {}
    for entry in resources.files(PACKAGE).iterdir():
        if entry.name.endswith(".md"):
            first = entry.read_text(encoding="utf-8").split("\n", 1)[0]
            found[entry.name[: -len(".md")]] = first.lstrip("# ").strip()
    return dict(sorted(found.items()))


def anchor(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, dashes."""
    kept = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return kept.replace(" ", "-")


def page(reference: str) -> str:
    """The text `tokcap docs REFERENCE` prints: a page, or one section of it (to the next
    heading of its level or above). `UsageError` names what exists for an unknown one."""
    topic, _, section = reference.partition("#")
    known = topics()
    if topic not in known:
        close = difflib.get_close_matches(topic, known, n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        raise UsageError(f"no page {topic!r}; {hint}the pages: {', '.join(known)}")
    text = resources.files(PACKAGE).joinpath(f"{topic}.md").read_text(encoding="utf-8")
    return text if not section else _section(text, topic, section)


def _headings(lines: list[str]) -> list[tuple[int, re.Match[str]]]:
    """Each heading's line and match; a `#` line inside a fenced code block is code."""
    found, fenced = [], False
    for i, line in enumerate(lines):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and (match := _HEADING.match(line)):
            found.append((i, match))
    return found


def _section(text: str, topic: str, section: str) -> str:
    lines = text.splitlines()
    starts = _headings(lines)
    for at, (i, found) in enumerate(starts):
        if anchor(found.group(2)) != section:
            continue
        level = len(found.group(1))
        ends = [j for j, m in starts[at + 1 :] if len(m.group(1)) <= level]
        return "\n".join(lines[i : ends[0] if ends else len(lines)]).rstrip() + "\n"
    sections = ", ".join(anchor(m.group(2)) for _, m in starts[1:])
    raise UsageError(f"page {topic} has no section {section!r}; its sections: {sections}")


def add_docs_command(commands: Any) -> None:
    """The `docs` subcommand."""
    docs = commands.add_parser("docs", help="print a page the output names (tokcap docs TOPIC)")
    docs.add_argument(
        "topic",
        nargs="?",
        metavar="TOPIC[#SECTION]",
        help="a page, or one section of it; without it, the list of pages",
    )


def cmd_docs(args: argparse.Namespace) -> int:
    if not args.topic:
        width = max(map(len, topics()))
        for topic, title in topics().items():
            print(f"{topic:<{width}}  {title}")
        return 0
    print(page(args.topic), end="")
    return 0
