"""Causal attention in a float64 enclosure (docs/numerics.md#enclosures): rank-one hardmax
heads and softmax heads.

A causal head with scores (c·x_i)(a·x_l), α = 0, lets row i average the rows l ≤ i holding the
prefix's largest key a·x (c·x_i > 0), its smallest (c·x_i < 0) or all of them (c·x_i = 0). Given
every row's box, the exact argmax set of row i lies among the rows l ≤ i whose key interval
reaches the prefix's best certain bound, so the exact average lies in the hull of their carrier
boxes: the set rule of :func:`.head_radius.rank_one_radius`, with each row's own prefix in
place of its whole sequence. Hardmax heads with α ≠ 0 are not tracked: a causal enclosure runs
them in an exact pass (:func:`.passes.enclose`). A softmax head, any α, takes the set rule of
:func:`.softmax_radius.softmax_box` over each row's prefix
(docs/numerics.md#causal-softmax-averages).
"""

from __future__ import annotations

import numpy as np

from ..model import SA
from .arithmetic import FLOAT, Arithmetic
from .attention import _batches, _dot, softmax_average
from .enclosure import lower, upper
from .head_radius import hull_radius, score_error
from .softmax_radius import softmax_box
from .state import RowState

CHUNK = 1 << 22  # prefix-mask entries (rows × keys × carrier columns) formed at once


def tracked(sa: SA, attention: str) -> bool:
    """Whether a causal enclosure can carry radii through ``sa``: softmax always; hardmax when
    every head that the layer averages (all but those with β = 0 and p = 0,
    :func:`.layers.apply_sa`) has rank-one scores (α = 0)."""
    return attention == "softmax" or \
        all(h.A.alpha == 0 or (h.V.beta == 0 and not np.any(h.V.p != 0)) for h in sa.heads)


def causal_head_average(st: RowState, A, q, attention: str, tau, stats, dots: dict
                        ) -> tuple[np.ndarray, np.ndarray]:
    """A tracked causal head's averages of its carrier (x·q per row, or the points when q is
    None) and their radii, sequence by sequence (:func:`causal_rank_one`) or, for softmax, batch
    by batch of equal-length sequences; the signature of
    :func:`.attention.head_average`, whose place it takes in a causal tracking pass; softmax
    heads by :func:`causal_softmax_box`. Ties and margins are not recorded (a causal
    enclosure's statistics never report attention)."""
    if attention == "hardmax" and A.alpha != 0:
        raise ValueError("a causal enclosure tracks rank-one hardmax heads only")
    qa, q_rad = _dot(st, A.c, dots)
    ka, k_rad = _dot(st, A.a, dots)
    C, C_rad = (st.P, st.rad) if q is None else (v[:, None] for v in _dot(st, q, dots))
    avg, rad = np.empty(C.shape), np.empty(C.shape)
    if attention == "softmax":
        for rows in _batches(st.segment_index(), 1):
            avg[rows], rad[rows] = causal_softmax_box(st.P[rows], st.rad[rows], qa[rows],
                                                      q_rad[rows], ka[rows], k_rad[rows],
                                                      A.alpha, tau, C[rows], C_rad[rows])
        return avg, rad
    for s, e in st.segments():
        avg[s:e], rad[s:e] = causal_rank_one(qa[s:e], q_rad[s:e], ka[s:e], k_rad[s:e],
                                             C[s:e], C_rad[s:e])
    return avg, rad


def causal_softmax_box(X, r, q, q_rad, k, k_rad, alpha, tau, C, C_rad
                       ) -> tuple[np.ndarray, np.ndarray]:
    """One sequence's causal softmax averages of the carrier C (rows X with radii r, queries q
    = c·x and keys k = a·x with theirs) and their radii, or a batch's of equal-length
    sequences (leading axes): the float averages over each prefix
    (:func:`causal_float_softmax`), boxed by :func:`.softmax_radius.softmax_box` over the same
    prefixes, from the float scores and their error bounds. Every row is one token (weight 1:
    a causal pass never merges rows that attention reads)."""
    with np.errstate(all="ignore"):
        S = q[..., :, None] * k[..., None, :]
        if alpha != 0:
            S = S + (X @ X.swapaxes(-1, -2)) * alpha
        E = score_error(X, r, q, q_rad, k, k_rad, alpha)
        avg = causal_float_softmax(S, C, tau)
    return softmax_box(avg, S, E, np.ones(S.shape[:-1]), tau, C, C_rad, causal=True)


def causal_float_softmax(S, C, tau, ar: Arithmetic = FLOAT) -> np.ndarray:
    """Row i: the float softmax average of C over the keys l ≤ i of the scores S (n × n, in
    float64; or B × n × n, a batch), shifted by the prefix's largest score and divided by τ."""
    with np.errstate(invalid="ignore", over="ignore"):
        Sm = np.where(np.tri(S.shape[-1], dtype=bool), S, -np.inf)
        return softmax_average((Sm - Sm.max(axis=-1, keepdims=True)) / float(tau), C, ar)


def causal_rank_one(q, q_rad, k, k_rad, C, C_rad) -> tuple[np.ndarray, np.ndarray]:
    """One sequence's causal hardmax averages of the carrier C (n×m, rows in input order) and
    their radii, for queries q = c·x and keys k = a·x with radii (float64, from the boxes).

    The float average of row i is the mean of C over the rows l ≤ i whose float key is the
    prefix's best (every l ≤ i for q_i = 0). Its radius is that of the hull of the carrier
    boxes of row i's candidates (:func:`prefix_candidates`). Where every candidate carries
    the same float, that float is the midpoint: the float mean of equal values can round
    away from them, and an exact code (radius 0) then keeps radius 0."""
    n, m = C.shape
    avg, rad = np.empty((n, m)), np.empty((n, m))
    best, cand = float_best(q, k), prefix_candidates(q, q_rad, k, k_rad)
    step = max(1, CHUNK // (n * max(m, 1)))
    with np.errstate(invalid="ignore", over="ignore"):
        for s in range(0, n, step):
            rows = slice(s, s + step)
            hit, c = best[rows][:, :, None], cand[rows][:, :, None]
            avg[rows] = np.where(hit, C[None], 0.0).sum(axis=1) / hit.sum(axis=1)
            lo = np.where(c, C[None], np.inf).min(axis=1)
            hi = np.where(c, C[None], -np.inf).max(axis=1)
            top = np.where(c, C_rad[None], 0.0).max(axis=1)
            avg[rows] = np.where(lo == hi, lo, avg[rows])
            rad[rows] = hull_radius(avg[rows], lo, hi, top)
    return avg, rad


def float_best(q, k) -> np.ndarray:
    """n×n booleans: the rows l ≤ i that row i averages in float64 (its float argmax set)."""
    n = len(q)
    tri = np.tri(n, dtype=bool)
    with np.errstate(invalid="ignore"):
        top, bottom = np.maximum.accumulate(k), np.minimum.accumulate(k)
        pos, neg = (q > 0)[:, None], (q < 0)[:, None]
        best = np.where(pos, k[None, :] == top[:, None],
                        np.where(neg, k[None, :] == bottom[:, None], True))
    return best & tri


def prefix_candidates(q, q_rad, k, k_rad) -> np.ndarray:
    """n×n booleans: the rows l ≤ i that may be in row i's exact argmax set. A query surely
    positive takes the keys whose upper end reaches the largest lower end of its prefix, one
    surely negative likewise with the smallest, any other query every row of its prefix; a
    key whose interval is not finite is a candidate for every query after it."""
    n = len(q)
    tri = np.tri(n, dtype=bool)
    k_hi, k_lo = upper(k, k_rad), lower(k, k_rad)
    unknown = ~(np.isfinite(k_hi) & np.isfinite(k_lo))
    with np.errstate(invalid="ignore"):
        pos = (lower(q, q_rad) > 0)[:, None]
        neg = (upper(q, q_rad) < 0)[:, None]
        reach_top = k_hi[None, :] >= np.fmax.accumulate(k_lo)[:, None]
        reach_bottom = k_lo[None, :] <= np.fmin.accumulate(k_hi)[:, None]
    cand = np.where(pos, reach_top, np.where(neg, reach_bottom, True)) | unknown[None, :]
    return cand & tri
