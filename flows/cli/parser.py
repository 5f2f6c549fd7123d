"""The `tokcap` argument parser: one-line usage errors (exit 2) that name the command and,
for a mistyped option, command or choice, the close match.

Python 3.11's argparse reports an unknown option of a subcommand from the top-level parser
(`tokcap: unrecognized arguments`) and suggests nothing; here the subcommand reports it,
with its own `--help`, and `difflib` supplies the suggestion.
"""

from __future__ import annotations

import argparse
import difflib
import re
from collections.abc import Sequence
from typing import Any, NoReturn

CHOICE = re.compile(r"invalid choice: '([^']*)' \(choose from (.*)\)")


class Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line, with a close match, exit 2."""

    commands: argparse._SubParsersAction | None = None

    def add_subparsers(self, **kwargs: Any) -> argparse._SubParsersAction:
        self.commands = super().add_subparsers(**kwargs)
        return self.commands

    def error(self, message: str) -> NoReturn:
        self.exit(
            2, f"{self.prog}: {message}{self.close_match(message)} (see {self.prog} --help)\n"
        )

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> argparse.Namespace:
        """Parse; arguments no parser took are refused by the (sub)command they follow."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            self.chosen(parsed).unrecognized(extras)
        return parsed

    def chosen(self, parsed: argparse.Namespace) -> Parser:
        """The innermost (sub)command parser the parsed arguments selected."""
        if self.commands is None:
            return self
        picked = self.commands.choices.get(getattr(parsed, self.commands.dest, None) or "")
        return picked.chosen(parsed) if isinstance(picked, Parser) else self

    def unrecognized(self, extras: list[str]) -> NoReturn:
        self.error(f"unrecognized arguments: {' '.join(extras)}")

    def close_match(self, message: str) -> str:
        """`; did you mean X?` for a mistyped option or choice of this parser, else ``."""
        if message.startswith("unrecognized arguments: "):
            known = [s for action in self._actions for s in action.option_strings]
            typed = [a.split("=", 1)[0] for a in message.split(": ", 1)[1].split()]
            options = [a for a in typed if a.startswith("--")]
            found = [m for a in options for m in difflib.get_close_matches(a, known, n=1)]
        else:
            choice = CHOICE.search(message)
            if choice is None:
                return ""
            choices = re.findall(r"'([^']*)'", choice.group(2))
            found = difflib.get_close_matches(choice.group(1), choices, n=1)
        return f"; did you mean {', '.join(dict.fromkeys(found))}?" if found else ""
