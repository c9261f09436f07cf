"""The command line's argument parser: usage errors as one line with a suggestion.

A mistyped command, option or choice (``--atention``, ``--attention sofmax``) gets the
nearest known word, found by difflib, in the one-line error (docs/cli.md).
"""

from __future__ import annotations

import argparse
import difflib
import re


class SuggestingParser(argparse.ArgumentParser):
    """Usage errors as one line on stderr, exit status 2, like every other error, with the
    nearest command, option or choice when the word looks mistyped."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}{_did_you_mean(self, message)} "
                     f"(see {self.prog} --help)\n")


def _did_you_mean(parser: argparse.ArgumentParser, message: str) -> str:
    """"; did you mean X?" for an invalid choice (a command, ``--attention sofmax``) or an
    unrecognised option (``--atention``), X the closest known word; else ""."""
    choice = re.search(r"invalid choice: '?([^'\s]*)'? \(choose from (.*)\)", message)
    if choice:
        word = choice.group(1)
        known = [c.strip().strip("'\"") for c in choice.group(2).split(",")]
    else:
        unknown = re.search(r"unrecognized arguments: (-\S+)", message)
        if not unknown:
            return ""
        word, known = unknown.group(1).split("=")[0], sorted(_option_strings(parser))
    close = difflib.get_close_matches(word, known, n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


def _option_strings(parser: argparse.ArgumentParser) -> set[str]:
    """Every option string of the parser and of its commands' parsers."""
    out: set[str] = set()
    for action in parser._actions:
        out.update(s for s in action.option_strings if s.startswith("--"))
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out |= _option_strings(sub)
    return out
