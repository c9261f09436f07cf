"""Distances between point sets, and the data's scale that every tolerance is relative to.

Below everything that judges a model: the verdicts (:mod:`exactformer.verification`), the
enclosures' upper bounds (:mod:`exactformer.evaluate.enclosure`), the float32 verdict and the
evaluators' hat clearance all measure with these functions. The data's scale is defined once,
here (:func:`data_scale`, docs/verification.md#the-datas-scale).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from .numbers import safe_float


def pair_distances(A, B) -> np.ndarray:
    """Float64 Euclidean distances between the rows of A and those of B, for a stack of pairs
    (A: P×n×d, B: P×m×d; P×n×m)."""
    return np.sqrt(((A[:, :, None, :] - B[:, None, :, :]) ** 2).sum(axis=3))


def hausdorff_of(D) -> np.ndarray:
    """Per pair, the Hausdorff distance of two sets from the distances D (P×n×m) between
    their points: the larger of the two directed max-min distances."""
    return np.maximum(D.min(axis=2).max(axis=1), D.min(axis=1).max(axis=1))


def hausdorff(a: np.ndarray, b: np.ndarray) -> float:
    """Hausdorff distance between two finite point sets (rows), returned as a float.

    Differences are taken in the arrays' own arithmetic (object arrays of Fractions or mpmath
    numbers keep their precision), so errors far below float64 resolution are measured, not
    rounded away. Non-finite floats give nan or inf, never a finite distance.
    """
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype == object or b.dtype == object:
        return float(np.sqrt(safe_float(hausdorff_sq(a, b))))
    return float(hausdorff_stack(a[None], b[None])[0])


def hausdorff_stack(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """:func:`hausdorff` of float64 pairs of one shape, stacked (A: P×n×d, B: P×m×d)."""
    with np.errstate(invalid="ignore", over="ignore"):
        D = pair_distances(A, B)
    return hausdorff_checked(D)


def hausdorff_checked(D: np.ndarray) -> np.ndarray:
    """:func:`hausdorff_of` the distances D (P×n×m), nan where one of them is nan and inf
    where one is inf: a non-finite distance never gives a finite answer."""
    h = hausdorff_of(D)
    finite, nan = np.isfinite(D).all(axis=(1, 2)), np.isnan(D).any(axis=(1, 2))
    return np.where(finite, h, np.where(nan, math.nan, math.inf))


STACK_CELLS = 2 ** 20  # distances computed at once by per_pair (8 MB of float64: near the cache)


def per_pair(fn, *columns: list[np.ndarray]) -> list[float]:
    """``fn`` for every pair j of ``columns[0][j], columns[1][j], …``, pairs of equal shapes
    stacked into one call (``fn`` takes P×n×d arrays and returns P values): verify judges up
    to 10^5 pairs, and a NumPy call per pair costs more than its arithmetic. Slices hold
    about STACK_CELLS distances (n·m·d per pair, n and m the first and last column's rows)."""
    groups: dict = {}
    for j, arrays in enumerate(zip(*columns, strict=True)):
        groups.setdefault(tuple(a.shape for a in arrays), []).append(j)
    out: list = [None] * len(columns[0])
    for shapes, idx in groups.items():
        step = max(1, STACK_CELLS // max(1, shapes[0][0] * shapes[-1][0] * shapes[0][-1]))
        for s in range(0, len(idx), step):
            part = idx[s:s + step]
            values = fn(*(np.stack([col[j] for j in part]) for col in columns))
            for j, v in zip(part, values.tolist(), strict=True):
                out[j] = v
    return out


def hausdorff_sq(a: np.ndarray, b: np.ndarray):
    """Squared Hausdorff distance of two object arrays of points, in their own arithmetic
    (exact for Fractions): what a verdict compares with (tolerance × scale)²."""
    D = [[sum(((u - v) * (u - v) for u, v in zip(ra, rb, strict=True)), 0 * ra[0])
          for rb in b] for ra in a]
    return max(max(min(row) for row in D), max(min(col) for col in zip(*D, strict=True)))


def worst(values) -> float:
    """The largest of errors, nan if any is nan: the one reduction of errors behind every
    verdict (Python's ``max`` skips a nan that follows a number, and a verdict built on it
    would pass a nan output). An inf error stays inf; no values give nan (nothing measured)."""
    a = _floats(values)
    return math.nan if a.size == 0 or np.isnan(a).any() else float(a.max())


def smallest(values) -> float:
    """The smallest of margins, nan if any is nan (see :func:`worst`); no values give nan."""
    a = _floats(values)
    return math.nan if a.size == 0 or np.isnan(a).any() else float(a.min())


def _floats(values) -> np.ndarray:
    return np.asarray(values if isinstance(values, np.ndarray) else list(values), dtype=float)


def data_scale(xs: list[np.ndarray], ys: list[np.ndarray]) -> Fraction:
    """The data's own coordinate scale: the largest |coordinate| of inputs and targets, exact.
    Tolerances are relative to it; 0 (all-zero data) makes every tolerance exact equality."""
    if all(a.dtype != object for a in xs + ys):
        return Fraction(max(float(np.abs(a).max(initial=0.0)) for a in xs + ys))
    return Fraction(max(abs(v) for a in xs + ys for v in a.flat))


def relative(value: float, scale) -> float:
    """``value`` over the data's scale (:func:`data_scale`): 0 stays 0 and anything else is inf
    on all-zero data, where every tolerance is exact equality. A scale beyond float64's range
    (an exact one from huge data) reads as inf, not an OverflowError."""
    scale = safe_float(scale)
    if scale > 0:
        return value / scale
    return 0.0 if value == 0 else math.inf


def clearance(stats, scale) -> float | None:
    """A pass's smallest hat clearance (``stats.hat_clearance``, in the tokens' units) over the
    data's scale; None when the pass met no window."""
    return None if stats.hat_clearance is None else relative(stats.hat_clearance, scale)


def as_set(a: np.ndarray) -> set:
    return {tuple(r.tolist()) for r in a}
