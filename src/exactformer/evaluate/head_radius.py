"""Radii of hardmax attention outputs in the float64 enclosures: the score intervals, the
rows each query may select, and the hull of their values (docs/numerics.md#enclosures, and
#general-hardmax-heads-in-batches for the batched form).
"""

from __future__ import annotations

import numpy as np

from .enclosure import TINY, lower, rounding, up, upper


def hull_radius(mid, lo, hi, rad):
    """The radius about ``mid`` of the box [lo − rad, hi + rad] (covering it even if mid lies
    outside); inf where anything is not finite (an empty or unknown hull bounds nothing).
    Rounded up only where a sum is inexact: an exact carrier (lo = mid = hi, rad = 0) keeps
    radius 0, and one point of radius r keeps r."""
    with np.errstate(invalid="ignore"):
        d = np.maximum(hi - mid, mid - lo)  # 0 only where lo = mid = hi exactly
        d = np.where(d == 0, d, np.nextafter(d, np.inf))
        r = d + rad
        r = np.where((d == 0) | (rad == 0), r, np.nextafter(r, np.inf))
    return np.where(np.isfinite(r) & (d >= 0), r, np.inf)


def rank_one_candidates(k, k_rad, seg, starts, side: int) -> np.ndarray:
    """Rows (increasing) that may hold their sequence's largest (side 1) or smallest (side
    −1) exact key a·x, given the keys' float values k and radii: every row whose interval
    reaches the best certain bound."""
    k_hi, k_lo = upper(k, k_rad), lower(k, k_rad)
    unknown = ~(np.isfinite(k_hi) & np.isfinite(k_lo))  # a candidate for anything
    if side > 0:
        return np.flatnonzero(unknown | (k_hi >= np.fmax.reduceat(k_lo, starts)[seg]))
    return np.flatnonzero(unknown | (k_lo <= np.fmin.reduceat(k_hi, starts)[seg]))


def segment_hull(C, C_rad, rows, seg, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per segment (n of them), the box [lo − rad, hi + rad] holding the boxes C ± C_rad of
    its ``rows`` (increasing): lo, hi the carriers' exact extremes, rad their largest radius;
    empty (lo = inf, hi = −inf) for a segment without such rows."""
    lo, hi = np.full((n, C.shape[1]), np.inf), np.full((n, C.shape[1]), -np.inf)
    rad = np.zeros((n, C.shape[1]))
    if len(rows):
        s = seg[rows]
        first = np.flatnonzero(np.concatenate([[True], s[1:] != s[:-1]]))
        lo[s[first]] = np.minimum.reduceat(C[rows], first, axis=0)
        hi[s[first]] = np.maximum.reduceat(C[rows], first, axis=0)
        rad[s[first]] = np.maximum.reduceat(C_rad[rows], first, axis=0)
    return lo, hi, rad


def score_error(X, r, q, q_rad, k, k_rad, alpha: float) -> np.ndarray:
    """A bound on the error of the float scores q_i k_l + α⟨x_i, x_l⟩ of one sequence's rows
    (or of a batch of sequences: leading axes), for any points within the rows' boxes."""
    aX = np.abs(X)

    def outer(u, v):
        return u[..., :, None] * v[..., None, :]

    def gram(A, B):
        return A @ B.swapaxes(-1, -2)

    err = outer(np.abs(q), k_rad) + outer(q_rad, np.abs(k) + k_rad)
    if alpha != 0:
        err += abs(alpha) * (gram(aX, r) + gram(r, aX) + gram(r, r))
    err += rounding(outer(np.abs(q), np.abs(k)) + abs(alpha) * gram(aX, aX), X.shape[-1] + 2)
    err += _scaled_underflow(alpha, X.shape[-1])
    return up(err, 3 * X.shape[-1] + 8)


def _scaled_underflow(alpha: float, d: int) -> float:
    """What :func:`rounding`'s absolute slack misses in a score α⟨x_i, x_l⟩ with |α| > 1:
    the products of the gram can underflow before α multiplies them, so their absolute
    error is scaled by |α| too."""
    return abs(alpha) * (2 * (d + 2) + 4) * TINY if abs(alpha) > 1 else 0.0


def rank_one_radius(avg, q, q_rad, k, k_rad, C, C_rad, seg, starts) -> np.ndarray:
    """Radius about ``avg`` of a rank-one hardmax average: a row whose query c·x is surely
    positive averages some of the rows that may hold the largest key, one surely negative
    some of those that may hold the smallest, any other some rows of its sequence; each
    average lies in the hull of those rows' carrier boxes (one hull per sequence)."""
    pos, neg = lower(q, q_rad) > 0, upper(q, q_rad) < 0
    out = np.empty(C.shape)
    for side, mask in ((1, pos), (-1, neg), (0, ~pos & ~neg)):
        rows = np.flatnonzero(mask)
        if not len(rows):  # only the hulls some row reads
            continue
        keys = np.arange(len(seg)) if side == 0 else \
            rank_one_candidates(k, k_rad, seg, starts, side)
        lo, hi, rad = segment_hull(C, C_rad, keys, seg, len(starts))
        out[rows] = hull_radius(avg[rows], lo[seg[rows]], hi[seg[rows]], rad[seg[rows]])
    return out


def head_radius(S, top, bottom, X, r, q, q_rad, k, k_rad, alpha: float, C, C_rad, avg
                ) -> np.ndarray:
    """Radius about ``avg`` of one sequence's hardmax averages under general scores, whose
    float values are S, each row's largest ``top`` and smallest ``bottom`` (or of a batch of
    sequences: leading axes): each row averages some of the keys whose score interval
    reaches the row's best certain score, so its average lies in the hull of their carrier
    boxes. Rows that :func:`sole_candidates` proves to have one candidate take its box
    without the n × n error bounds; the sequences with another row get them
    (docs/numerics.md#general-hardmax-heads-in-batches)."""
    sole = sole_candidates(S, top, bottom, X, r, q, q_rad, k, k_rad, alpha)
    one = np.argmax(S, axis=-1)[..., None]  # where sole: the row's one candidate
    C_one, r_one = np.take_along_axis(C, one, axis=-2), np.take_along_axis(C_rad, one, axis=-2)
    lo, hi, rad = C_one.copy(), C_one.copy(), r_one.copy()
    rest = ~sole.all(axis=-1)
    if rest.any():
        at = np.nonzero(rest) if rest.ndim else ()
        lo[at], hi[at], rad[at] = _candidate_hull(S[at], X[at], r[at], q[at], q_rad[at],
                                                  k[at], k_rad[at], alpha, C[at], C_rad[at])
    return hull_radius(avg, lo, hi, rad)


def _candidate_hull(S, X, r, q, q_rad, k, k_rad, alpha: float, C, C_rad):
    """Per row, the box [lo − rad, hi + rad] (:func:`segment_hull`) holding the carrier boxes
    of every key whose score interval reaches the row's best certain score (a key whose
    interval is unknown always does)."""
    E = score_error(X, r, q, q_rad, k, k_rad, alpha)
    s_hi, s_lo = upper(S, E), lower(S, E)
    unknown = ~(np.isfinite(s_hi) & np.isfinite(s_lo))
    cand = unknown | (s_hi >= np.fmax.reduce(s_lo, axis=-1)[..., None])
    one = np.argmax(cand, axis=-1)[..., None]  # the candidate of a row that has only one
    lo = np.take_along_axis(C, one, axis=-2)
    hi, rad = lo.copy(), np.take_along_axis(C_rad, one, axis=-2)
    many = cand.sum(axis=-1) != 1
    if many.any():  # the hull over every candidate, for the sequences that need it
        at = np.nonzero(many.any(axis=-1)) if many.ndim > 1 else ()
        c = cand[at][..., None]
        lo[at] = np.where(c, C[at][..., None, :, :], np.inf).min(axis=-2)
        hi[at] = np.where(c, C[at][..., None, :, :], -np.inf).max(axis=-2)
        rad[at] = np.where(c, C_rad[at][..., None, :, :], 0.0).max(axis=-2)
    return lo, hi, rad


def sole_candidates(S, top, bottom, X, r, q, q_rad, k, k_rad, alpha: float) -> np.ndarray:
    """Rows (bool, S's shape less its last axis) proved to average their float argmax of S
    alone, when no other float score of the row is within 4·Ê of it (where
    :func:`_candidate_hull` would count a rival whose score interval overflows as unknown,
    this still proves the row: the rival's exact score lies below the best, so the radius is
    only narrower). Ê ≥ 2·(the error bound of :func:`score_error` with every key's |a·x|,
    radius and coordinates replaced by their largest values in the sequence) exceeds every
    E_il of the row, and a key is a candidate only when S_il + E_il reaches S_i* − E_i* up to
    a few roundings of size u·|S|, which Ê covers (it holds the rounding bound of the
    scores' absolute sizes): so a candidate scores at least S_i* − 4·Ê. Rows with a score or
    Ê that is not finite are never sole (``top``, ``bottom``: each row's largest and
    smallest float score). O(n·d) per row besides one pass over S."""
    d = X.shape[-1]
    aX = np.abs(X)
    X_top, r_top = aX.max(axis=-2)[..., :, None], r.max(axis=-2)[..., :, None]
    ak = np.abs(k)
    err = np.abs(q) * k_rad.max(axis=-1)[..., None] + \
        q_rad * (ak + k_rad).max(axis=-1)[..., None]
    size = np.abs(q) * ak.max(axis=-1)[..., None]
    if alpha != 0:
        err += abs(alpha) * ((aX @ r_top) + (r @ X_top) + (r @ r_top))[..., 0]
        size += abs(alpha) * (aX @ X_top)[..., 0]
    e_hat = 2 * up(err + rounding(size, d + 2) + _scaled_underflow(alpha, d), 3 * d + 8)
    with np.errstate(invalid="ignore"):
        finite = np.isfinite(bottom) & np.isfinite(top) & np.isfinite(e_hat)
        near = (S >= lower(top, 4 * e_hat)[..., None]).sum(axis=-1)
    return finite & (near == 1)
