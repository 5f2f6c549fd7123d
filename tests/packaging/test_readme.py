"""What the README and the docs tell a user to type or copy is true of the code.

Every `tokcap` command they quote parses with the real parser, the Commands synopsis lists
every option, the ledger fields listed are the ledger's, every S3 bucket named is a valid
bucket name, the library example (docs/nemo-gym.md) runs as printed and hands off for real,
and the README stays a guide: short, with one line per figure.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from capture_core.run.run_layout import LedgerLine
from capture_core.store import TokenCaptureStore
from tests.support.pipeline_helpers import REPO, make_batch, write_rollouts
from tokcap.flows.cli.arguments import build_parser

ROOT = Path(REPO)
DOCS = [
    ROOT / "README.md",
    ROOT / "pyproject.toml",
    ROOT / "deployments" / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
]
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
OPTION = re.compile(r"(?<![\w-])--[a-z][a-z-]*")
BUCKET = re.compile(r"s3a?://([^/\s`\"')]*)")


def readme() -> str:
    return (ROOT / "README.md").read_text(encoding="utf-8")


def nemo_gym_doc() -> str:
    """docs/nemo-gym.md, which holds the library example the README points to."""
    return (ROOT / "docs" / "nemo-gym.md").read_text(encoding="utf-8")


def quoted_code(text: str) -> list[str]:
    """Each fenced code line (continuations joined) and each inline code span of `text`."""
    spans = []
    for block in FENCE.findall(text):
        spans += block.replace("\\\n", " ").splitlines()
    spans += re.findall(r"`([^`]+)`", FENCE.sub("", text))
    return spans


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """Each command's parser by its words (`finalize`, `automations apply`)."""
    found: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                nested = subparsers(sub)
                found.update({f"{name} {verb}": p for verb, p in nested.items()} or {name: sub})
    return found


def options_of(parser: argparse.ArgumentParser) -> set[str]:
    return {o for a in parser._actions for o in a.option_strings if o.startswith("--")} - {"--help"}


COMMANDS = subparsers(build_parser())


def invocations(span: str) -> list[tuple[str, list[str]]]:
    """The `tokcap <command> --option...` invocations in one quoted span."""
    found = []
    for match in re.finditer(
        r"\btokcap ([a-z][a-z-]*(?: [a-z]+)?)((?:(?!\btokcap )[^#|;&])*)", span
    ):
        words = match.group(1)
        command = words if words in COMMANDS else words.split(" ")[0]
        rest = match.group(2) if command == words else words[len(command) :] + match.group(2)
        found.append((command, OPTION.findall(rest)))
    return found


def test_every_quoted_tokcap_command_parses() -> None:
    wrong = []
    for path in DOCS:
        for span in quoted_code(path.read_text(encoding="utf-8")):
            for command, options in invocations(span):
                if command == "automations":
                    command = "automations apply"
                if command not in COMMANDS and not options:
                    continue  # prose: "the tokcap command line"
                if command not in COMMANDS:
                    wrong.append(f"{path.name}: `{span.strip()}`: no command {command!r}")
                    continue
                unknown = sorted(set(options) - options_of(COMMANDS[command]))
                if unknown:
                    wrong.append(f"{path.name}: `{span.strip()}`: {command} has no {unknown}")
    assert wrong == []


def test_the_quoted_commands_are_found() -> None:
    """The check above reads what it should: pyproject's deployment hint among them."""
    spans = quoted_code((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert ("deployments", []) in [i for span in spans for i in invocations(span)]
    assert ("status", ["--dest", "--run-id", "--json"]) in invocations(
        "tokcap status --dest URL --run-id ID [--json]"
    )
    assert invocations("tokcap deployments --path") == [("deployments", ["--path"])]


def commands_synopsis() -> str:
    text = readme()
    start = text.index("## Commands")
    return FENCE.search(text, start).group(1)


def test_the_commands_synopsis_lists_every_command_and_option() -> None:
    synopsis = commands_synopsis()
    for words, parser in COMMANDS.items():
        assert f"tokcap {words}" in synopsis or f"tokcap {words.split()[0]}" in synopsis, words
        missing = options_of(parser) - set(OPTION.findall(synopsis))
        assert not missing, f"tokcap {words}: {sorted(missing)} missing from the synopsis"


def test_the_pipeline_doc_lists_every_ledger_field() -> None:
    text = (ROOT / "docs" / "pipeline.md").read_text(encoding="utf-8")
    start = text.index("**Run ledger**")
    paragraph = text[start : text.index("\n\n", start)]
    assert set(re.findall(r"`(\w+)`", paragraph)) >= set(LedgerLine.model_fields), paragraph


README_LINES = 300  # 260, the gateway's section and synopsis, the stream, the layout's rooms;
# 300: `tokcap docs`, the run states and what a new user sees around the temporary server


def test_the_readme_is_a_guide_not_a_log() -> None:
    """What tokcap is, how to start, what to type and read; detail and history live in docs/."""
    text = readme()
    assert len(text.splitlines()) <= README_LINES
    sections = re.findall(r"^## (.+)$", text, re.MULTILINE)
    assert sections[:3] == ["Quick start", "Concepts", "Commands"], sections
    table = text[text.index("## Figures") :]
    rows = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    assert rows and all(line.count("|") == 5 for line in rows), "figure, now, goal, bench"


def valid_bucket(name: str) -> bool:
    """S3's rule: 3-63 lowercase letters, digits, dots and hyphens, a letter or digit at each
    end, no two dots together."""
    return bool(re.fullmatch(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]", name)) and ".." not in name


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_s3_bucket_named_in_the_docs_is_valid(path: Path) -> None:
    buckets = set(BUCKET.findall(path.read_text(encoding="utf-8"))) - {""}
    assert [b for b in buckets if not valid_bucket(b)] == []


def test_the_bucket_rule_refuses_short_names() -> None:
    assert not valid_bucket("rl") and not valid_bucket("b") and valid_bucket("rl-data")


def library_example() -> str:
    blocks = [b for b in FENCE.findall(nemo_gym_doc()) if "finalize_and_hand_off" in b]
    assert len(blocks) == 1, "one library example ends with a handoff"
    return blocks[0]


def test_the_library_example_runs_hands_off_and_retires_only_after(tmp_path) -> None:
    store = TokenCaptureStore(str(tmp_path / "captures"))
    records = make_batch(store, 3, masked={1})
    write_rollouts(str(tmp_path / "rollouts.jsonl"), records)
    (tmp_path / "example.py").write_text(library_example(), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": REPO}
    run = [sys.executable, "example.py"]
    done = subprocess.run(run, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "handed off 3 records to handoff/records/, retired 2 captures" in done.stdout
    part = (tmp_path / "handoff" / "records" / "part-00000.jsonl").read_bytes()
    handed = [orjson.loads(line) for line in part.splitlines()]
    assert [r.get("mask_sample", False) for r in handed] == [False, True, False]
    assert handed[1]["_ng_token_capture"]["roots"] == 2, "the masked record says why"
    assert store.read_entries("7-1"), "the masked rollout's capture is kept as evidence"
    assert not store.read_entries("7-0") and not store.read_entries("7-2")

    again = subprocess.run(run, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 1 and "HandoffConflictError" in again.stderr, again.stderr[-2000:]
    assert (tmp_path / "handoff" / "records" / "part-00000.jsonl").read_bytes() == part
