"""The one reading rule for numbers in JSON data and vocabulary files (docs/problem.md#numbers).

A bare JSON number is a binary float64, the value Python's ``json`` gives it, just as a Python
float handed to ``from_arrays`` is: ``0.631`` in a file and ``0.631`` in an array are the same
dataset. An exact value is written as a string (``"631/1000"``, ``"0.631"``, ``"1e-3"``). A file
may say so once for all its numbers: ``"number": "rational"`` reads bare numbers exactly as
written (decimals as rationals), ``"number": "float64"`` reads every number, strings included,
as the nearest float64. Files written by ``Dataset.to_json_dict`` and
``CausalDataset.to_json_dict`` carry ``"number"``, so they read back identical values.
"""

from __future__ import annotations

import json
import math
from fractions import Fraction
from pathlib import Path

from ..numbers import NumberError, parse_exact, to_float
from .errors import DatasetError

NUMBER_KINDS = ("rational", "float64")


def read_json(path: str | Path, error=DatasetError):
    """The parsed JSON of a data or vocabulary file under the rule: bare numbers as Python's
    ``json`` reads them (int or float) unless the document is an object saying ``"number":
    "rational"``, when they are read exactly (``parse_exact``, which refuses absurd exponents).
    Broken or too deeply nested JSON raises ``error`` naming the file."""
    text = Path(path).read_text()
    doc = _loads(text, path, error, exact=False)
    if isinstance(doc, dict) and doc.get("number") == "rational":
        doc = _loads(text, path, error, exact=True)
    return doc


def _loads(text: str, path, error, exact: bool):
    try:
        if exact:
            return json.loads(text, parse_float=parse_exact, parse_int=parse_exact)
        return json.loads(text, parse_float=_float64)
    except RecursionError:
        raise error(f"{path}: not valid JSON (nested too deeply)") from None
    except NumberError as e:
        raise error(f"{path}: {e}") from None
    except ValueError as e:  # JSONDecodeError, or a number too long for Python's int
        raise error(f"{path}: not valid JSON ({e})"[:300]) from None


def _float64(s: str):
    """A bare JSON number as Python reads it, except one that float64 cannot hold (it would
    become inf, or 0 though nonzero): that is kept exact, so that the data's range rule
    refuses it by name and place instead of a silent inf or 0."""
    f = float(s)
    if math.isinf(f) or (f == 0 and any(c in "123456789" for c in s.lower().split("e")[0])):
        return parse_exact(s)
    return f


def number_kind(doc: dict, path) -> str | None:
    """The document's ``"number"`` (None when absent); anything else is a DatasetError."""
    number = doc.get("number")
    if number is not None and number not in NUMBER_KINDS:
        raise DatasetError(f"{path}: \"number\" must be \"rational\" or \"float64\", got "
                           f"{number!r}"[:200])
    return number


def sequences(doc: dict, key: str, path) -> object:
    """``doc[key]`` (a list of sequences of tokens, a token possibly null) with the rule
    applied: under ``"number": "float64"`` every number and number string becomes the nearest
    float64; otherwise the values stay as read (floats, ints, exact strings, Fractions) for
    ``from_arrays``. Structure other than numbers is left for ``from_arrays`` to judge."""
    seqs = doc[key]
    if number_kind(doc, path) != "float64" or not isinstance(seqs, list):
        return seqs
    kind = key.removesuffix("s")
    return [[_float64_row(row, f"{kind} {j}, token {i}") for i, row in enumerate(seq)]
            if isinstance(seq, list) else seq for j, seq in enumerate(seqs)]


def _float64_row(row, where: str):
    if not isinstance(row, list):
        return row
    try:
        return [to_float(v) if isinstance(v, (str, Fraction)) else v for v in row]
    except NumberError as e:
        raise DatasetError(f"{where}: {e}") from None
    except (ValueError, OverflowError):
        raise DatasetError(f"{where}: a value is not a float64 number string ({row!r})"[:300]) \
            from None
