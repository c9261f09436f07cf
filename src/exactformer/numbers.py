"""Number handling shared by every module: exact parsing, formatting and array conversion.

Exact mode uses object arrays of ``fractions.Fraction``; float mode uses float64 arrays. The
same NumPy expressions work on both, which keeps the construction and the evaluator generic.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np


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
        return Fraction(v.strip())
    raise TypeError(f"cannot read {v!r} as a number")


def fmt(v) -> str:
    """A string that ``Fraction`` parses back to exactly ``v`` (shortest repr for floats)."""
    if isinstance(v, Fraction):
        return str(v)
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    return repr(float(v))


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


def unit(d: int, i: int, exact: bool) -> np.ndarray:
    e = zeros(d, exact)
    e[i] = Fraction(1) if exact else 1.0
    return e


def num(v, exact: bool):
    """A scalar in the chosen arithmetic."""
    return to_fraction(v) if exact else float(v)
