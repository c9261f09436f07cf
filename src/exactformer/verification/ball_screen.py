"""A float64 screen for the ball pass: the tokens an FF layer certainly leaves where they are.

In a keyed softmax model almost every FF layer moves a few tokens and leaves the rest, whose
units all read ≤ 0 (docs/verification.md#the-ball-screen). The ball pass (:mod:`.balls`)
would decide that sign by sign in arb, token by token. The screen decides it for every token
of every sequence at once: each ball token carries a float64 box [m − R, m + R] that contains
it, and a unit f·x + b is certainly ≤ 0 on the box when the float64 value of f·m + |f|·R + b
plus its rounding bound (any order, FMA or not: :func:`..evaluate.rounding.rounding`) and the
conversion errors of f and b stays ≤ 0 (and > 0 the other way round). A token the screen
leaves undecided goes through the ball pass's own test; a sign the screen decides holds at
every point of the box, so it may settle one that the arb evaluation of f·x + b leaves
open, and never contradicts one it settles.
"""

from __future__ import annotations

import numpy as np
from flint import arb

from ..evaluate.rounding import U, rounding, up
from ..numbers import safe_float

TINY_WEIGHT = 2.0 ** -1000  # a nonzero weight below this (near subnormal) disables the screen
MIN_TOKENS = 32  # fewer ball tokens than this: the arb tests are cheaper than the arrays


def token_boxes(vs: list, d: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(m, R, ok) for ball vectors ``vs`` (arb_mat columns of d entries): float64 centres and
    radii, n×d, with [m − R, m + R] ⊇ each ball entry by entry (R = 0 where the entry is a
    float64 number exactly); ok is False for a vector with an entry not finite in float64."""
    mids, rads, exact = [], [], []
    for v in vs:
        for e in v.entries():
            m, r = float(e.mid()), float(e.rad())
            mids.append(m)
            rads.append(r)
            exact.append(r == 0.0 and arb(m) == e)
    m = np.array(mids, dtype=float).reshape(len(vs), d)
    r = np.array(rads, dtype=float).reshape(len(vs), d)
    ok = (np.isfinite(m) & np.isfinite(r)).all(axis=1)
    # float() of an arb rounds its midpoint and radius by at most one ulp (2U of the value)
    with np.errstate(invalid="ignore", over="ignore"):
        R = up(r * (1 + 2 * U) + 2 * U * np.abs(m), 4)
    R[np.array(exact, dtype=bool).reshape(len(vs), d)] = 0.0
    return m, R, ok


class LayerScreen:
    """One FF layer's screen: the rows of U that read a direction (``F``, float64) and their
    biases; units that read none keep the sign of their bias."""

    def __init__(self, U_rows: list[list], bias: list, reads: list):
        self.rows = [i for i, f in enumerate(reads) if f is not None]
        self.pattern = [f is None and bi > 0 for f, bi in zip(reads, bias, strict=True)]
        self.F = np.array([[safe_float(u) for u in U_rows[i]] for i in self.rows], dtype=float)
        self.b = np.array([safe_float(bias[i]) for i in self.rows], dtype=float)
        exact_zero = [u == 0 for i in self.rows for u in U_rows[i]] + \
            [bias[i] == 0 for i in self.rows]
        a = np.abs(np.concatenate([self.F.ravel(), self.b]))
        # a weight is 0 in float64 exactly where it is 0 (the exact-zero rule of signs)
        self.usable = bool(self.rows) and bool(np.isfinite(a).all()) and \
            not ((a > 0) & (a < TINY_WEIGHT)).any() and \
            np.array_equal(a == 0, np.array(exact_zero, dtype=bool))

    def signs(self, m: np.ndarray, R: np.ndarray) -> np.ndarray:
        """Per token (rows of the n×d arrays ``m``, ``R``) and unit of ``rows``: 1 where the
        unit reads certainly > 0 on the token's box, 0 where certainly ≤ 0, −1 where the
        screen cannot tell."""
        A = np.abs(self.F)
        d = m.shape[1]
        out = np.full((m.shape[0], len(self.rows)), -1, dtype=np.int8)
        with np.errstate(over="ignore", invalid="ignore"):
            centre = m @ self.F.T + self.b
            spread = R @ A.T
            S = np.abs(m) @ A.T + spread + np.abs(self.b)
            # the float sums of 2d + 1 products, and f, b rounded to float64 (2U of each)
            bound = up(rounding(S, 2 * d + 1) + 2 * U * S, 2 * d + 6)
            # a unit whose every product has an exact zero factor sums exact zeros
            live = ((np.abs(m) + R) @ (A > 0).T > 0) | (self.b != 0)
            bound[~live] = 0.0
            # a sum that overflowed on the way (−inf ≤ −inf) decides nothing, nor does nan
            finite = np.isfinite(centre) & np.isfinite(spread) & np.isfinite(bound)
            out[finite & (centre + spread <= -bound)] = 0
            out[finite & (centre - spread > bound)] = 1
        return out

