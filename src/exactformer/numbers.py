"""Number handling shared by every module: exact parsing, formatting and array conversion.

Exact mode uses object arrays of ``fractions.Fraction``; float mode uses float64 arrays. The
same NumPy expressions work on both, which keeps the construction and the evaluator generic.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

import numpy as np

# Largest decimal exponent accepted in a number string. Fraction("1e999999999") would build a
# billion-digit integer (minutes of work and gigabytes); the float64 range ends near 1e±324,
# and an exact decimal of any float64 needs an exponent of at most about ±1100.
MAX_EXPONENT = 4300
_EXPONENT = re.compile(r"[eE]([-+]?[0-9_]+)\s*$")


# Nonzero magnitudes in [SMALLEST, LARGEST): the normal float64 range. Data coordinates and a
# model's temperature must lie in it: the float64 computations beside the exact ones measure
# in float64, where a smaller number is subnormal or 0 and a larger one inf (README, datasets).
SMALLEST = Fraction(2) ** -1022
LARGEST = Fraction(2) ** 1024


class NumberError(ValueError):
    """A number string that is well formed but refused: a zero denominator or an absurd
    exponent. The message says which."""


def parse_exact(s: str) -> Fraction:
    """The exact value of a number string ("3/7", "-0.125", "2.5e-3"); the one parser of
    every number read from a file or the command line (datasets, models, ``--tau``).

    Raises ValueError for anything else, and its subclass NumberError for a zero denominator,
    for a non-ASCII character (a full-width digit would escape the exponent guard) and for a
    decimal exponent beyond ±MAX_EXPONENT, which is refused before any conversion (see the
    README's dataset and model-format sections)."""
    if not isinstance(s, str):
        raise TypeError(f"expected a number string, got {type(s).__name__}")
    ascii_number(s)  # Fraction reads any Unicode digit: a full-width one escapes the guard
    m = _EXPONENT.search(s)
    if m is not None:
        digits = m.group(1).replace("_", "")
        if len(digits.lstrip("+-0")) > 5 or abs(int(digits)) > MAX_EXPONENT:
            raise NumberError(f"{s[:40]!r}: the exponent is beyond ±{MAX_EXPONENT}")
    try:
        return Fraction(s.strip())
    except ZeroDivisionError:
        raise NumberError(f"{s[:40]!r} has a zero denominator") from None


def ascii_number(s: str) -> str:
    """``s`` if it is ASCII, else NumberError: one rule for every number string, exact or
    float64 (Python's ``float`` and ``Fraction``, and NumPy, read any Unicode digit)."""
    if not s.isascii():
        raise NumberError(f"{s[:40]!r} has a non-ASCII character (number strings are ASCII)")
    return s


def parse_float(s: str) -> float:
    """The float64 nearest to a number string, under :func:`ascii_number`'s rule: how
    ``"number": "float64"`` files are read (ValueError for anything ``float`` refuses)."""
    return float(ascii_number(s))


def decimal_exponent(v) -> int:
    """About ⌊log10 |v|⌋ of a nonzero Fraction or float, for messages: computed without
    converting a huge Fraction to a float or a string (Python refuses integers of over 4300
    digits as strings)."""
    f = abs(Fraction(v))
    return math.floor(math.log10(f.numerator) - math.log10(f.denominator))


def normal_positive(v, where: str):
    """``v`` (a Fraction or float) if it is positive and in the normal float64 range, else
    NumberError naming ``where``: how temperatures are checked, from a file or an argument."""
    finite = not isinstance(v, float) or math.isfinite(v)  # (a Fraction is finite)
    if not (finite and v > 0 and SMALLEST <= Fraction(v) < LARGEST):
        shown = f"about 1e{decimal_exponent(v)}" if finite and v > 0 else repr(v)
        raise NumberError(f"{where} must be a positive number in the normal float64 range "
                          f"(2^-1022 to below 2^1024), got {shown}")
    return v


def to_float(v) -> float:
    """``float(v)``, a number string read by :func:`parse_float`."""
    return parse_float(v) if isinstance(v, str) else float(v)


def to_fraction(v) -> Fraction:
    """Exact value of an int, float, Fraction, NumPy scalar or string ("3/7", "-0.125")."""
    if isinstance(v, bool):
        raise TypeError("booleans are not numbers here")
    if isinstance(v, Fraction):
        return v
    if isinstance(v, (int, np.integer)):
        return Fraction(int(v))
    if isinstance(v, (float, np.floating)):
        if not math.isfinite(float(v)):
            raise ValueError(f"{v!r} is not finite")
        return Fraction(float(v))
    if isinstance(v, str):
        return parse_exact(v)
    raise TypeError(f"cannot read {v!r} as a number")


def fmt(v) -> str:
    """A string that ``Fraction`` parses back to exactly ``v`` (shortest repr for floats)."""
    if isinstance(v, Fraction):
        return str(v)
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    return repr(float(v))


def fmt_array(a: np.ndarray) -> list:
    """``fmt`` of every entry, as nested lists of the array's shape; float64 arrays take a
    fast path (``repr`` over ``tolist()``, the same strings as ``fmt``)."""
    if a.dtype == object:
        return [fmt_array(row) for row in a] if a.ndim > 1 else [fmt(v) for v in a]
    if a.ndim > 1:
        return [list(map(repr, row)) for row in np.asarray(a, dtype=float).tolist()]
    return list(map(repr, np.asarray(a, dtype=float).tolist()))


def is_exact_array(a: np.ndarray) -> bool:
    return a.dtype == object


def to_fraction_array(a) -> np.ndarray:
    """Object array of Fractions with the shape of ``a`` (floats convert exactly)."""
    a = np.asarray(a)
    if a.dtype == object and all(isinstance(v, Fraction) for v in a.flat):
        return a
    out = np.empty(a.shape, dtype=object)
    out.flat[:] = [to_fraction(v) for v in a.flat]
    return out


def as_number_array(a, exact: bool) -> np.ndarray:
    """``a`` as a Fraction object array (exact) or a float64 array."""
    return to_fraction_array(a) if exact else np.asarray(a, dtype=float)


def zeros(shape, exact: bool) -> np.ndarray:
    if exact:
        out = np.empty(shape, dtype=object)
        out.fill(Fraction(0))
        return out
    return np.zeros(shape)


def pad_columns(arrays, D: int) -> list[np.ndarray]:
    """Each n_j×d array (d ≤ D) as n_j×D, zero columns appended: how a model whose residual
    stream is D = d_model wide reads tokens of dimension d (the point (x, 0, …, 0) ∈ R^D,
    docs/architecture.md#data-narrower-than-the-model). Arrays already D wide, and arrays that
    are not matrices (left for the caller's own shape check), are returned as they are; d > D
    is an error naming both."""
    out = []
    for a in arrays:
        a = np.asarray(a)
        if a.ndim == 2 and a.shape[1] != D:
            if a.shape[1] > D:
                raise ValueError(wider_than_model(a.shape[1], D))
            exact = a.dtype == object
            pad = zeros((a.shape[0], D - a.shape[1]), True) if exact else \
                np.zeros((a.shape[0], D - a.shape[1]), dtype=a.dtype)
            a = np.concatenate([a, pad], axis=1)
        out.append(a)
    return out


def wider_than_model(d: int, D: int) -> str:
    """The error for data of dimension d > D given to a model of width D."""
    return (f"the data have dimension d = {d}, more than the model's width d_model = {D} "
            "(a model reads data of dimension d <= d_model, zero-padded)")


def unit(d: int, i: int, exact: bool) -> np.ndarray:
    e = zeros(d, exact)
    e[i] = Fraction(1) if exact else 1.0
    return e


def num(v, exact: bool):
    """A scalar in the chosen arithmetic."""
    return to_fraction(v) if exact else float(v)


def safe_float(v) -> float:
    """``float(v)`` with overflow mapped to ±inf (Fractions raise instead of rounding)."""
    try:
        return float(v)
    except OverflowError:
        return math.inf if v > 0 else -math.inf


def float_below(limit: Fraction) -> float:
    """The largest float64 ≤ ``limit``: a float bound at most it is at most the limit."""
    f = safe_float(limit)
    if f == np.inf:  # a limit beyond float64's range: every finite float is below it
        return float(np.finfo(np.float64).max)
    return f if Fraction(f) <= limit else float(np.nextafter(f, -np.inf))


def safe_floats(a: np.ndarray) -> np.ndarray:
    """A float64 copy of ``a``; exact or mpmath values are rounded, overflow becomes ±inf.
    NumPy's cast calls ``float`` on each value in C; only an array with a value beyond float
    range (which raises there) is converted value by value."""
    try:
        return a.astype(float)
    except OverflowError:
        pass
    out = np.empty(a.shape)
    out.flat[:] = [safe_float(v) for v in a.flat]
    return out


def sparse_dot(X: np.ndarray, v: np.ndarray) -> np.ndarray:
    """X @ v over v's nonzero entries only (the construction's vectors are mostly zeros or unit
    vectors, and each skipped product is a rational multiplication in exact passes)."""
    nz = [k for k, a in enumerate(v) if a != 0]
    if len(nz) == 1:  # one column: scaled, or copied when the entry is 1 (no products)
        return X[:, nz[0]].copy() if v[nz[0]] == 1 else X[:, nz[0]] * v[nz[0]]
    return X[:, nz] @ v[nz] if nz else X[:, 0] * 0


_MIX = (np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB))


def mix64(z: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser, in place on a uint64 array: a bijection whose every output
    bit depends on every input bit, so structured floats (grids, powers of 2) hash apart."""
    z ^= z >> np.uint64(30)
    z *= _MIX[0]
    z ^= z >> np.uint64(27)
    z *= _MIX[1]
    z ^= z >> np.uint64(31)
    return z
