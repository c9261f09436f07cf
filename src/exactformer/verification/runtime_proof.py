"""Enclosures of every reduced-precision evaluation of a model's exported dense computation.

A pass in float64 carries beside each coordinate a midpoint m and a radius r such that
**every** evaluation of the exported graph in a runtime (:mod:`.formats`: float32, TF32,
bfloat16, float16; any summation order and blocking, with or without FMA) lies in
[m − r, m + r]. The graph is the one the torch layouts run (FF: η·x + W·relu(U·x + b); SA:
ρ·x + Σ_h β·y + p·(q·y) with y the hardmax or softmax average under scores
α⟨x_i, x_l⟩ + (c·x_i)(a·x_l)); the TransformerLens layout's own steps are exact rescalings
and erasures, covered as docs/numerics.md#proofs-for-reduced-precision-runtimes says, where
the whole error model is written down. Values that every evaluation computes exactly (every
partial sum a multiple of its terms' lowest bit within the format's significand) keep radius 0,
which is what lets keyed models be proved. NumPy only.
"""

from __future__ import annotations

import math

import numpy as np

from ..evaluate.enclosure import lower, rounding, sum_error, up, upper
from ..model import Transformer
from ..numbers import pad_columns
from .formats import (
    ACC,
    DEFAULT_EXP_ULPS,
    Format,
    conversions,
    fits,
    lowbit,
    matmul_input_error,
    theta,
)

BATCH_CELLS = 2 ** 21  # scores (B·n·n·d for the exactness test) handled at once


# ------------------------------------------------------------------------------ helpers
def _inf_where_overflow(mid, rad, fmt: Format, size=None):
    """Radius inf wherever a stored value, or (``size``) a float32 partial sum, may overflow."""
    with np.errstate(invalid="ignore", over="ignore"):
        bad = ~(np.abs(mid) + rad < fmt.huge)
        if size is not None:
            bad |= ~(size * 2 < ACC.huge)
    return np.where(bad, np.inf, rad)


def _exact(size, q, fmt: Format):
    """Every partial sum of terms that are multiples of q, each partial sum at most ``size``
    in magnitude, is stored exactly in ``fmt`` and in float32, whatever the order
    (docs/numerics.md#proofs-for-reduced-precision-runtimes)."""
    with np.errstate(invalid="ignore", over="ignore"):
        return (q >= fmt.tiny) & (size < q * 2.0 ** fmt.bits)


def quantum(m, r, fmt: Format) -> np.ndarray:
    """A lower bound on the lowest set bit of every stored value in the boxes m ± r: the
    bit itself where r = 0 (inf for 0), else the spacing of ``fmt`` at the box's smallest
    magnitude, or its smallest subnormal where the box holds 0."""
    with np.errstate(invalid="ignore", over="ignore"):
        least_mag = lower(np.abs(m), r)
        _, e = np.frexp(least_mag)
        spacing = np.ldexp(1.0, np.maximum(e, fmt.emin + 1) - fmt.bits)
        least = 2.0 ** (fmt.emin + 1 - fmt.bits)
        box = np.where(least_mag > 0, spacing, least)
        return np.where(r == 0, lowbit(m), np.where(np.isfinite(least_mag), box, 0.0))


def sign_parts(m, r):
    """Upper bounds on max(x, 0) and max(−x, 0) over the boxes m ± r: a subset of terms
    with these bounds sums to at most Σ pos and at least −Σ neg."""
    return np.maximum(high(m, r), 0.0), np.maximum(-low(m, r), 0.0)


def partial_bound(Pm, Pr, Wm):
    """max(Σ positive terms, Σ |negative terms|) of X Wᵀ over the boxes: every partial sum
    of the products lies within it."""
    pos, neg = sign_parts(Pm, Pr)
    Wp, Wn = np.maximum(Wm, 0.0), np.maximum(-Wm, 0.0)
    return np.maximum(pos @ Wp.T + neg @ Wn.T, neg @ Wp.T + pos @ Wn.T)


def low(m, r):
    """A float ≤ every value of the boxes m ± r (m itself where r = 0)."""
    with np.errstate(invalid="ignore"):
        return np.where(r == 0, m, lower(m, r))


def high(m, r):
    """A float ≥ every value of the boxes m ± r (m itself where r = 0)."""
    with np.errstate(invalid="ignore"):
        return np.where(r == 0, m, upper(m, r))


def _point(x) -> float:
    return float(x)


class Weights:
    """A layer's parameters as the runtime stores them: midpoints and radii (0 unless the
    two ways of converting to the format differ, :func:`.formats.conversions`)."""

    def __init__(self, values: dict, fmt: Format):
        for name, v in values.items():
            m, r = conversions(np.asarray(v, dtype=float), fmt)
            setattr(self, name, m)
            setattr(self, name + "_r", r)


# ------------------------------------------------------------------------------ linear maps
def linear(Xm, Xr, Wm, Wr, b, br, fmt: Format):
    """Every runtime value of X Wᵀ + b (X: T×k boxes, W: c×k, b: c or None): midpoint, the
    spread |W|·r of the exact map over the boxes, the rounding (of the runtime's products,
    sums and store, of the float64 midpoint, and the conversion radii Wr, br) and where the
    runtime rounds nowhere (then the rounding is the midpoint's alone: 0 without radius),
    as the quantum every runtime value there is a multiple of (0 elsewhere)."""
    aW = np.abs(Wm)
    aX = np.abs(Xm) + Xr
    bias = np.zeros(len(Wm)) if b is None else b
    k = int((Wm != 0).sum(axis=1).max(initial=0)) + (b is not None)
    mid = Xm @ Wm.T + bias
    spread = pos_up(Xr @ aW.T, k + 2)
    S = pos_up(aX @ aW.T + np.abs(bias), k + 2)
    conv = 0.0
    if Wr.any() or (br is not None and br.any()):
        conv = aX @ Wr.T + (0.0 if br is None else br)
    f64 = np.where(spread > 0, rounding(S, k), 0.0)
    rnd = (theta(k + 2, 2, fmt) + matmul_input_error(fmt)) * S + (2 * k + 4) * fmt.tiny
    rnd = up(rnd + rounding(S, k) + conv, 6)
    part = partial_bound(np.concatenate([Xm, np.ones((len(Xm), 1))], axis=1),
                         np.concatenate([Xr, np.zeros((len(Xm), 1))], axis=1),
                         np.concatenate([Wm, bias[:, None]], axis=1))
    exact, q = _linear_exact(Xm, Xr, Wm, Wr, bias, pos_up(part, k + 2), fmt)
    if br is not None:
        exact &= br == 0
    rnd = np.where(exact, f64, rnd)
    rnd = _inf_where_overflow(mid, rnd + spread, fmt, S) - spread
    return mid, spread, rnd, np.where(exact, q, 0.0)


def _linear_exact(Xm, Xr, Wm, Wr, b, part, fmt: Format):
    """Where X Wᵀ + b rounds nowhere in any evaluation: the terms' lowest bits (per unit's
    support, the inputs' :func:`quantum` times lowbit(w)) fit every partial sum in the
    format (for TF32, every input also has at most 11 bits, known only without radius);
    and those quanta."""
    exact = np.zeros(part.shape, dtype=bool)
    quanta = np.zeros(part.shape)
    nz = Wm != 0
    lbX, lbW, lbb = quantum(Xm, Xr, fmt), lowbit(Wm).min(axis=1, initial=np.inf), lowbit(b)
    okW = (Wr == 0).all(axis=1)
    if fmt.matmul_bits is not None:
        okW &= fits(Wm, fmt.matmul_bits).all(axis=1)
    supports, which = np.unique(nz, axis=0, return_inverse=True)
    for s, support in enumerate(supports):
        units = np.flatnonzero(which.reshape(-1) == s)
        cols = np.flatnonzero(support)
        qx = lbX[:, cols].min(axis=1, initial=np.inf)
        ok = np.ones(len(Xm), dtype=bool)
        if fmt.matmul_bits is not None:
            ok = fits(Xm[:, cols], fmt.matmul_bits).all(axis=1) & ~(Xr[:, cols] > 0).any(axis=1)
        with np.errstate(over="ignore", invalid="ignore"):
            q = np.minimum(qx[:, None] * lbW[units], lbb[units])
        exact[:, units] = ok[:, None] & okW[units] & _exact(part[:, units], q, fmt)
        quanta[:, units] = q
    return exact, quanta


# ------------------------------------------------------------------------------ FF layers
def ff_box(Xm, Xr, w: Weights, fmt: Format):
    """Every runtime value of η·x + W·relu(U·x + b) on the boxes X ± Xr (T×D): the
    certainly active units' affine piece moves by at most |J|·r (:func:`jacobian_spread`),
    every undecided unit by its output's spread, and the output sum rounds once more
    (nowhere, where the terms' quanta fit every partial sum). In a residual layer, rows at
    which every unit is off even under a coarse bound pass as they are (x + 0 is x), and only
    the others are enclosed: a keyed layer moves a few rows."""
    if _point(w.eta) == 1 and w.eta_r == 0 and len(Xm) > 64:
        k = int((w.U != 0).sum(axis=1).max(initial=0)) + 1
        aX = np.abs(Xm) + Xr
        Z = Xm @ w.U.T + w.b
        S = aX @ (np.abs(w.U) + w.U_r).T + np.abs(w.b) + w.b_r
        coarse = Xr @ np.abs(w.U).T + (theta(k + 2, 2, fmt) + matmul_input_error(fmt)) * S + \
            rounding(S, k)
        with np.errstate(invalid="ignore"):
            hi = upper(Z, up(coarse, k + 4) + (2 * k + 8) * fmt.tiny)
            rows = np.flatnonzero(~(hi <= 0).all(axis=1))  # some unit may be on
        if len(rows) < len(Xm):
            Ym, Yr = Xm.copy(), Xr.copy()
            if len(rows):
                Ym[rows], Yr[rows] = _ff_rows(Xm[rows], Xr[rows], w, fmt)
            return Ym, Yr
    return _ff_rows(Xm, Xr, w, fmt)


def _ff_rows(Xm, Xr, w: Weights, fmt: Format):
    """:func:`ff_box` on every row."""
    eta, W = _point(w.eta), w.W
    Zm, Zs, Zq, Zexact = linear(Xm, Xr, w.U, w.U_r, w.b, w.b_r, fmt)
    Zr = Zs + Zq
    with np.errstate(invalid="ignore"):
        lo, hi = low(Zm, Zr), high(Zm, Zr)
        active, unsure = lo > 0, ~(lo > 0) & ~(hi <= 0)
        top = np.where(unsure, upper(np.maximum(hi, 0.0) * 0.5, 0.0), 0.0)
    Am = np.where(active, Zm, top)  # the stored ReLU outputs' boxes: Am ± Ar
    Ar = np.where(active, Zr, top)
    aW = np.abs(W)
    mid = eta * Xm + Am @ W.T
    jac = jacobian_spread(Xr, active, W, w.U, eta)
    chain = pos_up((Zq * active + top) @ aW.T, W.shape[1] + 2)
    k = int((W != 0).sum(axis=1).max(initial=0)) + 1
    S = pos_up(abs(eta) * (np.abs(Xm) + Xr) + (np.abs(Am) + Ar) @ (aW + w.W_r).T, k + 2)
    rnd = (theta(k + 2, 3, fmt) + matmul_input_error(fmt)) * S + (2 * k + 6) * fmt.tiny
    rnd = up(rnd + rounding(S, k) + (np.abs(Am) + Ar) @ w.W_r.T, 6)
    exact, q = _ff_exact(Xm, Xr, Am, Ar, Zexact, active | unsure, w, k, fmt)
    inexact_in = ((Xr > 0) & (eta != 0)) | \
        ((((active | unsure) & (Ar > 0)).astype(float) @ (W != 0).T.astype(float)) > 0)
    f64 = np.where(inexact_in, rounding(S, k), 0.0)  # the float64 midpoint's own rounding
    rad = _inf_where_overflow(mid, jac + chain + np.where(exact, f64, rnd), fmt, S)
    # a value every evaluation computes alike: no rounding, a constant affine piece (J = 0),
    # and the midpoint nearer to it than half its quantum — it is the multiple of q nearest
    loose = (unsure | (active & (Zexact == 0))).astype(float) @ (W != 0).T.astype(float)
    snap = exact & (jac == 0) & (loose == 0)  # only units exactly computed write it
    with np.errstate(invalid="ignore", over="ignore"):
        snap &= up(chain + f64, 4) < q * 0.5
        mid = np.where(snap, np.rint(mid / np.where(snap, q, 1.0)) * np.where(snap, q, 1.0), mid)
    rad = np.where(snap, 0.0, rad)
    if eta == 1 and w.eta_r == 0:  # a coordinate no unit that may be on writes: x + 0
        touched = ((active | unsure).astype(float) @ (W != 0).T.astype(float)) > 0
        keep = ~touched & np.isfinite(Xm)
        mid, rad = np.where(keep, Xm, mid), np.where(keep, Xr, rad)
    return mid, rad


def _ff_exact(Xm, Xr, Am, Ar, Zq, on, w: Weights, k: int, fmt: Format):
    """Where the FF's output sum η·x_c + Σ_k W_ck·a_k rounds nowhere: its terms' quanta (the
    units that may be on, :func:`quantum`) fit every partial sum in the format; and the
    quanta (each output a multiple of it). ``Zq``: the quanta of exactly computed
    pre-activations (:func:`linear`), finer knowledge than their boxes give."""
    eta = _point(w.eta)
    W = w.W
    qA = np.where(on, np.maximum(quantum(Am, Ar, fmt), Zq), np.inf)
    lbW = lowbit(W)
    if fmt.matmul_bits is not None:  # the second product's inputs are cut in TF32
        qA = np.where(fits(Am, fmt.matmul_bits) & (Ar == 0), qA, 0.0)
        lbW = np.where(fits(W, fmt.matmul_bits), lbW, 0.0)
    with np.errstate(over="ignore", invalid="ignore"):
        q = np.where(eta == 0, np.inf, lowbit(eta) * quantum(Xm, Xr, fmt))
        for unit in range(W.shape[1]):  # per output, over the units that may write it
            term = qA[:, unit, None] * lbW[None, :, unit]
            q = np.minimum(q, np.where(np.isnan(term), np.inf, term))
    Ap, An = sign_parts(np.where(on, Am, 0.0), np.where(on, Ar, 0.0))
    Xp, Xn = sign_parts(eta * Xm, abs(eta) * Xr)
    Wp, Wn = np.maximum(W, 0.0), np.maximum(-W, 0.0)
    part = np.maximum(Xp + Ap @ Wp.T + An @ Wn.T, Xn + An @ Wp.T + Ap @ Wn.T)
    ok = (w.W_r == 0).all() & (w.eta_r == 0)
    return ok & _exact(pos_up(part, k + 2), q, fmt), q


def jacobian_spread(Xr, active, W, U_, eta: float) -> np.ndarray:
    """Per row, |J|·r for J = η·I + Σ_{k active} W_k U_kᵀ, the exact Jacobian of the row's
    affine piece, with J's float64 rounding unless J is exact (its entries' quanta fit).
    Rows are grouped by their pattern of active units; rows without radius get 0."""
    out = np.zeros_like(Xr)
    moving = np.flatnonzero(Xr.any(axis=1))
    if not len(moving):
        return out
    patterns, which = np.unique(active[moving], axis=0, return_inverse=True)
    which = which.reshape(-1)
    d = W.shape[0]
    for g, pat in enumerate(patterns):
        rows = moving[which == g]
        Wp, Up = W[:, pat], U_[pat]
        J = eta * np.eye(d) + Wp @ Up
        size = abs(eta) * np.eye(d) + np.abs(Wp) @ np.abs(Up)
        with np.errstate(over="ignore", invalid="ignore"):
            q = np.minimum(lowbit(eta) * np.where(np.eye(d) > 0, 1.0, np.inf),
                           lowbit(Wp).min(axis=1, initial=np.inf)[:, None] *
                           lowbit(Up).min(axis=0, initial=np.inf)[None, :])
            exact = (q >= 2.0 ** -1000) & (size < q * 2.0 ** 53)
        aJ = np.abs(J) + np.where(exact, 0.0, rounding(size, int(pat.sum()) + 1))
        out[rows] = pos_up(Xr[rows] @ aJ.T, d + 2)
    return out


def pos_up(x, n: int):
    """:func:`up` of a nonnegative float64 result, leaving exact zeros 0: no product of the
    pass underflows (radii and midpoints below 2^-600 are raised or cleared, :func:`_block`),
    so a computed 0 is a sum of exact zeros."""
    with np.errstate(invalid="ignore"):
        return np.where(x > 0, up(x, n), np.where(x == 0, 0.0, np.inf))  # nan: unknown


# ------------------------------------------------------------------------------ attention
class Context:
    """What every attention layer of one proof shares: the format, the attention kind, the
    causal mask, softmax's temperature and exp bound, and the hardmax slack of the
    TransformerLens layout (:func:`lens_slack`)."""

    def __init__(self, model: Transformer, fmt: Format, exp_ulps: float):
        self.fmt, self.attention, self.causal = fmt, model.attention, model.causal
        self.tau = 1.0 if model.tau is None else float(model.tau)
        self.exp_err = exp_ulps * 2.0 ** -23 * (1 + 2.0 ** -40)
        self.slack = lens_slack(model) if model.attention == "hardmax" else 0.0


def lens_slack(model: Transformer) -> float:
    """The score margin below which the TransformerLens layout's hardmax (softmax of the
    scores times 2^k, docs/numerics.md#the-transformerlens-export) may give a key a nonzero
    weight in float32: 104·2^−k with 2^k·g = 2^64 rounded down, g = max |α| + ‖a‖·‖c‖."""
    g = 0.0
    for blk in model.blocks:
        for h in ([] if blk.sa is None else blk.sa.heads):
            a, c = np.asarray(h.A.a, dtype=float), np.asarray(h.A.c, dtype=float)
            g = max(g, abs(float(h.A.alpha)) + float(np.linalg.norm(a) * np.linalg.norm(c)))
    k = 64 if g == 0 else 64 - math.ceil(math.log2(g))
    return 104.0 * 2.0 ** -k


def sa_box(Xm, Xr, sa_w: list, rho: Weights, ctx: Context):
    """Every runtime value of ρ·x_i + Σ_h V_h·y_h, V_h = β_h·I + p_h·q_hᵀ, on a batch of
    sequences of one length (B×n×D boxes); ``sa_w`` holds each head's :class:`Weights`.

    The three layouts apply V in three orders — the torch module β·y + p·(q·y), TransformerLens
    the dense V after the average, the ρ/η layout the dense V on every key before it — with
    the same elementary terms ρ·x_c and V_cj·π_l·x_lj. So the exact value (for the runtime's
    weights) is enclosed from the average's box, and the rounding of any of the orders by
    θ times the sum M of those terms' sizes; it is 0 where their quanta fit M in the format
    (docs/numerics.md#proofs-for-reduced-precision-runtimes)."""
    fmt = ctx.fmt
    r0 = _point(rho.v)
    aX = np.abs(Xm) + Xr
    mid = r0 * Xm
    spread = abs(r0) * Xr + rho.v_r * aX
    M = (abs(r0) + rho.v_r) * aX
    with np.errstate(over="ignore", invalid="ignore"):
        q = np.where((r0 == 0) & (rho.v_r == 0), np.inf, lowbit(r0) * quantum(Xm, Xr, fmt))
    exact = rho.v_r == 0
    untouched = np.full(Xm.shape[-1], r0 == 1 and rho.v_r == 0)
    n, D = Xm.shape[1], Xm.shape[2]
    for w in sa_w:
        Ym, Ys, Ybar, qy = head_box(Xm, Xr, w, ctx)
        beta, aq, ap = _point(w.beta), np.abs(w.q) + w.q_r, np.abs(w.p) + w.p_r
        aY = np.abs(Ym) + Ys
        mid = mid + beta * Ym + (Ym @ w.q)[..., None] * w.p
        spread = spread + abs(beta) * Ys + w.beta_r * aY + \
            (Ys @ np.abs(w.q) + aY @ w.q_r)[..., None] * np.abs(w.p) + \
            (aY @ aq)[..., None] * w.p_r
        M = M + (abs(beta) + w.beta_r) * Ybar + (Ybar @ aq)[..., None] * ap
        q, exact = _value_quanta(q, exact, qy, w, fmt)
        untouched &= (beta == 0) & (w.beta_r == 0) & (w.p == 0) & (w.p_r == 0)
    k = n + D + 2 * len(sa_w) + 6  # roundings on any term's path, in any of the orders
    spread = pos_up(spread, 2 * D + 8)
    M = pos_up(M, 2 * D + 8)
    rnd = (theta(k, k, fmt) + 2 * matmul_input_error(fmt)) * M + 4 * k * fmt.tiny + \
        rounding(M, k)
    exact = exact & _exact(M, q, fmt)
    f64 = np.where(spread > 0, rounding(M, k), 0.0)
    rad = _inf_where_overflow(mid, spread + pos_up(np.where(exact, f64, rnd), 4), fmt, M)
    keep = untouched & np.isfinite(mid)
    return np.where(keep, Xm, mid), np.where(keep, Xr, rad)


def _value_quanta(q, exact, qy, w: Weights, fmt: Format):
    """The quanta of a head's terms V_cj·π_l·x_lj (``qy``: per row and j, those of π_l·x_lj)
    folded into ``q``, and ``exact`` cleared where a stored V entry or factor is uncertain or
    not a stored value itself (TransformerLens and ρ/η store V = β·I + p·qᵀ densely)."""
    beta = _point(w.beta)
    V = beta * np.eye(len(w.p)) + np.outer(w.p, w.q)
    exact = exact & (w.beta_r == 0) & (w.p_r == 0).all() & (w.q_r == 0).all()
    exact = exact & bool((conversions(V, fmt)[0] == V).all())
    lbV = np.minimum(np.where(beta != 0, lowbit(beta), np.inf) * np.where(np.eye(len(w.p)) > 0,
                                                                          1.0, np.inf),
                     np.outer(lowbit(w.p), lowbit(w.q)))  # per (c, j); inf where 0
    if fmt.matmul_bits is not None:
        exact = exact & bool(fits(V, fmt.matmul_bits).all())
    with np.errstate(over="ignore", invalid="ignore"):
        for j in range(len(w.q)):  # q_c = min_j lbV[c, j]·qy[j]
            term = qy[..., j, None] * lbV[None, None, :, j]
            q = np.minimum(q, np.where(np.isnan(term), np.inf, term))
    return q, exact


def scores_box(Xm, Xr, w: Weights, ctx: Context):
    """Every runtime value of the scores α⟨x_i, x_l⟩ + (c·x_i)(a·x_l) of one head (B×n×n),
    in either layout's order (the torch module's α·gram + P·Q, TransformerLens's q·k of
    d + 1 terms): midpoint and radius."""
    fmt = ctx.fmt
    B, n, D = Xm.shape
    X2, R2 = Xm.reshape(-1, D), Xr.reshape(-1, D)
    Pm, Ps, Pq, _ = linear(X2, R2, w.c[None], w.c_r[None], None, None, fmt)
    Qm, Qs, Qq, _ = linear(X2, R2, w.a[None], w.a_r[None], None, None, fmt)
    Pm, Pr = Pm.reshape(B, n), (Ps + Pq).reshape(B, n)
    Qm, Qr = Qm.reshape(B, n), (Qs + Qq).reshape(B, n)
    aP, aQ = np.abs(Pm) + Pr, np.abs(Qm) + Qr
    mid = Pm[:, :, None] * Qm[:, None, :]
    spread = np.abs(Pm)[:, :, None] * Qr[:, None, :] + Pr[:, :, None] * aQ[:, None, :]
    size = aP[:, :, None] * aQ[:, None, :]
    alpha, alpha_r = _point(w.alpha), float(w.alpha_r)
    aX = np.abs(Xm) + Xr
    qX = quantum(Xm, Xr, fmt).min(axis=2)
    with np.errstate(over="ignore", invalid="ignore"):
        q = quantum(Pm, Pr, fmt)[:, :, None] * quantum(Qm, Qr, fmt)[:, None, :]
    exact = np.ones(mid.shape, dtype=bool)
    if alpha != 0 or alpha_r != 0:
        XT = np.swapaxes(Xm, 1, 2)
        G = Xm @ XT
        SG = aX @ np.swapaxes(aX, 1, 2)
        mid = mid + alpha * G
        spread = spread + abs(alpha) * (Xr @ np.abs(XT) + aX @ np.swapaxes(Xr, 1, 2)) + \
            alpha_r * SG
        size = size + (abs(alpha) + alpha_r) * SG
        exact &= (alpha_r == 0) & (lowbit(alpha) == abs(alpha))  # α a power of two
        with np.errstate(over="ignore", invalid="ignore"):
            q = np.minimum(q, abs(alpha) * qX[:, :, None] * qX[:, None, :])
            exact &= (abs(alpha) * qX >= fmt.tiny)[:, :, None]
    if fmt.matmul_bits is not None:
        cut = fits(Pm, fmt.matmul_bits) & (Pr == 0) & \
            (fits(Xm, fmt.matmul_bits) & (Xr == 0)).all(axis=2)
        cutq = fits(Qm, fmt.matmul_bits) & (Qr == 0) & \
            (fits(Xm, fmt.matmul_bits) & (Xr == 0)).all(axis=2)
        exact &= cut[:, :, None] & cutq[:, None, :]
    size = pos_up(size, D + 4)
    spread = pos_up(spread, D + 4)
    rnd = (theta(D + 4, 4, fmt) + matmul_input_error(fmt)) * size + \
        (2 * D + 10) * fmt.tiny * max(1.0, abs(alpha)) + rounding(size, D + 2)
    if ctx.attention == "softmax" and ctx.tau != 1:
        mid, spread, size = mid / ctx.tau, spread / ctx.tau, size / ctx.tau
        rnd = rnd / ctx.tau + theta(1, 1, fmt) * size + fmt.tiny
        exact &= lowbit(ctx.tau) == ctx.tau
    exact &= _exact(size, q, fmt)
    f64 = np.where(spread > 0, rounding(size, D + 2), 0.0)
    rad = spread + pos_up(np.where(exact, f64, rnd), 4)
    return mid, _inf_where_overflow(mid, rad, fmt, size)


def _allowed(n: int, causal: bool) -> np.ndarray:
    return np.tril(np.ones((n, n), dtype=bool)) if causal else np.ones((n, n), dtype=bool)


def head_box(Xm, Xr, w: Weights, ctx: Context):
    """One head's average y_i = Σ_l π_il x_l under every runtime's weights, as the box of its
    exact value (midpoint and radius, B×n×D), a bound on Σ_l |π_il|·|x_l| (its terms'
    sizes) and the quanta of the terms π_il·x_l (0 where unknown); the rounding of the
    average is left to :func:`sa_box`."""
    sm, sr = scores_box(Xm, Xr, w, ctx)
    allowed = _allowed(Xm.shape[1], ctx.causal)
    if ctx.attention == "softmax":
        Pm, Pr = softmax_box(sm, sr, allowed, ctx)
        return mix(Pm, Pr, Xm, Xr, ctx.fmt)
    return hardmax_box(sm, sr, allowed, Xm, Xr, ctx)


def hardmax_box(sm, sr, allowed, Xm, Xr, ctx: Context):
    """A row whose candidates (keys whose score may reach the best certain one, less the
    TransformerLens slack) are one key, or an exact tie every evaluation sees as one, takes
    weights 1/|C| rounded; any other row averages some of its candidates with weights that sum
    to 1 up to rounding, which lies in the hull of their boxes, widened by that rounding."""
    fmt = ctx.fmt
    with np.errstate(invalid="ignore"):
        lo = np.where(allowed, low(sm, sr), -np.inf)
        hi = np.where(allowed, high(sm, sr), -np.inf)
        best = lo.max(axis=2, keepdims=True)
        cand = allowed & ~(hi < best - ctx.slack)
    top = np.where(cand, sm, -np.inf).max(axis=2, keepdims=True)
    count = cand.sum(axis=2)
    tie = (count == 1) | (~cand | ((sr == 0) & (sm == top))).all(axis=2)
    inv = 1.0 / np.maximum(count, 1)
    exact_w = lowbit(inv) == inv  # 1/|C| a power of two: stored exactly
    Pm = np.where(cand, inv[:, :, None], 0.0)
    Pr = np.where(cand, np.where(exact_w, 0.0, (fmt.u + ACC.u + 2.0 ** -52) * inv)[:, :, None],
                  0.0)  # fl(1/|C|), perhaps rounded twice (float32, then the format)
    Ym, Yr, Ybar, qy = mix(Pm, Pr, Xm, Xr, fmt)
    for b, i in zip(*np.nonzero(~tie), strict=True):
        Ym[b, i], Yr[b, i], Ybar[b, i] = _hull(Xm[b, cand[b, i]], Xr[b, cand[b, i]], ctx)
        qy[b, i] = 0.0
    return Ym, Yr, Ybar, qy


def _hull(C, C_r, ctx: Context):
    """The box of Σ_l π_l·x_l for weights π ≥ 0 whose sum is within ε of 1 (ε: their
    rounding, or a softmax at 2^k in the TransformerLens layout) and x_l in the boxes
    C ± C_r (one query's candidates); and the bound on Σ_l π_l·|x_l|."""
    fmt, k = ctx.fmt, len(C)
    eps = fmt.u + theta(k + 3, 3, fmt) + ctx.exp_err
    with np.errstate(invalid="ignore"):
        lo, hi = lower(C, C_r).min(axis=0), upper(C, C_r).max(axis=0)
        mid = (lo + hi) * 0.5
        big = upper(np.maximum(np.abs(lo), np.abs(hi)), 0.0)
        rad = up(upper(np.maximum(hi - mid, mid - lo), 0.0) + eps * big, 4)
    ok = np.isfinite(rad) & np.isfinite(mid)
    return mid, np.where(ok, rad, np.inf), np.where(ok, up(big * (1 + eps), 2), np.inf)


def softmax_box(sm, sr, allowed, ctx: Context):
    """Every runtime value of softmax weights from score boxes: exp(s_l − max) with the
    subtraction and exp rounded (exp within ``exp_ulps`` float32 ulps), summed and divided;
    the max ranges over [max lo, max hi]."""
    fmt = ctx.fmt
    u = max(fmt.u, ACC.u)
    n = sm.shape[-1]
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        lo = np.where(allowed, low(sm, sr), -np.inf)
        hi = np.where(allowed, high(sm, sr), -np.inf)
        mlo, mhi = lo.max(axis=2, keepdims=True), hi.max(axis=2, keepdims=True)
        g_lo, g_hi = lo - mhi, np.minimum(hi - mlo, 0.0)
        # a key certainly above every other is the max itself: exp(s − max) = exp(0)
        top = np.argmax(lo, axis=2)[..., None]
        rivals = np.where(np.arange(n) == top, -np.inf, hi).max(axis=2, keepdims=True)
        sure = (np.arange(n) == top) & (np.take_along_axis(lo, top, axis=2) > rivals)
        g_lo, g_hi = np.where(sure, 0.0, g_lo), np.where(sure, 0.0, g_hi)
        g_lo = lower(g_lo - u * np.abs(g_lo), 0.0)
        g_hi = upper(g_hi + u * np.abs(g_hi), 0.0)
        rel = ctx.exp_err + u + 2.0 ** -50
        e_lo = np.maximum(np.exp(g_lo) * (1 - rel) - fmt.tiny, 0.0)
        e_hi = np.exp(np.minimum(g_hi, 0.0)) * (1 + rel) + fmt.tiny
        e_lo, e_hi = np.where(allowed, e_lo, 0.0), np.where(allowed, e_hi, 0.0)
        t = theta(n + 1, 1, fmt)
        z_lo = e_lo.sum(axis=2, keepdims=True) * (1 - t - 2.0 ** -50) - n * fmt.tiny
        z_hi = e_hi.sum(axis=2, keepdims=True) * (1 + t + 2.0 ** -50) + n * fmt.tiny
        p_lo = np.maximum(lower(e_lo / z_hi * (1 - 2 * u), 0.0) - fmt.tiny, 0.0)
        p_hi = np.minimum(upper(e_hi / np.maximum(z_lo, 0.0) * (1 + 2 * u), 0.0) + fmt.tiny,
                          1.0)
        p_lo, p_hi = np.where(allowed, p_lo, 0.0), np.where(allowed, p_hi, 0.0)
        mid = (p_lo + p_hi) * 0.5
        rad = upper(np.maximum(p_hi - mid, mid - p_lo), 0.0)
    bad = ~np.isfinite(rad).all(axis=2, keepdims=True) | ~(z_lo > 0)
    return np.where(bad, 0.5, mid), np.where(bad, np.inf, rad)


def mix(Pm, Pr, Xm, Xr, fmt: Format):
    """Σ_l π_il x_l for weight boxes Pm ± Pr (B×n×n) and value boxes (B×n×D): the box of its
    exact value, the bound on Σ_l |π_il|·|x_l|, and the terms' quanta (:func:`head_box`)."""
    n = Pm.shape[-1]
    aX = np.abs(Xm) + Xr
    aP = np.abs(Pm) + Pr
    mid = Pm @ Xm
    spread = pos_up(Pr @ aX + np.abs(Pm) @ Xr, n + 2)
    S = pos_up(aP @ aX, n + 2)
    f64 = np.where(S > 0, rounding(S, n), 0.0)  # the float64 midpoint's own rounding
    return mid, spread + np.where(_mix_points(Pm, Pr, Xm, Xr), 0.0, f64), S, \
        _mix_quanta(Pm, Pr, Xm, Xr, fmt)


def _mix_points(Pm, Pr, Xm, Xr) -> np.ndarray:
    """Rows whose weights and keys are all points (then the float64 midpoint is checked
    exact by :func:`sa_box`'s quanta, and carries no rounding of its own)."""
    return ((Pr == 0).all(axis=2)[..., None] & (Xr == 0).all(axis=(1, 2))[:, None, None])


def _mix_quanta(Pm, Pr, Xm, Xr, fmt: Format) -> np.ndarray:
    """Per row and coordinate, a lower bound on the lowest bit of every term π_il·x_lj over
    the keys whose weight may be nonzero (:func:`quantum`; 0 where a weight is uncertain or,
    in TF32, may be cut)."""
    B, n, D = Xm.shape
    lbP = np.where((Pm != 0) | (Pr > 0), quantum(Pm, Pr, fmt), np.inf)
    lbP = np.where(Pr > 0, 0.0, lbP)
    lbX = quantum(Xm, Xr, fmt)
    if fmt.matmul_bits is not None:
        lbP = np.where(fits(Pm, fmt.matmul_bits) & (Pr == 0), lbP, 0.0)
        lbX = np.where(fits(Xm, fmt.matmul_bits) & (Xr == 0), lbX, 0.0)
    q = np.empty((B, n, D))
    step = max(1, BATCH_CELLS // max(1, n * n * D))
    with np.errstate(over="ignore", invalid="ignore"):
        for s in range(0, B, step):
            prod = lbP[s:s + step, :, :, None] * lbX[s:s + step, None, :, :]
            q[s:s + step] = np.where(np.isnan(prod), np.inf, prod).min(axis=2)
    return q


# ------------------------------------------------------------------------------ the pass
def prepare(model: Transformer, fmt: Format):
    """Each block's runtime weights: (FF Weights or None, (ρ Weights, [head Weights]) or
    None)."""
    params = model.to_float() if model.exact else model
    out = []
    for blk in params.blocks:
        ff = None if blk.ff is None else Weights(
            {"eta": blk.ff.eta, "U": blk.ff.U, "b": blk.ff.b, "W": blk.ff.W}, fmt)
        sa = None
        if blk.sa is not None and not blk.sa.is_identity():
            heads = [Weights({"alpha": h.A.alpha, "a": h.A.a, "c": h.A.c, "beta": h.V.beta,
                              "p": h.V.p, "q": h.V.q}, fmt) for h in blk.sa.heads]
            sa = (Weights({"v": blk.sa.rho}, fmt), heads)
        out.append((ff, sa))
    return out, params


def enclose_runtime(model: Transformer, inputs: list[np.ndarray], fmt: Format,
                    exp_ulps: float = DEFAULT_EXP_ULPS) -> list[tuple[np.ndarray, np.ndarray]]:
    """(midpoints, radii) per sequence (n_j × D) enclosing the output of every evaluation of
    the exported dense computation in ``fmt`` on ``inputs`` (zero-padded to the model's
    width and stored in the format first; a causal model's positions added, rounded)."""
    layers, params = prepare(model, fmt)
    ctx = Context(model, fmt, exp_ulps)
    xs = pad_columns([np.asarray(x, dtype=float) for x in inputs], model.d)
    outs: list = [None] * len(xs)
    for n in sorted({len(x) for x in xs}):
        js = [j for j, x in enumerate(xs) if len(x) == n]
        Xm, Xr = guard(*conversions(np.stack([xs[j] for j in js]), fmt))
        if params.positions is not None:
            Xm, Xr = guard(*_add_positions(Xm, Xr, np.asarray(params.positions[:n], dtype=float),
                                           fmt))
        with np.errstate(invalid="ignore", over="ignore"):
            for ff, sa in layers:
                Xm, Xr = _block(Xm, Xr, ff, sa, ctx)
        for j, m, r in zip(js, Xm, Xr, strict=True):
            outs[j] = (m, r)
    return outs


def _block(Xm, Xr, ff, sa, ctx: Context):
    B, n, D = Xm.shape
    if ff is not None:
        m, r = ff_box(Xm.reshape(-1, D), Xr.reshape(-1, D), ff, ctx.fmt)
        Xm, Xr = m.reshape(B, n, D), r.reshape(B, n, D)
    if sa is not None:
        Xm, Xr = sa_box(Xm, Xr, sa[1], sa[0], ctx)
    return guard(Xm, Xr)


def guard(Xm, Xr):
    """Boxes fit for the next layer's float64 bounds: nan becomes an unknown (inf) radius,
    radii in (0, 2^-600) are raised to 2^-600 and midpoints there cleared into the radius, so
    that no product of two of them with a stored weight underflows (:func:`pos_up`)."""
    small = 2.0 ** -600
    tiny_m = (np.abs(Xm) < small) & (Xm != 0)
    Xr = np.where(tiny_m, Xr + small, Xr)
    Xm = np.where(tiny_m, 0.0, Xm)
    Xr = np.where((Xr > 0) & (Xr < small), small, Xr)
    return Xm, np.where(np.isnan(Xr) | np.isnan(Xm), np.inf, Xr)


def _add_positions(Xm, Xr, P, fmt: Format):
    """x + position, stored: exact where the float64 sum is (TwoSum) and is a stored value."""
    Pm, Pr = conversions(P, fmt)
    mid = Xm + Pm
    err = sum_error(Xm, np.broadcast_to(Pm, Xm.shape), mid)
    size = np.abs(mid) + Xr + Pr
    exact = (err == 0) & (Xr == 0) & (Pr == 0) & (conversions(mid, fmt)[0] == mid)
    rad = up(Xr + Pr + err + theta(1, 1, fmt) * size + fmt.tiny, 4)
    return mid, _inf_where_overflow(mid, np.where(exact, 0.0, rad), fmt)
