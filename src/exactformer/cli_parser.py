"""The command line's argument parser and what every command shares: argument types, usage
errors as one line with a suggestion, the progress option, reading a dataset for a model.

A mistyped command, option or choice (``--atention``, ``--attention sofmax``) gets the
nearest known word, found by difflib, in the one-line error (docs/cli.md).
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import math
import re
import sys

from .data import DatasetError, load_dataset
from .data.text import read_vocabulary
from .numbers import normal_positive, parse_exact
from .verification import check_kind


class UsageError(Exception):
    """A request the CLI cannot honour; printed as an error with exit status 2."""


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


# ------------------------------------------------------------------------------ argument types
def int_at_least(low: int):
    """An argparse type: an integer >= ``low``."""
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if v < low:
            raise argparse.ArgumentTypeError(f"{v} is not an integer >= {low}")
        return v
    return parse


positive_int = int_at_least(1)


def float_at_least(low: float, strict: bool):
    """An argparse type: a finite float above ``low`` (or at least ``low``)."""
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(v) or v < low or (strict and v == low):
            bound = f"> {low:g}" if strict else f">= {low:g}"
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number {bound}")
        return v
    return parse


positive_float = float_at_least(0.0, strict=True)
nonnegative_float = float_at_least(0.0, strict=False)


def exact_tau(text: str):
    """A softmax temperature given exactly ("1/64", "0.5"): positive and finite."""
    try:
        v = parse_exact(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{text!r} is not an exact number ({e})"[:200]) \
            from None
    try:
        return normal_positive(v, "--tau")
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def position(text: str) -> tuple[int, int]:
    """An argparse type: "j,t", a sequence and a position in it."""
    try:
        j, t = (int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not j,t (two integers)") from None
    return j, t


def pair_or_position(text: str) -> tuple[int, int | None]:
    """An argparse type: "j" (a pair) or "j,t" (a causal position)."""
    if "," in text:
        return position(text)
    try:
        return int(text), None
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not j or j,t") from None


# ------------------------------------------------------------------------------ shared by commands
def add_progress(p: argparse.ArgumentParser) -> None:
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bars on stderr (default: only when it is a terminal)")


def progress_on(args) -> bool:
    """--progress/--no-progress, by default on only when stderr is a terminal."""
    return sys.stderr.isatty() if args.progress is None else args.progress


def data_for(model, path: str, vocabulary: str | None = None):
    """The dataset at ``path``, of the model's kind (causal or set), or a UsageError naming it;
    with the ``vocabulary`` file's vectors attached (runtime proofs then judge decoding,
    docs/numerics.md#decoding-to-a-vocabulary)."""
    data = load_dataset(path, causal=model.causal)
    try:
        check_kind(model, data)
    except ValueError as e:
        raise UsageError(f"{path}: {e}") from None
    if vocabulary is None:
        return data
    if not model.causal:
        raise UsageError("--vocabulary is for causal models (text data)")
    try:
        return data.with_vocabulary(read_vocabulary(vocabulary)[1])
    except DatasetError as e:
        raise UsageError(f"{vocabulary}: {e}") from None


def torch_module(name: str, command: str):
    """exactformer.<name> (which imports torch), or a UsageError saying how to install it."""
    try:
        return importlib.import_module(f"exactformer.{name}")
    except ImportError as e:
        raise UsageError(f"{command} needs PyTorch and safetensors (pip install "
                         f"'exactformer[torch]'): {e}") from None
