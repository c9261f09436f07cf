"""Text as causal data: every character a fixed vector, every position's target the next
character's vector (docs/causal.md#text).

:func:`text_embedding` gives the characters of some texts distinct small-integer vectors,
:func:`next_characters` the inputs and targets of ``CausalDataset.from_text``, and
:func:`read_vocabulary` reads the symbol → vector file that ``exactformer text`` writes and
``generate``, ``run`` and ``verify --runtime`` read (numbers by docs/problem.md#numbers), and
:func:`check_vocabulary` checks one for decoding proofs.
"""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import numpy as np

from .errors import DatasetError
from .numbers_rule import read_json
from .sets import all_floats_row, as_matrix


def text_embedding(texts: str | list[str], d: int = 8, seed: int = 0) -> dict[str, np.ndarray]:
    """The texts' distinct characters, sorted, each with a distinct vector of small integers
    (−8 … 8) in R^d, drawn from ``seed``: the same texts give the same vectors."""
    alphabet = sorted(set("".join(_texts(texts))))
    if d < 2:
        raise DatasetError(f"d = {d}: the construction needs token dimension d >= 2")
    if len(alphabet) > 17 ** d:
        raise DatasetError(f"{len(alphabet)} characters do not fit {17 ** d} distinct vectors "
                           f"of R^{d}; use a larger d")
    rng = np.random.default_rng(seed)
    while True:
        vectors = rng.integers(-8, 9, (len(alphabet), d)).astype(float)
        if len({tuple(v) for v in vectors}) == len(alphabet):
            return dict(zip(alphabet, vectors, strict=True))


def next_characters(texts: str | list[str], embedding: dict) -> tuple[list, list]:
    """Inputs and targets of the texts' causal data under ``embedding`` (symbol → vector): the
    inputs are the characters' vectors; at position i the target is the vector of character
    i + 1, null (None) at the last position. A character without a vector is a DatasetError
    naming it."""
    texts = _texts(texts)
    missing = sorted(set("".join(texts)) - set(embedding))
    if missing:
        raise DatasetError(f"characters {''.join(missing)[:40]!r} have no vector in the "
                           "embedding")
    xs = [[embedding[c] for c in t] for t in texts]
    ys = [[embedding[c] for c in t[1:]] + [None] for t in texts]
    return xs, ys


def _texts(texts: str | list[str]) -> list[str]:
    texts = [texts] if isinstance(texts, str) else list(texts)
    if not texts or not all(isinstance(t, str) and t for t in texts):
        raise DatasetError("expected a non-empty text or a list of non-empty texts")
    return texts


def read_text(path: str | Path, chars: int | None = None) -> str:
    """The UTF-8 text of the file (its first ``chars`` characters when given); a DatasetError
    naming the file when it cannot be read, is not UTF-8 or holds fewer than 2 characters."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise DatasetError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise DatasetError(f"{path}: cannot be read ({e.strerror})") from None
    text = text if chars is None else text[:chars]
    if len(text) < 2:
        raise DatasetError(f"{path}: a text needs at least 2 characters (a next character to "
                           f"learn), got {len(text)}")
    return text


def read_vocabulary(path: str | Path) -> tuple[list[str] | None, np.ndarray]:
    """(symbols or None, V×d vectors) of a JSON list of vectors or an object symbol → vector.
    The vectors are float64 when every number is, else exact (docs/problem.md#numbers)."""
    doc = read_json(path)
    symbols = None
    if isinstance(doc, dict):
        symbols, doc = list(doc), list(doc.values())
    if not isinstance(doc, list) or not doc or not all(isinstance(r, list) and r for r in doc):
        raise DatasetError(f"{path}: expected a list of vectors or an object symbol -> vector "
                           "(non-empty lists of numbers)")
    exact = not all(all_floats_row(r) for r in doc)
    where = f"{path}: vocabulary" if symbols is None else f"{path}: vocabulary (symbol order)"
    return symbols, as_matrix(doc, where, exact)


def vocabulary_json(embedding: dict) -> str:
    """``embedding`` (symbol → vector) as the text of its file, a JSON object with a symbol on
    each line: integers as JSON integers, other floats as bare numbers (float64), exact
    non-integers as "p/q" strings (docs/problem.md#numbers)."""
    def number(v):
        if float(v).is_integer() and abs(v) <= 2 ** 53:
            return int(v)
        return float(v) if isinstance(v, (float, np.floating)) else str(v)
    lines = [f"{json.dumps(s, ensure_ascii=False)}: {json.dumps([number(v) for v in vec])}"
             for s, vec in embedding.items()]
    return "{\n" + ",\n".join(lines) + "\n}\n"


def check_vocabulary(vectors, d: int, targets: list[np.ndarray]) -> np.ndarray:
    """``vectors`` as a V×d float64 array fit for decoding proofs
    (docs/numerics.md#decoding-to-a-vocabulary), or a DatasetError: finite float64 numbers
    (exact values must be float64 values), no two vectors equal (a tie would decode to either)
    and every row of ``targets`` (arrays of constrained targets, d columns) among them."""
    raw = np.asarray(vectors)
    if raw.ndim != 2 or not len(raw) or raw.shape[1] != d:
        raise DatasetError(f"the vocabulary must be V×{d} (the data's d), got shape "
                           f"{raw.shape}")
    vocab = _exact_floats(raw)
    if vocab is None:
        raise DatasetError("the vocabulary's numbers must be finite float64 values")
    rows: dict[tuple, int] = {}
    for k, v in enumerate(vocab.tolist()):
        if rows.setdefault(tuple(v), k) != k:
            raise DatasetError(f"vocabulary vectors {rows[tuple(v)]} and {k} are equal")
    for y in targets:
        ys = _exact_floats(np.asarray(y))
        for t in [] if ys is None else ys.tolist():
            if tuple(t) not in rows:
                raise DatasetError(f"the target {t} is not a vocabulary vector")
        if ys is None:
            raise DatasetError("a target is not a float64 vector, so not a vocabulary vector")
    return vocab


def _exact_floats(a: np.ndarray) -> np.ndarray | None:
    """``a`` (an array of numbers) as float64 when every value is a finite float64 number
    exactly, else None."""
    out = a.astype(float)
    if not np.isfinite(out).all():
        return None
    if a.dtype != object:
        return out
    same = all(Fraction(x) == Fraction(v) for x, v in zip(a.flat, out.flat, strict=True))
    return out if same else None
