"""The scores of the runtime proofs' attention layers: every runtime value of
α⟨x_i, x_l⟩ + (c·x_i)(a·x_l) in either layout's order, and the :class:`Context` that every
attention layer of one proof shares (docs/numerics.md#proofs-for-reduced-precision-runtimes).
The weights, averages and value map are :mod:`.runtime_attention`. NumPy only.
"""

from __future__ import annotations

import math

import numpy as np

from ..evaluate.enclosure import rounding
from ..evaluate.grid import fits_exactly, lowbit
from ..lens_plan import hardmax_exponent_for
from ..model import Transformer
from .formats import (
    ACC,
    Format,
    alpha_cuts,
    chained_cut_error,
    fits,
    matmul_input_error,
    theta,
)
from .runtime_boxes import (
    Weights,
    linear,
    may_overflow,
    pos_up,
    quantum,
    scalar,
    unknown_if_overflow,
)


class Context:
    """What every attention layer of one proof shares: the format, the attention kind, the
    causal mask, softmax's temperature and exp bound, and the hardmax slack of the
    TransformerLens layout (:func:`lens_slack`)."""

    def __init__(self, model: Transformer, fmt: Format, exp_ulps: float):
        self.fmt, self.attention, self.causal = fmt, model.attention, model.causal
        self.tau = 1.0 if model.tau is None else float(model.tau)
        self.exp_err = exp_ulps * 2.0 ** -23 * (1 + 2.0 ** -40)
        self.slack = lens_slack(model) if model.attention == "hardmax" else 0.0
        # what TransformerLens (float32 only) multiplies the scores by before its softmax:
        # 2^k for hardmax (the slack's 104·2^−k), the query scale (2 or 4) for softmax
        self.lens_scale = 104.0 / self.slack if self.slack else 4.0 * max(1.0, self.tau)


def lens_slack(model: Transformer) -> float:
    """The score margin below which the TransformerLens layout's hardmax (softmax of the
    scores times 2^k, docs/numerics.md#the-transformerlens-export) may give a key a nonzero
    weight in float32: 104·2^−k, k the export's own (:func:`..lens_plan.hardmax_exponent_for`:
    2^k·g = 2^64 rounded down, g over the heads of the layers the layout keeps); inf where a
    weight is not finite (no key is ever ruled out)."""
    k = hardmax_exponent_for(model, 64)
    return math.inf if k is None else 104.0 * 2.0 ** -k


def scores_box(Xm, Xr, w: Weights, ctx: Context, queries=None):
    """Every runtime value of the scores α⟨x_i, x_l⟩ + (c·x_i)(a·x_l) of one head (B×n×n),
    in either layout's order (the torch module's α·gram + P·Q, TransformerLens's q·k of
    d + 1 terms): midpoint and radius. ``queries``: the boxes of m query rows (B×m×D, the
    scores B×m×n) where they are not the keys themselves, without the gram term (α = 0)."""
    fmt = ctx.fmt
    D = Xm.shape[2]
    Xq, Xqr = (Xm, Xr) if queries is None else queries
    if queries is not None and (scalar(w.alpha) != 0 or w.alpha_r != 0):
        raise ValueError("separate query rows need a head without the gram term (α = 0)")
    (Pm, Pr), (Qm, Qr) = (_projection(X, R, v, v_r, fmt) for X, R, v, v_r in
                          ((Xq, Xqr, w.c, w.c_r), (Xm, Xr, w.a, w.a_r)))
    aP, aQ = np.abs(Pm) + Pr, np.abs(Qm) + Qr
    mid = Pm[:, :, None] * Qm[:, None, :]
    spread = np.abs(Pm)[:, :, None] * Qr[:, None, :] + Pr[:, :, None] * aQ[:, None, :]
    size = aP[:, :, None] * aQ[:, None, :]
    alpha, alpha_r = scalar(w.alpha), float(w.alpha_r)
    size_pq, size_a = size, 0.0  # the two parts: TF32 may cut the α terms twice more
    aX = np.abs(Xm) + Xr
    qX = quantum(Xm, Xr, fmt).min(axis=2)
    with np.errstate(over="ignore", invalid="ignore"):
        q = quantum(Pm, Pr, fmt)[:, :, None] * quantum(Qm, Qr, fmt)[:, None, :]
    exact = np.ones(mid.shape, dtype=bool)
    inter = size  # intermediates beside the sum: the stored product (c·x_i)(a·x_l) first
    if alpha != 0 or alpha_r != 0:
        G, wide, SG, inter_g, q_g, exact_g = _gram(Xm, Xr, aX, qX, alpha, alpha_r, fmt)
        mid = mid + alpha * G
        spread = spread + abs(alpha) * wide + alpha_r * SG
        size_a = (abs(alpha) + alpha_r) * SG
        size = size + size_a
        inter = np.maximum(inter, inter_g)
        exact &= exact_g
        q = np.minimum(q, q_g)
    if fmt.matmul_bits is not None:  # TF32 cuts the products' inputs: exact where they fit
        cut, cutq = ((fits(m, fmt.matmul_bits) & (r == 0) &
                      (fits(X, fmt.matmul_bits) & (R == 0)).all(axis=2))
                     for m, r, X, R in ((Pm, Pr, Xq, Xqr), (Qm, Qr, Xm, Xr)))
        exact &= cut[:, :, None] & cutq[:, None, :]
    th, cuts = theta(D + 4, 4, fmt), alpha_cuts(alpha, alpha_r)
    rnd = (th + matmul_input_error(fmt)) * pos_up(size_pq, D + 4) + \
        chained_cut_error(fmt, cuts, th) * pos_up(size_a, D + 4)
    size = pos_up(size, D + 4)
    spread = pos_up(spread, D + 4)
    rnd = pos_up(rnd, 4) + (2 * D + 10) * fmt.tiny * max(1.0, abs(alpha)) + \
        rounding(size, D + 2)
    if alpha != 0 or alpha_r != 0:
        rnd = rnd + _query_underflow(Xm, Xr, aX, alpha, alpha_r, fmt)
    whole = size  # the sum's terms, before 1/τ scales the sum: they must fit, not overflow
    exact &= fits_exactly(whole, q, fmt.bits, fmt.tiny)
    stored_bad = False
    if ctx.attention == "softmax" and ctx.tau != 1:
        mid, spread, size, rnd, stored_bad, exact_tau = _over_tau(mid, spread, size, rnd, q,
                                                                  ctx)
        exact &= exact_tau
    f64 = np.where(spread > 0, rounding(size, D + 2), 0.0)
    rad = spread + pos_up(np.where(exact, f64, rnd), 4)
    bad = may_overflow(inter, 1 + theta(D + 4, 4, fmt), (2 * D + 10) * fmt.tiny, fmt) | \
        stored_bad
    with np.errstate(over="ignore", invalid="ignore"):
        if fmt.name == "float32":  # TransformerLens's scaled scores: inf − inf is nan
            bad |= ~(size * ctx.lens_scale * 2 < ACC.huge)
            if ctx.attention == "softmax":  # and its query s·c·x_i (s ≤ 4), stored whatever
                bad |= ~(aP * 8 < ACC.huge)[:, :, None]  # the key: inf·0 is nan
    return mid, unknown_if_overflow(mid, np.where(bad, np.inf, rad), fmt, whole)


def _gram(Xm, Xr, aX, qX, alpha: float, alpha_r: float, fmt: Format):
    """The parts of α⟨x_i, x_l⟩ (B×n×n) that :func:`scores_box` adds: the float gram G, the
    spread of ⟨x_i, x_l⟩ over the boxes, the gram SG of |x| + r, the intermediates beside the
    sum (the torch module's ⟨x_i, x_l⟩ before α scales it and α·⟨x_i, x_l⟩ stored, the other
    layouts' α·x_i times the query scale, at most 4, of TransformerLens's softmax), the
    terms' finest quantum and whether the part is exact (α a power of two, on normal steps)."""
    XT = np.swapaxes(Xm, 1, 2)
    wide = Xr @ np.abs(XT) + aX @ np.swapaxes(Xr, 1, 2)
    SG = aX @ np.swapaxes(aX, 1, 2)
    a = abs(alpha) + alpha_r
    with np.errstate(over="ignore", invalid="ignore"):
        inter = np.maximum(max(1.0, a) * SG, 4 * a * aX.max(axis=2)[:, :, None])
        q = abs(alpha) * qX[:, :, None] * qX[:, None, :]
        exact = (alpha_r == 0) & (lowbit(alpha) == abs(alpha)) & \
            (abs(alpha) * qX >= fmt.tiny)[:, :, None]
    return Xm @ XT, wide, SG, inter, q, exact


def _projection(Xm, Xr, v, v_r, fmt: Format) -> tuple[np.ndarray, np.ndarray]:
    """Every runtime value of the rows' x·v (B×n, v with radius v_r): midpoint and radius."""
    B, n, D = Xm.shape
    m, s, q, _ = linear(Xm.reshape(-1, D), Xr.reshape(-1, D), v[None], v_r[None], None, None,
                        fmt)
    return m.reshape(B, n), (s + q).reshape(B, n)


def _over_tau(mid, spread, size, rnd, q, ctx: Context):
    """The scores' box divided by τ (softmax): the sum is stored, then divided, which rounds
    once more. Returns the new midpoint, spread, size and rounding, where the stored sum may
    overflow, and whether the division is exact (τ a power of two, q/τ on a normal step)."""
    fmt = ctx.fmt
    with np.errstate(over="ignore", invalid="ignore"):
        stored_bad = ~(np.abs(mid) + spread + rnd < fmt.huge)
    mid, spread, size = mid / ctx.tau, spread / ctx.tau, size / ctx.tau
    rnd = rnd / ctx.tau + theta(1, 1, fmt) * size + fmt.tiny
    with np.errstate(over="ignore", invalid="ignore"):
        exact = (lowbit(ctx.tau) == ctx.tau) & (q / ctx.tau >= fmt.tiny)
    return mid, spread, size, rnd, stored_bad, exact


def _query_underflow(Xm, Xr, aX, alpha: float, alpha_r: float, fmt: Format):
    """The ρ/η and TransformerLens layouts store q_j = α·x_ij before q·k: where that may fall
    below the normal numbers it may lose a smallest normal number, which q·k multiplies by
    the key's x_lj; a bound on that loss per score (B×n×n)."""
    lo_x = np.maximum(np.abs(Xm) - Xr, 0.0)
    under = ((Xm != 0) | (Xr > 0)) & ~(max(abs(alpha) - alpha_r, 0.0) * lo_x >= 2 * fmt.tiny)
    with np.errstate(over="ignore", invalid="ignore"):
        lost = under.astype(float) @ np.swapaxes(aX, 1, 2)
    return pos_up(2 * fmt.tiny * np.where(np.isnan(lost), np.inf, lost), Xm.shape[2] + 2)
