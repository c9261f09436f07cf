"""Seeded "generic" choices and the exact checks that they really are generic.

Every random choice of the construction (directions, multipliers, slopes) comes from here. Exact
mode asks for distinct values (== on Fractions); float64 mode asks for gaps that rounding cannot
close. Among a few valid draws the one with the widest relative gap is kept: existence only
needs distinctness, but wide gaps are what keep float evaluation accurate.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from fractions import Fraction

import numpy as np

from ..numbers import num

EPS = float(np.finfo(float).eps)


class ConstructionError(RuntimeError):
    """No generic choice was found (for instance float64 data too close to separate)."""


class Draws:
    """Seeded source of rational or float choices."""

    def __init__(self, seed: int, exact: bool):
        self.rng = random.Random(seed)
        self.exact = exact

    def rational(self, lo: int, hi: int, den: int = 64):
        """A random multiple of 1/den in [lo, hi]."""
        return num(Fraction(self.rng.randint(lo * den, hi * den), den), self.exact)

    def vector(self, d: int, bits: int = 20) -> np.ndarray:
        """A random direction with dyadic entries k/2^bits in [-1, 1] (exact in float64).

        Fine entries matter: a direction with small integer entries maps many distinct integer
        points to the same value (a coincidence for every draw), a fine one almost never does.
        """
        scale = 1 << bits
        for _ in range(64):  # all-zero has probability (2·2^bits + 1)^-d per draw
            v = [self.rng.randint(-scale, scale) for _ in range(d)]
            if any(v):
                arr = np.empty(d, dtype=object if self.exact else float)
                arr[:] = [num(Fraction(x, scale), self.exact) for x in v]
                return arr
        raise ConstructionError("64 random directions were all zero")


def relative_gap(values) -> float:
    """Smallest gap between distinct sorted values over their spread (0 on a coincidence)."""
    return _relative_gap(_sorted(values))


def separated(values, exact: bool) -> bool:
    """Distinct exactly (exact mode), or far enough apart for float64 rounding."""
    return _separated(_sorted(values), exact)


def generic_score(values, exact: bool) -> float | None:
    """The score of a generic choice that must keep ``values`` apart: their relative gap, or
    None (invalid) when two coincide (exact) or could merge under float64 rounding. One sort."""
    vals = _sorted(values)
    return _relative_gap(vals) if _separated(vals, exact) else None


def _relative_gap(vals: np.ndarray) -> float:
    if len(vals) < 2:
        return 1.0
    spread = vals[-1] - vals[0]  # exact for Fractions; their ratio ≤ 1 always converts
    gap = (vals[1:] - vals[:-1]).min()
    return float(gap / spread) if spread else float(gap)


def _separated(vals: np.ndarray, exact: bool) -> bool:
    if len(vals) < 2:
        return True
    gaps = vals[1:] - vals[:-1]
    if exact:
        return all(g != 0 for g in gaps)
    scale = max(abs(float(vals[0])), abs(float(vals[-1]))) or 1.0
    return float(gaps.min()) > 256 * EPS * scale


def _sorted(values) -> np.ndarray:
    a = np.asarray(values)
    if a.dtype != object:
        return np.sort(np.asarray(a, dtype=float))
    out = np.empty(len(a), dtype=object)
    out[:] = sorted(a.tolist())
    return out


SLOPED_HAT_LIMIT = 2.0 ** -27  # landing error a float64 sloped hat may risk, over its move


def check_sloped_hat(f, x, t0, delta, exact: bool) -> None:
    """Refuse a float64 hat without plateau that float64 cannot place robustly.

    A 3-ReLU hat (slope move/δ) lands its token exactly only where its input t = f·x + t0 is
    exactly the peak c that the construction computed. Rounding of t, up to
    (d+1)·ε·(Σ|f_i·x_i| + |t0|) for the float64 dot product (and as much between the
    construction's float64 belief and the exact value of the stored floats), moves the landing
    point by up to that error over δ times the move. Every other evaluator (exact arithmetic,
    torch) rounds differently, so beyond ``SLOPED_HAT_LIMIT`` the model would be right only in
    the evaluator that reproduces the construction's rounding. δ is half the gap from the token
    to its nearest neighbour on the projection, so this refuses data whose relative spacing
    near that token float64 cannot resolve. See docs/numerics.md#the-extreme-token-rule.
    """
    if exact:
        return
    err = (len(f) + 1) * EPS * (sum(abs(float(a) * float(b)) for a, b in zip(f, x, strict=True))
                                + abs(float(t0)))
    if err > SLOPED_HAT_LIMIT * float(delta):
        raise ConstructionError(
            f"float64 parameters cannot resolve the data's relative spacing: a token is only "
            f"{2 * float(delta):.3g} from its nearest neighbour on a projection to [1, 3], so "
            f"float64 rounding of its position (up to {err:.2g}) could move it by "
            f"{err / float(delta):.2g} of its hat's move, and the model would be right only "
            "in float64 evaluations that round like the construction; build with exact "
            "rational arithmetic instead (without --float / exact=True)")


def best_draw(draw: Callable[[], object], score: Callable[[object], float | None],
              tries: int = 4, limit: int = 200, what: str = "choice"):
    """Keep the best-scoring of the first ``tries`` valid draws (``score`` None = invalid)."""
    best, best_score, valid = None, -1.0, 0
    for _ in range(limit):
        cand = draw()
        s = score(cand)
        if s is None:
            continue
        valid += 1
        if s > best_score:
            best, best_score = cand, s
        if valid >= tries:
            break
    if best is None:
        raise ConstructionError(f"no generic {what} found in {limit} draws; the data may have "
                                "points too close to separate in this arithmetic")
    return best
