"""Radii of softmax attention averages in the float64 enclosures
(docs/numerics.md#softmax-averages-in-the-enclosures).

A softmax average is a convex combination of its keys' carriers, so it lies in the hull of
their boxes, coordinate by coordinate. When the enclosed scores certify that one key beats
every other of its row by a gap g_l > 0, the other keys' weights add up to at most
W = Σ_l w_l·e^(−g_l/τ) / w_best (w the multiplicities), so the average also lies within W
times the carriers' spread of the best key's box. No exponential is evaluated in floats:
e^(−g) is bounded from above by a power of two times a chord of 2^(−f). Under a causal
mask every part of the rule is taken over each row's prefix (docs/numerics.md
#causal-softmax-averages).
"""

from __future__ import annotations

import numpy as np

from .enclosure import lower, up, upper
from .head_radius import hull_radius

LOG2E_LOW = float(np.nextafter(1.4426950408889634, 0.0))  # a float below log2(e)
FLOOR_EXPONENT = 1000  # e^(−g) below 2^-1000 is bounded by 2^-1000 (a normal float)


def exp_neg_upper(g) -> np.ndarray:
    """A float ≥ e^(−g) for each g ≥ 0, within a factor 1.07 down to 2^-1000 (1 where g is
    nan or negative). e^(−g) ≤ 2^(−y) for any y ≤ g·log2(e), and with k = ⌊y⌋, f = y − k
    (exact): 2^(−y) = 2^(−k)·2^(−f) ≤ 2^(−k)·(1 − f/2), the chord of the convex 2^(−f) on
    [0, 1]. ldexp of a number in [½, 1] by −k ≥ −999 is exact."""
    y = np.array(g, dtype=float)
    with np.errstate(all="ignore"):
        y *= LOG2E_LOW
        np.nextafter(y, -np.inf, out=y)
        unknown = ~(y >= 0)  # nan, and negative g
        tiny = y >= FLOOR_EXPONENT  # inf included
        rest = ~(unknown | tiny)
        f = y[rest]  # the chord only where it is needed (sharp heads: few entries)
        k = np.floor(f)
        f -= k
        f /= 2
        np.subtract(1.0, f, out=f)
        np.nextafter(f, np.inf, out=f)
        y[rest] = np.ldexp(f, -k.astype(np.int64))
    y[tiny] = 2.0 ** -FLOOR_EXPONENT
    y[unknown] = 1.0
    return y


def tail_weight(S, E, w, tau: float, causal: bool = False
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(each row's best key by float score, whether its enclosed scores certify that key
    above every other, and an upper bound on the total weight of the others, W above) for
    one sequence's scores S (n × n, float) with error bounds E, multiplicities w and
    temperature τ > 0, or for a batch of sequences of equal length (leading axes: S, E
    B × n × n, w B × n). ``causal``: row i weighs the keys l ≤ i only, so the best key, the
    certificate and W are taken over those (docs/numerics.md#causal-softmax-averages). Rows
    with a score or bound of an allowed key that is not finite are never certified."""
    n = S.shape[-1]
    allowed = np.tri(n, dtype=bool) if causal else np.True_  # the keys each row weighs
    with np.errstate(all="ignore"):
        s_hi, s_lo = upper(S, E), lower(S, E)
        finite = (~allowed | (np.isfinite(s_hi) & np.isfinite(s_lo))).all(axis=-1)
        nan = np.isnan(S)
        if causal or nan.any():
            S = np.where(allowed & ~nan, S, -np.inf)
        best = np.argmax(S, axis=-1)
        at = best[..., None]  # the best key's column, per row
        gap = np.subtract(np.take_along_axis(s_lo, at, axis=-1), s_hi, out=s_hi)
        np.nextafter(gap, -np.inf, out=gap)
        if tau != 1:
            np.divide(gap, tau, out=gap)
            np.nextafter(gap, -np.inf, out=gap)
        np.put_along_axis(gap, at, np.inf, axis=-1)
        certain = finite & (gap > 0).all(axis=-1, where=allowed)
        terms = exp_neg_upper(gap)
        terms *= w[..., None, :]
        np.copyto(terms, 0.0, where=~allowed)
        np.put_along_axis(terms, at, 0.0, axis=-1)
        W = up(terms.sum(axis=-1) / np.take_along_axis(w, best, axis=-1), 2 * n + 2)
    return best, certain, W


def softmax_box(avg, S, E, w, tau: float, C, C_rad, causal: bool = False
                ) -> tuple[np.ndarray, np.ndarray]:
    """(midpoints, radii) of one sequence's softmax averages of the carrier C (n × k, radii
    C_rad), whose float values are ``avg``, or of a batch's (leading axes, as
    :func:`tail_weight`): each row's box is the hull of the carriers'
    boxes (``causal``: of rows 0..i alone, a running extreme), cut down to the best key's
    box widened by W × the spread where the scores certify a best key (:func:`tail_weight`).
    A coordinate whose box is one point gets that point as midpoint (equal carriers average
    to themselves exactly), unless the float average is inf or nan there: it stays, so that
    the pass's outputs are finite only where the plain float64 pass's are (verify fails a
    pair on those, docs/verification.md); radii are inf where anything is not finite."""
    best, certain, W = tail_weight(S, E, w, tau, causal)
    with np.errstate(all="ignore"):
        lo, hi = _hull(lower(C, C_rad), upper(C, C_rad), causal)
        at = best[..., None]  # each row's best key, as a row of the carrier
        c, c_rad = np.take_along_axis(C, at, axis=-2), np.take_along_axis(C_rad, at, axis=-2)
        c_lo, c_hi = lower(c, c_rad), upper(c, c_rad)
        spread = np.maximum(_up(hi - c_lo), _up(c_hi - lo))
        blur = np.where(spread == 0, 0.0, np.nextafter(W[..., None] * spread, np.inf))
        reach = np.where(blur == 0, c_rad, _up(c_rad + blur))
        b_lo = np.where(certain[..., None], np.maximum(lo, lower(c, reach)), lo)
        b_hi = np.where(certain[..., None], np.minimum(hi, upper(c, reach)), hi)
        mid = np.where((b_lo == b_hi) & np.isfinite(avg), b_lo, avg)
    return mid, hull_radius(mid, b_lo, b_hi, np.zeros_like(mid))


def _hull(c_lo, c_hi, causal: bool) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the smallest lower and the largest upper end of the carriers' boxes that the
    row averages: every row's (one row per sequence, broadcast), or rows 0..i for row i
    (``causal``). A nan end makes its hull nan, whose radius is then inf
    (:func:`.head_radius.hull_radius`)."""
    if causal:
        return np.minimum.accumulate(c_lo, axis=-2), np.maximum.accumulate(c_hi, axis=-2)
    return c_lo.min(axis=-2, keepdims=True), c_hi.max(axis=-2, keepdims=True)


def _up(x):
    """x rounded up one step, 0 kept: a float ≥ the exact difference or sum of nonnegative
    floats that gave x under round-to-nearest (such a result is 0 only when exact). A
    product that may underflow to 0 is rounded up with ``nextafter`` alone."""
    return np.where(x == 0, x, np.nextafter(x, np.inf))
