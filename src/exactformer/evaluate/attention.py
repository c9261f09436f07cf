"""One attention head's averages over a pass's rows: hardmax argmax sets and softmax weights.

Hardmax argmax sets are decided exactly in exact and mpmath passes (a provably safe float64
pre-filter keeps the work near linear), on the float scores in float64 passes, and by the
rank-one kernels of :mod:`.rank_one` when A = a·cᵀ. Softmax weights are formed by one kernel,
:func:`softmax_average` (docs/numerics.md, docs/verification.md).
"""

from __future__ import annotations

import bisect

import mpmath
import numpy as np

from ..numbers import safe_float, safe_floats, sparse_dot
from . import enclosure, head_radius
from .arithmetic import Arithmetic, PassStats
from .softmax_radius import softmax_box
from .state import RowState


def _dot(st: RowState, v, dots: dict):
    """x·v for every row and, in a tracking pass, its radius (else None), computed once per
    layer input and vector."""
    key = tuple(v.tolist())
    if key not in dots:
        dots[key] = (sparse_dot(st.P, v),
                     None if st.rad is None else enclosure.dot_radius(st.P, st.rad, v))
    return dots[key]


def head_average(st: RowState, A, q, attention: str, tau, stats: PassStats, dots: dict):
    """Every row's attention average Σ_l π_il C_l of the carrier C (the column x·q per point,
    or the points themselves when q is None) under one head's scores ⟨A x_i, x_l⟩, and, in
    a tracking pass, the radius of that average (the hull of every average the enclosed
    scores allow)."""
    if attention == "hardmax" and A.alpha == 0:
        res = st.heads.result(st, A.c, A.a, q, stats.enabled)
        if stats.enabled:
            stats.hardmax_ties += int(res.ties.sum())
            if np.isfinite(res.margin).any():
                stats.note_min("hardmax_margin", float(res.margin.min()))
        return res.avg, res.rad
    ar, P = st.ar, st.P
    qa, q_rad = _dot(st, A.c, dots)  # c·x_i
    ka, k_rad = _dot(st, A.a, dots)  # a·x_l
    if q is None:
        C, C_rad = P, st.rad
    else:
        C, C_rad = _dot(st, q, dots)
        C, C_rad = C[:, None], None if C_rad is None else C_rad[:, None]
    if not ar.is_object:
        if attention == "hardmax":
            return _float_hardmax(st, qa, q_rad, ka, k_rad, A.alpha, C, C_rad, stats)
        return _float_softmax(st, qa, q_rad, ka, k_rad, A.alpha, tau, C, C_rad)
    weights = st.weights()  # multiplicities, in the pass's arithmetic
    out = np.empty(C.shape, dtype=C.dtype)
    for s, e in st.segments():
        X, w, Cs = P[s:e], weights[s:e], C[s:e]
        if attention == "hardmax":
            out[s:e] = hardmax_rows(X, qa[s:e], ka[s:e], A.alpha, w, stats, Cs)
        else:
            out[s:e] = softmax_rows_mp(X, qa[s:e], ka[s:e], A.alpha, w, tau, ar, Cs)
    return out, None


def _float_softmax(st: RowState, qa, q_rad, ka, k_rad, alpha, tau, C, C_rad):
    """:func:`head_average`'s softmax average of the carrier C (and its box, in a tracking
    pass) in a float64 pass, batch by batch of equal-length sequences: each sequence's rows
    see only its own keys, and every operation acts on one sequence's slice of the batch
    exactly as on that sequence alone. Under rank-one scores (α = 0) a sequence whose rows
    all ask one query (the same float c·x and radius: the keyed separation's rounds ask
    `one`, docs/keyed.md#softmax) gets the same scores, error bounds, average and box at
    every row, formed once from its first row."""
    out = np.empty(C.shape, dtype=C.dtype)
    out_rad = None if st.rad is None else np.empty(C.shape)
    for rows in _batches(st.segment_index(), 1):
        one = np.zeros(len(rows), dtype=bool) if alpha != 0 else _one_query(qa, q_rad, rows)
        for part, ask in ((rows[one], rows[one][:, :1]), (rows[~one], rows[~one])):
            if len(part):
                _softmax_part(st, part, ask, (qa, q_rad, ka, k_rad, alpha, tau, C, C_rad),
                              out, out_rad)
    return out, out_rad


def _one_query(qa, q_rad, rows) -> np.ndarray:
    """Per sequence of a batch (rows B × n): whether its rows all ask one query, the same
    float c·x and radius (a nan query is never the same)."""
    qb = qa[rows]
    same = (qb == qb[:, :1]).all(axis=1)
    if q_rad is not None:
        rb = q_rad[rows]
        same &= (rb == rb[:, :1]).all(axis=1)
    return same


def _softmax_part(st: RowState, rows, ask, head, out, out_rad) -> None:
    """:func:`_float_softmax` on the sequences ``rows`` (B × n), whose scores are those of
    the queries at ``ask`` (``rows`` itself, or their first column where each asks one)."""
    qa, q_rad, ka, k_rad, alpha, tau, C, C_rad = head
    P, wb, Cb = st.P, st.weights()[rows], C[rows]
    S = qa[ask][..., :, None] * ka[rows][..., None, :]
    if alpha != 0:
        S = S + (P[ask] @ P[rows].swapaxes(-1, -2)) * alpha
    Z = S - S.max(axis=-1, keepdims=True)
    if tau != 1:
        Z = Z / tau
    avg = softmax_average(Z, Cb, st.ar, wb[..., None, :])
    if out_rad is None:
        out[rows] = avg
        return
    E = head_radius.score_error(P[ask], st.rad[ask], qa[ask], q_rad[ask], ka[rows],
                                k_rad[rows], alpha)
    out[rows], out_rad[rows] = softmax_box(avg, S, E, wb, tau, Cb, C_rad[rows])


def softmax_average(Z, C, ar: Arithmetic, w=None) -> np.ndarray:
    """The one softmax kernel: Σ_l e^{Z_l}·w_l·C_l / Σ_l e^{Z_l}·w_l, for one row of scores Z
    or for each row of a matrix of them (scores already shifted so that a row's largest is 0,
    and divided by τ; w: the keys' multiplicities, default 1). A matrix of rows normalises its
    weights first and multiplies them into C at once; a single row divides its weighted sum
    once (the mpmath passes, row by row over the keys they keep)."""
    M = ar.exp(Z)
    if w is not None:
        M = M * w
    if M.ndim == 1:
        return (M @ C) / M.sum()
    return (M / M.sum(axis=-1, keepdims=True)) @ C


SAFE_EXPONENT = 250  # float pre-filters trust only magnitudes in [2^-250, 2^250] (see below)


def _trusted_floats(exact: np.ndarray) -> np.ndarray | None:
    """Floats of ``exact`` when every value rounds with *relative* error ≤ 2^-53: each nonzero
    value must land in [2^-250, 2^250]. None when some value is out of that range (it would
    round to a subnormal, to zero or to inf, and a relative bound would no longer hold)."""
    f = safe_floats(exact)
    mag = np.abs(f)
    nonzero = np.asarray(exact != 0, dtype=bool)
    if (nonzero & ((mag < 2.0 ** -SAFE_EXPONENT) | (mag > 2.0 ** SAFE_EXPONENT))).any():
        return None
    return f


def float_scores(X, qa, ka, alpha):
    """The scores (c·x_i)(a·x_l) + α⟨x_i, x_l⟩ in float64 (overflow gives inf or nan)."""
    Xf, qf, kf = safe_floats(X), safe_floats(qa), safe_floats(ka)
    with np.errstate(all="ignore"):
        return np.outer(qf, kf) + (safe_float(alpha) * (Xf @ Xf.T) if alpha != 0 else 0.0)


def softmax_rows_mp(X, qa, ka, alpha, w, tau, ar: Arithmetic, C=None) -> np.ndarray:
    """Softmax averages of the carrier C (default X) in high precision, dropping the weights
    that cannot matter.

    Everything is decided at the pass's precision (mpmath numbers, whose exponent range is
    unbounded): a key is dropped when its weight is below e^cut of the row's largest, with
    e^cut·Σw ≤ 2^-(prec+8). The dropped keys then move the row's average by at most
    e^cut·Σw·(largest distance between two points of the sequence), which is below the
    rounding of the pass itself (see docs/verification.md). For rank-one scores (α = 0) the
    kept keys are a run of the keys sorted by a·x, found by bisection, so sharp attention
    costs O(n log n) high-precision operations instead of O(n²).
    """
    n, C = len(X), X if C is None else C
    cut = -(mpmath.mp.prec + 8) * mpmath.ln2 - mpmath.log(sum(w))
    out = np.empty(C.shape, dtype=object)
    order = sorted(range(n), key=lambda l: ka[l]) if alpha == 0 else None
    ks = [ka[l] for l in order] if order is not None else None
    for i in range(n):
        if order is not None:
            idx = _rank_one_kept(qa[i], ks, order, cut * tau)
            sc = qa[i] * ka[idx]
        else:
            idx = np.arange(n)
            sc = qa[i] * ka + (X @ X[i]) * alpha
        z = (sc - max(sc)) / tau
        if order is None:
            keep = [v >= cut for v in z]
            idx, z = idx[keep], z[keep]
        out[i] = softmax_average(z, C[idx], ar, w[idx])
    return out


def _rank_one_kept(q, ks: list, order: list, gap) -> np.ndarray:
    """Keys l (indices) with q·(k_l − best) ≥ gap (gap = cut·τ ≤ 0), for keys ks sorted
    ascending: the best is the largest k when q > 0, the smallest when q < 0."""
    if q > 0:
        lo = bisect.bisect_left(ks, ks[-1] + gap / q)
        return np.asarray(order[lo:], dtype=int)
    if q < 0:
        hi = bisect.bisect_right(ks, ks[0] + gap / q)
        return np.asarray(order[:hi], dtype=int)
    return np.asarray(order, dtype=int)


def _rank_one_argmax(qa, ka) -> list[np.ndarray]:
    """Exact argmax sets of s_il = (c·x_i)(a·x_l), with no floats: the keys with the largest
    a·x when c·x_i > 0, the smallest when c·x_i < 0, every key when c·x_i = 0. O(n)."""
    kmax, kmin = max(ka), min(ka)
    top = np.flatnonzero([v == kmax for v in ka])
    bottom = np.flatnonzero([v == kmin for v in ka])
    every = np.arange(len(ka))
    return [top if q > 0 else bottom if q < 0 else every for q in qa]


def _exact_candidates(X, qa, ka, alpha) -> np.ndarray:
    """For each row, the keys that can be in its argmax set, from a float64 pre-filter that is
    provably safe, or every key where it is not.

    The filter is used only when X, c·x, a·x and α all round to floats with relative error
    ≤ 2^-53 (nonzero magnitudes in [2^-250, 2^250], so no product or sum of the score
    formula underflows or overflows). Then each float score is within
    B_il = 2(d+6)·2^-53·(|c·x_i||a·x_l| + |α|·Σ_j|x_ij||x_lj|) of the exact one (the
    conversions and d+5 operations, with a factor 2 of slack), and a key more than
    2·max_l B_il below the row's best float score cannot be an argmax.
    """
    n, d = X.shape
    fs = [_trusted_floats(v) for v in (X, qa, ka, np.array([alpha], dtype=object))]
    if any(f is None for f in fs):
        return np.ones((n, n), dtype=bool)
    Xf, qf, kf, (af,) = fs
    absX = np.abs(Xf)
    Sf = np.outer(qf, kf) + (af * (Xf @ Xf.T) if af != 0 else 0.0)
    bound = np.outer(np.abs(qf), np.abs(kf)) + abs(af) * (absX @ absX.T)
    bound *= 2 * (d + 6) * 2.0 ** -53
    return Sf >= (Sf.max(axis=1) - 2 * bound.max(axis=1))[:, None]


def _hardmax_hits(X, qa, ka, alpha) -> np.ndarray:
    """Exact argmax sets (exact or high-precision passes) as a boolean matrix, row i holding
    row i's set: rank one in O(n) exactly, else exact comparisons among the candidates of a
    safe float pre-filter. The candidates always hold the whole argmax set, so a row with a
    single candidate needs no exact score."""
    n = len(X)
    if alpha == 0:
        hit = np.zeros((n, n), dtype=bool)
        for i, idx in enumerate(_rank_one_argmax(qa, ka)):
            hit[i, idx] = True
        return hit
    hit = _exact_candidates(X, qa, ka, alpha)
    for i in np.flatnonzero(hit.sum(axis=1) > 1).tolist():
        idx = np.flatnonzero(hit[i])
        sc = qa[i] * ka[idx] + (X[idx] @ X[i]) * alpha
        best = max(sc)
        hit[i, idx] = [v == best for v in sc]
    return hit


def hardmax_rows(X, qa, ka, alpha, w, stats: PassStats, C=None) -> np.ndarray:
    """Each row's average of the carrier C (default X; multiplicities w) over its exact
    argmax set of scores s_il = (c·x_i)(a·x_l) + α⟨x_i, x_l⟩ (exact and high-precision
    passes, see :func:`_hardmax_hits`): no float rounding can change these sets."""
    hit = _hardmax_hits(X, qa, ka, alpha)
    Sf = float_scores(X, qa, ka, alpha)
    with np.errstate(invalid="ignore"):
        _record_hits(X, Sf, hit, stats, Sf.max(axis=-1), Sf.min(axis=-1))
    C = X if C is None else C
    out = np.empty(C.shape, dtype=C.dtype)
    one = hit.sum(axis=1) == 1
    out[one] = C[hit[one].argmax(axis=1)]  # the mean of one point (w·c/w) is the point itself
    for i in np.flatnonzero(~one).tolist():
        idx = np.flatnonzero(hit[i])
        ws = w[idx]
        out[i] = (ws @ C[idx]) / sum(ws)
    return out


BATCH = 2 * 10**6  # float64 scores per batch of sequences (× carrier columns)


def _batches(sg, k: int):
    """Row indices (B, n) of sequences with n rows each, B at a time so that a batch holds
    about BATCH scores × k carrier columns."""
    lengths = np.diff(np.append(sg.starts, len(sg.seg)))
    for n in np.unique(lengths).tolist():
        segs = np.flatnonzero(lengths == n)
        per = max(1, BATCH // (n * n * k))
        for i in range(0, len(segs), per):
            yield sg.starts[segs[i:i + per], None] + np.arange(n)


def _float_hardmax(st: RowState, qa, q_rad, ka, k_rad, alpha, C, C_rad, stats: PassStats):
    """:func:`head_average`'s hardmax average of the carrier C (and its radius in a tracking
    pass) in a float64 pass, batch by batch of equal-length sequences, the float scores of a
    batch formed once for both."""
    P, rad, w = st.P, st.rad, st.weights()
    out = np.empty(C.shape)
    out_rad = None if rad is None else np.empty(C.shape)
    points = C is P  # the carrier is the points themselves
    for rows in _batches(st.segment_index(), C.shape[1]):
        X, r = P[rows], None if rad is None else rad[rows]
        Cb, Cb_rad = (X, r) if points else (C[rows], None if rad is None else C_rad[rows])
        S = float_scores_batch(X, qa[rows], ka[rows], alpha)
        with np.errstate(invalid="ignore"):
            top, bottom = S.max(axis=-1), S.min(axis=-1)
        avg = float_hardmax_rows(S, X, w[rows], stats, Cb, top, bottom)
        out[rows] = avg
        if rad is not None:
            out_rad[rows] = head_radius.head_radius(S, top, bottom, X, r, qa[rows], q_rad[rows],
                                                  ka[rows], k_rad[rows], alpha, Cb, Cb_rad,
                                                  avg)
    return out, out_rad


def float_scores_batch(X, qa, ka, alpha) -> np.ndarray:
    """The float64 scores (c·x_i)(a·x_l) + α⟨x_i, x_l⟩ of a batch of sequences of equal
    length (X: B × n × d, qa, ka: B × n; overflow gives inf or nan). A rank-one part that is
    exactly 0 (finite c·x and a·x, one of them 0 everywhere: the collapse, A = I) is left
    out, and so is a factor α = 1; that changes at most the sign of a zero score."""
    with np.errstate(all="ignore"):
        gram = None if alpha == 0 else X @ X.swapaxes(-1, -2)
        if gram is not None and alpha != 1:
            gram *= alpha
        if gram is not None and np.isfinite(qa).all() and np.isfinite(ka).all() \
                and not (qa.any() and ka.any()):
            return gram
        S = qa[..., :, None] * ka[..., None, :]
        return S if gram is None else S + gram


def float_hardmax_rows(Sf, X, w, stats: PassStats, C, top, bottom) -> np.ndarray:
    """:func:`hardmax_rows` for a float64 pass, decided on the float scores Sf
    (:func:`float_scores_batch`) of a batch of sequences of equal length at once (X: B × n ×
    d, w: B × n, C: B × n × k; ``top``, ``bottom``: each row's largest and smallest score)."""
    hit = Sf == top[..., None]
    _record_hits(X, Sf, hit, stats, top, bottom)
    M = hit * w[..., None, :]
    return (M / M.sum(axis=-1, keepdims=True)) @ C


def _record_hits(X, Sf, hit, stats: PassStats, top, bottom) -> None:
    """Ties (queries whose best keys hold two distinct points) and the smallest
    best-minus-second float score gap over each sequence's score scale, for one sequence or a
    batch (leading axes; ``top``, ``bottom``: each row's largest and smallest score). A
    report only: float precision is enough, and sequences whose float scores are not finite
    are skipped."""
    if not stats.enabled:
        return
    for at in np.argwhere(hit.sum(axis=-1) > 1):  # queries with several best keys
        best = X[tuple(at[:-1])][hit[tuple(at)]]
        stats.hardmax_ties += int(bool(np.any(best != best[0])))
    if Sf.shape[-1] < 2:
        return
    with np.errstate(all="ignore"):
        scale = np.maximum(np.abs(top), np.abs(bottom)).max(axis=-1)  # max |S| (nan: skipped)
        ok = (np.isfinite(top) & np.isfinite(bottom)).all(axis=-1)
        scale = np.where(scale != 0, scale, 1.0)
        second = np.where(hit, -np.inf, Sf).max(axis=-1)
        gap = (top - second) / scale[..., None]
    keep = ok[..., None] & np.isfinite(second)
    if keep.any():
        stats.note_min("hardmax_margin", float(gap[keep].min()))
