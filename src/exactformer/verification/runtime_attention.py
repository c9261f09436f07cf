"""Attention layers in the runtime proofs: every runtime value of a hardmax or softmax layer
in the three layouts' orders (docs/numerics.md#proofs-for-reduced-precision-runtimes): the
weights, the averages, the value map and the output's rounding; the scores are
:mod:`.runtime_scores`. NumPy only.
"""

from __future__ import annotations

import copy

import numpy as np

from ..evaluate.enclosure import lower, rounding, sum_error, up, upper
from ..evaluate.grid import fits_exactly, lowbit
from .formats import (
    ACC,
    Format,
    chained_cut_error,
    conversions,
    fits,
    per_count,
    theta,
)
from .runtime_boxes import (
    Weights,
    guard,
    high,
    low,
    may_overflow,
    pos_up,
    quantum,
    scalar,
    unknown_if_overflow,
)
from .runtime_quanta import key_bits, min_products, term_bits
from .runtime_scores import Context, scores_box


def sa_box(Xm, Xr, sa_w: list, rho: Weights, ctx: Context):
    """Every runtime value of ρ·x_i + Σ_h V_h·y_h, V_h = β_h·I + p_h·q_hᵀ, on a batch of
    sequences of one length (B×n×D boxes); ``sa_w`` holds each head's :class:`Weights`.
    A weight that may be stored as inf, or that TF32's cut may round up to inf, leaves every
    output unknown: inf·0 is nan, even against a coordinate that is 0 everywhere. Boxes that
    come in :func:`~.runtime_boxes.guard`-ed go out so. A layer that :func:`narrowed` takes
    goes through :func:`narrow_box` instead."""
    if not _weights_finite(sa_w, rho, ctx.fmt):
        return Xm.copy(), np.full_like(Xr, np.inf)
    return guard(*_sa_box(Xm, Xr, sa_w, rho, ctx))


def narrowed(Xm, Xr, sa_w: list, rho: Weights, fmt: Format):
    """(cols, each head's weights on cols) where the layer changes only the coordinates
    cols of rows such as Xm ± Xr (any array of rows, ×D), else None. A residual layer (ρ
    exactly 1) whose heads have α = β = 0, every weight stored finite, reads and writes
    only the coordinates of their a, c, p, q and dense V: every other coordinate, where its
    values are finite and far below overflow (so that no average of them overflows either),
    is multiplied by exact zeros in every product and adds nothing (x + 0 is x)."""
    if not _weights_finite(sa_w, rho, fmt):
        return None
    cols = _head_columns(Xm, Xr, sa_w, rho, fmt)
    return None if cols is None else (cols, [_head_on(w, cols) for w in sa_w])


def narrow_box(Xm, Xr, heads: list, rho: Weights, ctx: Context):
    """:func:`sa_box` on the coordinates :func:`narrowed` gives (``Xm``, ``Xr``: B×n×k, the
    rows there), for the sequences some head may change (:func:`idle_sequences`; the others
    come back as they are): (those sequences, their boxes, guarded). A row left unknown
    there is unknown in every coordinate (nan spreads)."""
    busy = np.flatnonzero(~idle_sequences(Xm, Xr, heads, ctx.fmt))
    if not len(busy):
        return busy, Xm[:0], Xr[:0]
    return busy, *guard(*_sa_box(Xm[busy], Xr[busy], heads, rho, ctx))


def idle_sequences(Xm, Xr, heads: list, fmt: Format) -> np.ndarray:
    """Per sequence (B), whether a residual layer of α = β = 0 heads (on the coordinates
    :func:`narrowed` gives) gives each of its rows back exactly, in every runtime: every
    value finite and below a quarter of the format's range, exact zeros (value and radius 0)
    wherever a head's a, q or dense V reads, and no query c·x_i that may overflow. Every key
    then projects to an exact 0, so every score is c·x_i·0 = 0 (in the dense layouts α·x_i
    is 0 too), the weights are finite, the average is exactly 0 where V reads it and finite
    elsewhere, V·y (or V·x_l on every key) is exactly 0, and x + 0 is x: a separation round
    changes only the sequences that hold one of its tests
    (docs/numerics.md#proofs-for-reduced-precision-runtimes)."""
    reads = np.zeros(Xm.shape[-1], dtype=bool)
    for w in heads:
        for name in ("a", "q"):
            reads |= (getattr(w, name) != 0) | (getattr(w, name + "_r") != 0)
        reads |= ((w.V != 0) | (w.V_r != 0)).any(axis=0)
    with np.errstate(invalid="ignore", over="ignore"):
        aX = np.abs(Xm) + Xr
        idle = (aX < fmt.huge / 4).all(axis=(1, 2)) & (aX[..., reads] == 0).all(axis=(1, 2))
        for w in heads:  # (4·size: the query's roundings and TF32's cuts grow it far less)
            size = aX @ (np.abs(w.c) + w.c_r)
            idle &= ~may_overflow(4 * size, 1.0, 0.0, fmt).any(axis=1)
    return idle


def _weights_finite(sa_w: list, rho: Weights, fmt: Format) -> bool:
    """Whether every stored weight of the layer, the entries of each head's dense
    V = β·I + p·qᵀ (TransformerLens, ρ/η) included, stays within what a matrix product's input
    keeps (:attr:`.formats.Format.largest_product_input`)."""
    limit = fmt.largest_product_input
    sizes = [np.abs(rho.v) + rho.v_r]
    for w in sa_w:
        sizes += [np.abs(getattr(w, name)) + getattr(w, name + "_r")
                  for name in ("alpha", "a", "c", "beta", "p", "q")]
        sizes.append(np.abs(w.V) + w.V_r)  # the dense V as the exports store it
    with np.errstate(invalid="ignore"):
        return all(bool((s <= limit).all()) for s in sizes)


def _head_columns(Xm, Xr, sa_w: list, rho: Weights, fmt: Format):
    """The coordinates :func:`narrowed` gives, or None where that is all of them."""
    if scalar(rho.v) != 1 or rho.v_r != 0:
        return None
    used = np.zeros(Xm.shape[-1], dtype=bool)
    for w in sa_w:
        if scalar(w.alpha) != 0 or w.alpha_r != 0 or scalar(w.beta) != 0 or w.beta_r != 0:
            return None
        for name in ("a", "c", "p", "q"):
            used |= (getattr(w, name) != 0) | (getattr(w, name + "_r") != 0)
        V = (w.V != 0) | (w.V_r != 0)  # the exports' dense V may be nonzero where p·q is not
        used |= V.any(axis=0) | V.any(axis=1)
    with np.errstate(invalid="ignore", over="ignore"):
        used |= ~(np.abs(Xm) + Xr < fmt.huge / 4).reshape(-1, len(used)).all(axis=0)
    return None if used.all() else np.flatnonzero(used)


def _head_on(w: Weights, cols: np.ndarray) -> Weights:
    """A head's weights on the coordinates ``cols`` alone."""
    out = copy.copy(w)
    for name in ("a", "c", "p", "q"):
        setattr(out, name, getattr(w, name)[cols])
        setattr(out, name + "_r", getattr(w, name + "_r")[cols])
    out.V, out.V_r = w.V[np.ix_(cols, cols)], w.V_r[np.ix_(cols, cols)]
    return out


def _sa_box(Xm, Xr, sa_w: list, rho: Weights, ctx: Context):
    """:func:`sa_box` of weights stored finite, unguarded.

    The three layouts apply V in three orders — the torch module β·y + p·(q·y), TransformerLens
    the dense V after the average, the ρ/η layout the dense V on every key before it — with
    the same elementary terms ρ·x_c and V_cj·π_l·x_lj. So the exact value (for the runtime's
    weights) is enclosed from the average's box, and the rounding of any of the orders by
    θ times the sum M of those terms' sizes, or less where one key outweighs the others
    (:func:`average_rounding`); it is 0 where their quanta fit M in the format
    (docs/numerics.md#proofs-for-reduced-precision-runtimes)."""
    fmt = ctx.fmt
    r0 = scalar(rho.v)
    aX = np.abs(Xm) + Xr
    mid = r0 * Xm
    spread = abs(r0) * Xr + rho.v_r * aX
    M = (abs(r0) + rho.v_r) * aX
    with np.errstate(over="ignore", invalid="ignore"):
        q = np.where((r0 == 0) & (rho.v_r == 0), np.inf, lowbit(r0) * quantum(Xm, Xr, fmt))
    exact = rho.v_r == 0
    untouched = np.full(Xm.shape[-1], r0 == 1 and rho.v_r == 0)
    D = Xm.shape[2]
    counts = _rounding_counts(sa_w, *Xm.shape[1:])
    k = counts[1]
    overflow = np.zeros(Xm.shape[:2], dtype=bool)
    amp = 1.0  # per output coordinate: how much the intermediates' underflow is scaled up
    rest = np.zeros_like(M)  # M's part from every key but each row's heaviest
    for w in sa_w:
        Ym, Ys, Ybar, Yrest, qy, one, weighted = head_box(Xm, Xr, w, ctx)
        overflow |= _value_overflow(aX, Ybar, w, k, fmt)
        beta, aq, ap = scalar(w.beta), np.abs(w.q) + w.q_r, np.abs(w.p) + w.p_r
        aY = np.abs(Ym) + Ys
        mid = mid + beta * Ym + (Ym @ w.q)[..., None] * w.p
        spread = spread + abs(beta) * Ys + w.beta_r * aY + \
            (Ys @ np.abs(w.q) + aY @ w.q_r)[..., None] * np.abs(w.p) + \
            (aY @ aq)[..., None] * w.p_r
        M = M + (abs(beta) + w.beta_r) * Ybar + (Ybar @ aq)[..., None] * ap
        rest = rest + (abs(beta) + w.beta_r) * Yrest + (Yrest @ aq)[..., None] * ap
        gap = value_gap(w)  # the exports' stored dense V less β·I + p·qᵀ of the stored factors
        if gap.any():
            off = pos_up(Ybar @ gap.T, D + 2)
            spread, M = spread + off, M + off
            rest = rest + pos_up(Yrest @ gap.T, D + 2)
            exact = exact & ~gap.any(axis=1)
        q, exact, amp = _head_exactness(q, exact, amp, (Xm, Xr, Ym, Ys, qy, one, weighted),
                                        w, gap, fmt)
        untouched &= (beta == 0) & (w.beta_r == 0) & (w.p == 0) & (w.p_r == 0) & \
            ~((w.V != 0) | (w.V_r != 0)).any(axis=1)
    M = pos_up(M, 2 * D + 8)
    rad = _output_radius(mid, pos_up(spread, 2 * D + 8), M, pos_up(rest, 2 * D + 8),
                         exact & fits_exactly(M, q, fmt.bits, fmt.tiny), amp, counts,
                         Xm.shape[1], fmt)
    keep = untouched & np.isfinite(mid)
    rad = np.where(overflow[..., None], np.inf, np.where(keep, Xr, rad))
    return np.where(keep, Xm, mid), rad


def _head_exactness(q, exact, amp, boxes, w: Weights, gap, fmt: Format):
    """``q`` and ``exact`` with a head's terms folded in (:func:`_value_quanta`, TF32's cuts
    of its intermediates, subnormal intermediates), and ``amp`` with how much V or p scales
    up an intermediate's underflow (at most one smallest normal number per operation).
    ``boxes``: the layer's keys, the head's average and :func:`head_box`'s quanta, one-key
    rows and weighted keys."""
    Xm, Xr, Ym, Ys, qy, one, weighted = boxes
    q, exact = _value_quanta(q, exact, qy, w, fmt)
    if fmt.matmul_bits is not None:
        exact = exact & ~_cut_intermediates(Xm, Xr, Ym, Ys, weighted, w, fmt)
    sub_y, sub_t = _subnormal_intermediates(Ym, Ys, qy, one, w, fmt)
    aq, ap = np.abs(w.q) + w.q_r, np.abs(w.p) + w.p_r
    aV = (abs(scalar(w.beta)) + w.beta_r) * np.eye(len(w.p)) + np.outer(ap, aq) + gap
    exact = exact & ~(sub_y.astype(float) @ (aV > 0).T > 0) & ~(sub_t[..., None] & (ap > 0))
    amp = amp + sub_y.astype(float) @ aV.T + sub_t[..., None] * ap * (1 + aq.sum())
    return q, exact, amp


def _output_radius(mid, spread, M, rest, exact, amp, counts, n: int, fmt: Format):
    """The radius of the layer's output: the spread plus the float64 midpoint's rounding where
    ``exact``, else the runtime's (:func:`average_rounding`, the underflows ``amp`` scales,
    the midpoint's); unknown where a stored partial sum may overflow: every layout stores
    sums of some of the terms on the way (the torch module's β·y, p·(q·y) and ρ·x + β·y, the
    dense layouts' V·y), each at most M, rounded, and may overflow the format where the
    output does not (2^10·(1 − 32 + 64): 64·2^10 is inf in float16, the output 33 792 is
    not). ``counts``: :func:`_rounding_counts`."""
    k_c, k = counts
    rnd = average_rounding(M, rest, k_c, n, fmt) + 4 * k_c * fmt.tiny * amp + rounding(M, k_c)
    f64 = np.where(spread > 0, rounding(M, k_c), 0.0)
    rad = unknown_if_overflow(mid, spread + pos_up(np.where(exact, f64, rnd), 4), fmt, M)
    with np.errstate(over="ignore", invalid="ignore"):
        return np.where(may_overflow(M, 1 + theta(k, k, fmt), 4 * k * fmt.tiny * amp, fmt),
                        np.inf, rad)


def average_rounding(M, rest, k_c, n: int, fmt: Format) -> np.ndarray:
    """The runtime rounding of the layer's output, its terms of sizes M (``rest`` of them
    from the keys other than each row's heaviest): each term through at most k_c roundings
    and four TF32 cuts (θ·M), or, the smaller, a heaviest key's terms through the k_c − n of
    them off the sum over the keys, and every other key's terms counted twice: a sum's
    rounding of a + b, a a stored number, is at most |b|, so each addition of a partial sum
    of other keys to the heaviest key's costs at most that partial sum, whatever the order
    (docs/numerics.md#proofs-for-reduced-precision-runtimes). A softmax collapse of n keys,
    one of weight within 10⁻¹² of 1, then rounds by a few units of its result, not n."""
    whole = _chained_cuts(k_c, fmt)
    heavy = _chained_cuts(np.maximum(k_c - n, 0) + 2, fmt)
    return np.minimum(whole * M, heavy * (M + 2 * rest) + 2 * (1 + whole) * rest)


def _rounding_counts(sa_w: list, n: int, D: int) -> tuple[np.ndarray, int]:
    """(per output coordinate c, the roundings on any term's path to c in any of the three
    orders; the largest count, D at least, for the intermediates' overflow tests).
    TransformerLens's o matrix sums every head's terms V_cj·y_j in one product, so c's sum
    there has as many terms as row c of the heads' dense V has nonzero entries together (up
    to H·D); a zero term adds nothing and rounds nothing."""
    k_c = n + _dense_terms(sa_w) + 2 * len(sa_w) + 6
    return k_c, max(n + D + 2 * len(sa_w) + 6, int(k_c.max(initial=0)))


def _chained_cuts(k_c: np.ndarray, fmt: Format) -> np.ndarray:
    """Per output coordinate, the relative error of a term through k_c roundings of each
    kind and four TF32 cuts (:func:`~.formats.chained_cut_error`): a term passes through
    at most four (π, x, y and q; π, V, x and V·x), each by less than 2^-10, and (1 + t)^4
    falls 4t² + 4t³ + t⁴ short of 2·(2t + t²)."""
    return per_count(k_c, lambda c: chained_cut_error(fmt, 4, theta(c, c, fmt)))


def _dense_terms(sa_w: list) -> np.ndarray:
    """Per output c, the terms V_cj·y_j that TransformerLens's one o-matrix product sums
    over every head (the nonzero or uncertain entries of row c of the heads' dense V), or
    the torch module's β·y_c and p_c·(q·y), whichever are more."""
    count = 0
    for w in sa_w:
        p_on = (w.p != 0) | (w.p_r != 0)
        q_on = (w.q != 0) | (w.q_r != 0)
        beta_on = scalar(w.beta) != 0 or w.beta_r != 0
        count = count + np.maximum(np.where(p_on, int(q_on.sum()), 0) +
                                   (beta_on & ~(p_on & q_on)).astype(int),
                                   ((w.V != 0) | (w.V_r != 0)).sum(axis=1))
    return np.asarray(count, dtype=np.int64)


def value_gap(w: Weights) -> np.ndarray:
    """Per entry (D×D), a bound on |V_e − V_s|: V_e the dense V as the ρ/η and
    TransformerLens exports store it (formed from the model's own parameters, then converted:
    ``w.V`` ± ``w.V_r``), V_s = β·I + p·qᵀ of the stored factors, which the enclosure (and the
    torch module) uses. 0 exactly where V_e is one stored value equal to V_s (p·q is exact
    in float64, the diagonal's sum checked by TwoSum). Where the factors round, the two
    differ: p = 1 + 2⁻⁸ − 2⁻¹², q = 1.75 store in bfloat16 as 1 and 1.75, but p·q rounds up
    to 1.7578125."""
    Vs = np.outer(w.p, w.q)
    diag = np.diagonal(Vs).copy()
    beta = scalar(w.beta)
    with np.errstate(over="ignore", invalid="ignore"):
        np.fill_diagonal(Vs, diag + beta)
        err = np.zeros_like(Vs)
        np.fill_diagonal(err, sum_error(np.full_like(diag, beta), diag, np.diagonal(Vs)))
        same = (w.V_r == 0) & (w.V == Vs) & (err == 0)
        gap = up(np.abs(w.V - Vs) + w.V_r + err, 4)
    return np.where(same, 0.0, np.where(np.isnan(gap), np.inf, gap))


def _cut_intermediates(Xm, Xr, Ym, Ys, weighted, w: Weights, fmt: Format) -> np.ndarray:
    """Outputs (B×n×D) whose exactness TF32 may break by cutting a value the layer computes
    to 11 bits as the input of a second matrix product: the torch module's average y before
    q·y (where p is nonzero), and q itself, the product's other input, which the dense V's
    11 bits do not bound (β = −2⁻¹², p = e_0, q = (1 + 2⁻¹²)·e_0 make V_00 = 1, and q_0
    cuts to 1); and the ρ/η layout's V·x_l on every key l that may carry weight
    (``weighted``: B×n×n) before the average. Two 11-bit keys averaged with weights 1/2 may
    need 12 bits, as may 3·(1 + 2⁻¹⁰); such a value is exact only where it has at most
    ``fmt.matmul_bits`` bits and no radius. (TransformerLens's o product cuts its y as well,
    but no TF32 proof covers that layout: :data:`.runtime_verdict.COVERED`.)"""
    bits = fmt.matmul_bits
    q_on = (w.q != 0) | (w.q_r > 0)
    p_on = (w.p != 0) | (w.p_r > 0)
    with np.errstate(over="ignore", invalid="ignore"):
        y_bad = ~(fits(Ym, bits) & (Ys == 0))
        y_cut = (y_bad & q_on).any(axis=-1) | bool((q_on & ~fits(w.q, bits)).any())
        VX = Xm @ w.V.T  # per key: where the other conditions hold, exact in float64
        key_cut = ~(fits(VX, bits) & (Xr == 0).all(axis=-1, keepdims=True))
    v_cut = (weighted.astype(float) @ key_cut.astype(float)) > 0
    return (y_cut[..., None] & p_on) | v_cut


def _subnormal_intermediates(Ym, Ys, qy, one, w: Weights, fmt: Format):
    """Where the average's y_j (B×n×D), and in which rows the torch module's q·y (B×n), may
    pass through nonzero numbers below the format's smallest normal one: their terms
    π_l·x_lj, q_j·π_l·x_lj are not multiples of it (a row whose weight is one key's exact 1
    copies y_j = x_lj, which may only be 0 or normal). Those are not among the terms whose
    quanta :func:`_value_quanta` folds in, and p or V may scale an underflow up."""
    beta = scalar(w.beta)
    p_on = bool((w.p != 0).any() or (w.p_r > 0).any())
    used = (beta != 0) | (w.beta_r > 0) | (p_on & ((w.q != 0) | (w.q_r > 0)))
    with np.errstate(over="ignore", invalid="ignore"):
        copied = one[..., None] & (((Ym == 0) & (Ys == 0)) | (low(np.abs(Ym), Ys) >= fmt.tiny))
        sub_y = used & ~(qy >= fmt.tiny) & ~copied
        lbq = np.where((w.q != 0) & p_on, lowbit(w.q), np.inf)
        lbq = np.where(w.q_r > 0, 0.0, lbq)
        t = qy * lbq
        sub_t = (~(np.where(np.isnan(t), np.inf, t) >= fmt.tiny)).any(axis=-1)
    return sub_y, sub_t


def _value_overflow(aX, Ybar, w: Weights, k: int, fmt: Format) -> np.ndarray:
    """Rows (B×n) where an intermediate of one of the three orders of the value map may
    overflow though the terms ρ·x_c and V_cj·π_l·x_lj that θ·M bounds do not: an entry of the
    dense V (TransformerLens, ρ/η), the torch module's q·y (then p·(q·y) is inf, or nan where
    p_c = 0), and the ρ/η layout's V·x_l on every key, weight 0 or not (0·inf is nan in every
    row of the sequence)."""
    beta, aq = scalar(w.beta), np.abs(w.q) + w.q_r
    aV = np.abs(w.V) + w.V_r + (abs(beta) + w.beta_r) * np.eye(len(w.p)) * 2.0 ** -50 + \
        np.outer(np.abs(w.p) + w.p_r, aq) * 2.0 ** -50
    grow, slack = 1 + theta(k, k, fmt), 4 * k * fmt.tiny
    with np.errstate(over="ignore", invalid="ignore"):
        rows = may_overflow(Ybar @ aq, grow, slack, fmt)  # the torch module's q·y
        keys = may_overflow(aX @ aV.T, grow, slack, fmt).any(axis=(1, 2))  # ρ/η: V·x_l
    return rows | keys[:, None] | bool(may_overflow(aV, grow, slack, fmt).any())


def _value_quanta(q, exact, qy, w: Weights, fmt: Format):
    """The quanta of a head's terms V_cj·π_l·x_lj (``qy``: per row and j, those of π_l·x_lj)
    folded into ``q``, and ``exact`` cleared where a stored V entry or factor is uncertain or
    not a stored value itself (TransformerLens and ρ/η store V = β·I + p·qᵀ densely)."""
    beta = scalar(w.beta)
    V = beta * np.eye(len(w.p)) + np.outer(w.p, w.q)
    exact = exact & (w.beta_r == 0) & (w.p_r == 0).all() & (w.q_r == 0).all()
    exact = exact & bool((conversions(V, fmt)[0] == V).all())
    lbV = np.minimum(np.where(beta != 0, lowbit(beta), np.inf) * np.where(np.eye(len(w.p)) > 0,
                                                                          1.0, np.inf),
                     np.outer(lowbit(w.p), lowbit(w.q)))  # per (c, j); inf where 0
    if fmt.matmul_bits is not None:
        exact = exact & bool(fits(V, fmt.matmul_bits).all())
    q = np.array(np.broadcast_to(q, qy.shape))
    finite = np.isfinite(lbV)  # an infinite lbV[c, j] (V_cj = 0) bounds nothing
    with np.errstate(over="ignore", invalid="ignore"):
        for j in np.flatnonzero(finite.any(axis=0)):  # q_c = min_j lbV[c, j]·qy[j]
            cs = np.flatnonzero(finite[:, j])
            term = qy[..., j, None] * lbV[cs, j]
            q[..., cs] = np.minimum(q[..., cs], np.where(np.isnan(term), np.inf, term))
    return q, exact


def _allowed(n: int, causal: bool) -> np.ndarray:
    return np.tril(np.ones((n, n), dtype=bool)) if causal else np.ones((n, n), dtype=bool)


def head_box(Xm, Xr, w: Weights, ctx: Context):
    """One head's average y_i = Σ_l π_il x_l under every runtime's weights, as the box of its
    exact value (midpoint and radius, B×n×D), a bound on Σ_l |π_il|·|x_l| (its terms'
    sizes) and one on the same sum without the row's heaviest key (:func:`mix`), the quanta
    of the terms π_il·x_l (0 where unknown), the rows whose weights are one key's exact 1,
    and the keys that may carry weight (B×n×n); the rounding of the average is left to
    :func:`sa_box`. Where every query of the batch scores alike (:func:`shared_query`), the
    first row's are found once and stand for every row's."""
    n = Xm.shape[1]
    queries = shared_query(Xm, Xr, w, ctx)
    sm, sr = scores_box(Xm, Xr, w, ctx, queries)
    allowed = _allowed(n, ctx.causal)[:sm.shape[1]]
    if ctx.attention == "softmax":
        Pm, Pr = softmax_box(sm, sr, allowed, ctx)
        Ym, Yr, Ybar, Yrest, qy = mix(Pm, Pr, Xm, Xr, ctx.fmt)
        one = ((Pr == 0) & ((Pm == 0) | (Pm == 1))).all(axis=2)
        weighted = np.broadcast_to(allowed, sm.shape)
    else:
        Ym, Yr, Ybar, Yrest, qy, one, weighted = hardmax_box(sm, sr, allowed, Xm, Xr, ctx)
    # a score that may overflow may be inf or nan in the runtime (inf·0, inf − inf): the max
    # of a row holding a nan is nan, and so are its weights, whatever the other keys
    lost = (allowed & ~(np.isfinite(sr) & np.isfinite(sm))).any(axis=2)
    out = (np.where(lost[..., None], 0.0, Ym), np.where(lost[..., None], np.inf, Yr),
           np.where(lost[..., None], np.inf, Ybar), np.where(lost[..., None], np.inf, Yrest),
           np.where(lost[..., None], 0.0, qy), one & ~lost, weighted)
    return tuple(np.broadcast_to(a, (len(a), n, *a.shape[2:])) for a in out)


def shared_query(Xm, Xr, w: Weights, ctx: Context):
    """The first row of every sequence (B×1×D boxes) where it stands for every query: no
    gram term (α = 0), no causal mask, and every row equal, bits and radii, on the
    coordinates c reads, every value finite (a column c does not read adds exact zeros) and
    no TF32 cut (which reads the whole row): then every query's projection c·x_i, score row,
    weights and average have the same box, as in a separation round, whose scores
    one_i·height_l do not depend on the query. None otherwise."""
    n = Xm.shape[1]
    if n < 2 or ctx.causal or scalar(w.alpha) != 0 or w.alpha_r != 0 or \
            ctx.fmt.matmul_bits is not None:
        return None
    cols = np.flatnonzero((w.c != 0) | (w.c_r != 0))
    same = bool((Xm[:, :, cols] == Xm[:, :1, cols]).all() and
                (Xr[:, :, cols] == Xr[:, :1, cols]).all())
    if not (same and np.isfinite(Xm).all() and np.isfinite(Xr).all()):
        return None
    return Xm[:, :1], Xr[:, :1]


def hardmax_box(sm, sr, allowed, Xm, Xr, ctx: Context):
    """A row whose candidates (keys whose score may reach the best certain one, less the
    TransformerLens slack) are one key, or an exact tie every evaluation sees as one, takes
    weights 1/|C| rounded; any other row averages some of its candidates with weights that sum
    to 1 up to rounding, which lies in the hull of their boxes, widened by that rounding.
    Returns :func:`mix`'s boxes, the rows of one candidate and the candidates (B×n×n)."""
    fmt = ctx.fmt
    with np.errstate(invalid="ignore"):
        lo = np.where(allowed, low(sm, sr), -np.inf)
        hi = np.where(allowed, high(sm, sr), -np.inf)
        best = lo.max(axis=2, keepdims=True)
        cand = allowed & ~(hi < best - ctx.slack)
    count = cand.sum(axis=2)
    if (count == 1).all() and np.isfinite(Xm).all() and np.isfinite(Xr).all():
        return (*copied_keys(np.argmax(cand, axis=2), Xm, Xr, fmt), count == 1, cand)
    top = np.where(cand, sm, -np.inf).max(axis=2, keepdims=True)
    tie = (count == 1) | (~cand | ((sr == 0) & (sm == top))).all(axis=2)
    inv = 1.0 / np.maximum(count, 1)
    exact_w = lowbit(inv) == inv  # 1/|C| a power of two: stored exactly
    Pm = np.where(cand, inv[:, :, None], 0.0)
    Pr = np.where(cand, np.where(exact_w, 0.0, (fmt.u + ACC.u + 2.0 ** -52) * inv)[:, :, None],
                  0.0)  # fl(1/|C|), perhaps rounded twice (float32, then the format)
    Ym, Yr, Ybar, Yrest, qy = mix(Pm, Pr, Xm, Xr, fmt)
    for b, i in zip(*np.nonzero(~tie), strict=True):
        Ym[b, i], Yr[b, i], Ybar[b, i] = _hull(Xm[b, cand[b, i]], Xr[b, cand[b, i]], ctx)
        Yrest[b, i], qy[b, i] = Ybar[b, i], 0.0
    return Ym, Yr, Ybar, Yrest, qy, count == 1, cand


def copied_keys(key, Xm, Xr, fmt: Format):
    """:func:`mix` where every row's weights are one key's exact 1 (``key``: B×n) and every
    key is finite (0·x is then an exact 0): the key's box, copied (its float64 midpoint is
    the key's own, no sum rounds), with :func:`mix`'s bounds (0 without the key) and its
    quanta."""
    n = Xm.shape[1]
    at = key[..., None]
    Ym = np.take_along_axis(Xm, at, axis=1)
    Xr_l = np.take_along_axis(Xr, at, axis=1)
    S = pos_up(np.take_along_axis(np.abs(Xm) + Xr, at, axis=1), n + 2)
    return Ym, pos_up(Xr_l, n + 2), S, np.zeros_like(S), \
        np.take_along_axis(key_bits(Xm, Xr, fmt), at, axis=1)


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
    subtraction and exp rounded (exp within ``exp_ulps`` float32 ulps), summed and divided,
    or multiplied by the sum's reciprocal (torch's CPU kernel: two roundings, (1 + u)²);
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
        z_lo, z_hi, err = _normaliser(e_lo, e_hi, fmt)
        p_lo = np.maximum(lower(e_lo / z_hi * (1 - 2 * u), 0.0) - fmt.tiny, 0.0)
        p_hi = np.minimum(upper(e_hi / np.maximum(z_lo, 0.0) * (1 + u) ** 2, 0.0) + fmt.tiny,
                          1.0)
        c_lo, c_hi = _ratio_bounds(e_lo, e_hi, err, u, fmt)
        p_lo, p_hi = np.maximum(p_lo, c_lo), np.minimum(p_hi, c_hi)
        p_lo, p_hi = np.where(allowed, p_lo, 0.0), np.where(allowed, p_hi, 0.0)
        mid = (p_lo + p_hi) * 0.5
        rad = upper(np.maximum(p_hi - mid, mid - p_lo), 0.0)
    bad = ~np.isfinite(rad).all(axis=2, keepdims=True) | ~(z_lo > 0)
    return np.where(bad, 0.5, mid), np.where(bad, np.inf, rad)


def _but_heaviest(a: np.ndarray) -> np.ndarray:
    """A copy of ``a`` (B×m×n, ≥ 0) with each row's largest entry (its first, in a tie) set
    to 0: the keys other than the heaviest, whose terms :func:`average_rounding` counts
    twice."""
    out = a.copy()
    np.put_along_axis(out, np.argmax(a, axis=2)[..., None], 0.0, axis=2)
    return out


def _normaliser(e_lo, e_hi, fmt: Format):
    """Bounds on every runtime value z of the softmax's sum Σ_l e_l (B×n×1) for terms in
    [e_lo, e_hi]: θ of n + 1 roundings of the whole sum, or, the tighter, θ of two plus twice
    the terms other than the largest (:func:`average_rounding`'s argument: adding a partial
    sum of other terms to the largest's rounds by at most that partial sum); and a bound on
    |z − Σ_l e_l|, the rounding alone, for the terms' own values in their boxes."""
    n = e_lo.shape[-1]
    t, t2 = theta(n + 1, 1, fmt), theta(2, 1, fmt)
    other = 2 * (1 + t) * _but_heaviest(e_hi).sum(axis=2, keepdims=True) * (1 + 2.0 ** -40)
    lo, hi = e_lo.sum(axis=2, keepdims=True), e_hi.sum(axis=2, keepdims=True)
    z_lo = np.maximum(lo * (1 - t - 2.0 ** -50), lo * (1 - t2 - 2.0 ** -40) - other)
    z_hi = np.minimum(hi * (1 + t + 2.0 ** -50), hi * (1 + t2 + 2.0 ** -40) + other)
    err = np.minimum(hi * (t + 2.0 ** -50), hi * (t2 + 2.0 ** -40) + other) * (1 + 2.0 ** -40)
    return z_lo - n * fmt.tiny, z_hi + n * fmt.tiny, err + n * fmt.tiny


def _ratio_bounds(e_lo, e_hi, err, u: float, fmt: Format):
    """Bounds on every runtime weight fl(e_l / z) from the sum's own terms: z is within
    ``err`` of e_l + R_l, R_l the other terms' sum, so e_l/z lies between
    e/(e + R_hi + err) and e/(e + R_lo − err) over e in [e_lo, e_hi] (increasing in e where
    the added constant is ≥ 0, decreasing where it is < 0), and the division rounds by u,
    or the product with the reciprocal twice.
    The error of the heaviest key's exp, in both e_l and z, cancels here: its weight is 1 to
    a few u (docs/numerics.md#proofs-for-reduced-precision-runtimes)."""
    s_lo = e_lo.sum(axis=2, keepdims=True) * (1 - 2.0 ** -40)
    s_hi = e_hi.sum(axis=2, keepdims=True) * (1 + 2.0 ** -40)
    r_hi = np.nextafter(s_hi - e_hi, np.inf)
    r_lo = np.maximum(np.nextafter(s_lo - e_lo, -np.inf), 0.0)
    down, rise = (1 - 2 * u) * (1 - 2.0 ** -49), (1 + u) ** 2 * (1 + 2.0 ** -49)
    p_lo = e_lo / ((e_lo + r_hi + err) * (1 + 2.0 ** -50)) * down - fmt.tiny
    c = np.nextafter(r_lo - err, -np.inf)  # e/(e + c): the largest over the box
    e = np.where(c >= 0, e_hi, e_lo)
    den = (e + c) * (1 - 2.0 ** -50)
    p_hi = np.where(den > 0, e / np.where(den > 0, den, 1.0) * rise + fmt.tiny, 1.0)
    return np.maximum(p_lo, 0.0), np.minimum(p_hi, 1.0)


def mix(Pm, Pr, Xm, Xr, fmt: Format):
    """Σ_l π_il x_l for weight boxes Pm ± Pr (B×n×n) and value boxes (B×n×D): the box of its
    exact value, the bound on Σ_l |π_il|·|x_l|, the same without the row's heaviest key (the
    largest |π| + r, :func:`average_rounding`), and the terms' quanta (:func:`head_box`)."""
    n = Pm.shape[-1]
    aX = np.abs(Xm) + Xr
    aP = np.abs(Pm) + Pr
    mid = Pm @ Xm
    spread = pos_up(Pr @ aX + np.abs(Pm) @ Xr, n + 2)
    S = pos_up(aP @ aX, n + 2)
    rest = _but_heaviest(aP)
    f64 = np.where(S > 0, rounding(S, n), 0.0)  # the float64 midpoint's own rounding
    return mid, spread + np.where(_mix_points(Pm, Pr, Xm, Xr), 0.0, f64), S, \
        pos_up(rest @ aX, n + 2), _mix_quanta(Pm, Pr, Xm, Xr, fmt)


def _mix_points(Pm, Pr, Xm, Xr) -> np.ndarray:
    """Rows whose float64 midpoint carries no rounding of its own: weights and keys all
    points (the midpoint is then checked exact by :func:`sa_box`'s quanta), or weights one
    key's exact 1 over finite keys (the sum is that key's x plus exact zeros)."""
    points = (Pr == 0).all(axis=2)
    one_hot = points & ((Pm == 0) | (Pm == 1)).all(axis=2) & ((Pm == 1).sum(axis=2) == 1) & \
        np.isfinite(Xm).all(axis=(1, 2))[:, None]
    return (points[..., None] & (Xr == 0).all(axis=(1, 2))[:, None, None]) | one_hot[..., None]


def _mix_quanta(Pm, Pr, Xm, Xr, fmt: Format) -> np.ndarray:
    """Per row and coordinate, a lower bound on the lowest bit of every term π_il·x_lj over
    the keys whose weight may be nonzero (:func:`quantum`; 0 where a weight is uncertain or,
    in TF32, may be cut)."""
    return min_products(*term_bits(Pm, Pr, Xm, Xr, fmt))
