"""Boxes for the runtime proofs: midpoint–radius enclosures of every runtime value, the
exactness test (quanta that fit every partial sum), and linear maps.

Shared by the FF layers and the pass (:mod:`.runtime_proof`) and the attention layers
(:mod:`.runtime_attention`); the error model is docs/numerics.md#proofs-for-reduced-precision-
runtimes. NumPy only.
"""

from __future__ import annotations

import copy

import numpy as np

from ..evaluate.enclosure import lower, rounding, up, upper
from ..evaluate.grid import fits_exactly, lowbit, supports
from .formats import ACC, Format, conversions, fits, matmul_input_error, stored, theta

REFINE_TERMS = 4096  # a unit group's columns × units up to which terms are read one by one


# ------------------------------------------------------------------------------ helpers
def unknown_if_overflow(mid, rad, fmt: Format, size=None):
    """Radius inf wherever a stored value, or (``size``) a float32 partial sum, may overflow."""
    with np.errstate(invalid="ignore", over="ignore"):
        bad = ~(np.abs(mid) + rad < fmt.huge)
        if size is not None:
            bad |= ~(size * 2 < ACC.huge)
    return np.where(bad, np.inf, rad)


def may_overflow(size, grow: float, slack: float, fmt: Format) -> np.ndarray:
    """Where an intermediate of magnitude at most ``size`` (exactly; ``grow`` = 1 + θ of its
    roundings, ``slack`` their absolute part) may be stored beyond the format's range, or
    reach float32's on the way (a partial sum of its terms up to 2·size)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return ~((size * grow + slack < fmt.huge) & (size * 2 < ACC.huge))


def quantum(m, r, fmt: Format) -> np.ndarray:
    """A lower bound on the lowest set bit of every stored value in the boxes m ± r: the
    bit itself where r = 0 (inf for 0), else the spacing of ``fmt`` at the box's smallest
    magnitude, or its smallest subnormal where the box holds 0."""
    if not np.any(r):  # points only (a nan radius counts as nonzero)
        return lowbit(_points(m, r))
    with np.errstate(invalid="ignore", over="ignore"):
        least_mag = lower(np.abs(m), r)
        _, e = np.frexp(least_mag)
        spacing = np.ldexp(1.0, np.maximum(e, fmt.emin + 1) - fmt.bits)
        least = 2.0 ** (fmt.emin + 1 - fmt.bits)
        box = np.where(least_mag > 0, spacing, least)
        return np.where(r == 0, lowbit(m), np.where(np.isfinite(least_mag), box, 0.0))


def _points(m, r) -> np.ndarray:
    """The midpoints m as a new float array of the boxes' shape (every radius r is 0)."""
    return np.array(np.broadcast_to(m, np.broadcast_shapes(np.shape(m), np.shape(r))),
                    dtype=np.float64)


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
    if not np.any(r):  # points only: a new array, as below
        return _points(m, r)
    with np.errstate(invalid="ignore"):
        return np.where(r == 0, m, lower(m, r))


def high(m, r):
    """A float ≥ every value of the boxes m ± r (m itself where r = 0)."""
    if not np.any(r):  # points only: a new array, as below
        return _points(m, r)
    with np.errstate(invalid="ignore"):
        return np.where(r == 0, m, upper(m, r))


def scalar(x) -> float:
    return float(x)


class Weights:
    """A layer's parameters as the runtime stores them: midpoints and radii (0 unless the
    two ways of converting to the format differ, :func:`.formats.conversions`)."""

    def __init__(self, values: dict, fmt: Format):
        self.__dict__.update(_stored([values], fmt)[0])

    @classmethod
    def many(cls, layers: list[dict], fmt: Format) -> list[Weights]:
        """One :class:`Weights` per dict of ``layers``, every array converted in one call (a
        model of thousands of small layers would spend its proof's time converting them)."""
        out = []
        for attrs in _stored(layers, fmt):
            w = cls.__new__(cls)
            w.__dict__.update(attrs)
            out.append(w)
        return out


def ff_units(w: Weights, units) -> Weights:
    """The FF layer ``w`` with only ``units`` (rows of U and b, columns of W)."""
    out = copy.copy(w)
    for name in ("U", "U_r", "b", "b_r"):
        setattr(out, name, getattr(w, name)[units])
    for name in ("W", "W_r"):
        setattr(out, name, getattr(w, name)[:, units])
    return out


def side_by_side(ffs: list[Weights]) -> tuple[Weights, np.ndarray]:
    """The FF layers ``ffs`` (η that of the first) as one layer holding every layer's units
    side by side, in order: what a key stretch or a staged run encloses a row through; and
    each unit's layer among ``ffs``."""
    out = copy.copy(ffs[0])
    for name in ("U", "U_r", "b", "b_r"):
        setattr(out, name, np.concatenate([getattr(ff, name) for ff in ffs]))
    for name in ("W", "W_r"):
        setattr(out, name, np.hstack([getattr(ff, name) for ff in ffs]))
    return out, np.repeat(np.arange(len(ffs)), [len(ff.U) for ff in ffs])


def stored_residual(w: Weights | None, fmt: Format) -> bool:
    """Whether ``w`` is a residual FF layer (η exactly 1) whose W every runtime stores finite
    (no entry that the format, or TF32's cut, takes to inf): what a key stretch, a staged run
    and a window–flip pair are made of."""
    return w is not None and scalar(w.eta) == 1 and w.eta_r == 0 and \
        bool((np.abs(w.W) + w.W_r <= fmt.largest_product_input).all())


def finite(Xm, Xr) -> bool:
    """Whether every box Xm ± Xr is finite: where one may not be, the zero attention the
    layouts run before each FF may spread its nan through the sequence, so the proof's
    shortcuts over several layers stop."""
    return bool(np.isfinite(Xm).all() and np.isfinite(Xr).all())


def _stored(layers: list[dict], fmt: Format) -> list[dict]:
    """Per dict of arrays, each array's stored midpoints and radii (``name`` and
    ``name_r``), every array of every dict converted at once."""
    arrays = [np.asarray(v, dtype=float) for values in layers for v in values.values()]
    m, r = conversions(np.concatenate([a.ravel() for a in arrays]) if arrays
                       else np.zeros(0), fmt)
    cuts = np.cumsum([a.size for a in arrays])[:-1]
    parts = iter(zip(np.split(m, cuts), np.split(r, cuts), arrays, strict=True))
    out = []
    for values in layers:
        attrs = {}
        for name in values:
            pm, pr, a = next(parts)
            attrs[name], attrs[name + "_r"] = pm.reshape(a.shape), pr.reshape(a.shape)
        out.append(attrs)
    return out


# ------------------------------------------------------------------------------ linear maps
def linear(Xm, Xr, Wm, Wr, b, br, fmt: Format):
    """Every runtime value of X Wᵀ + b (X: T×k boxes, W: c×k, b: c or None): midpoint, the
    spread |W|·r of the exact map over the boxes, the rounding (of the runtime's products,
    sums and store, of the float64 midpoint, and the conversion radii Wr, br) and where the
    runtime rounds nowhere (then the rounding is the midpoint's alone: 0 without radius),
    as the quantum every runtime value there is a multiple of (0 elsewhere). A column no
    weight reads adds exact zeros where its values are finite, and is left out."""
    read = Wm.any(axis=0) | Wr.any(axis=0) | ~(np.isfinite(Xm) & np.isfinite(Xr)).all(axis=0)
    if not read.all():
        Xm, Xr, Wm, Wr = Xm[:, read], Xr[:, read], Wm[:, read], Wr[:, read]
    aW = np.abs(Wm)
    aX = np.abs(Xm) + Xr
    bias = np.zeros(len(Wm)) if b is None else b
    k = int((Wm != 0).sum(axis=1).max(initial=0)) + (b is not None)
    prod = Xm @ Wm.T
    mid = prod + bias
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
    part = pos_up(part, k + 2)
    scaled = ((Wm != 0).sum(axis=1) == 1) & (lowbit(Wm).min(axis=1, initial=np.inf) ==
                                              aW.max(axis=1, initial=0.0))
    if scaled.any():  # partial sums: the term (x scaled by a power of two), the bias, the sum
        part = np.where(scaled, np.minimum(part, pos_up(np.abs(mid) + spread +
                                                        rounding(S, k), 4)), part)
    exact, q = _linear_exact(Xm, Xr, Wm, Wr, bias, part, fmt)
    copy, qc = _scaled_copies(Xm, Xr, Wm, Wr, bias, scaled, fmt)
    exact, q = exact | copy, np.where(copy, np.maximum(q, qc), q)
    f64 = np.where(copy, 0.0, f64)  # x·c with c a power of two: float64 computes it exactly too
    if br is not None:
        exact &= br == 0
    lost = False
    if b is not None:  # the runtime stores X Wᵀ in the format before it adds b
        with np.errstate(over="ignore", invalid="ignore"):
            lost = ~(np.abs(prod) + spread + rnd < fmt.huge)
    rnd = np.where(exact, f64, rnd)
    rnd = unknown_if_overflow(mid, rnd + spread, fmt, S) - spread
    rnd = np.where(lost, np.inf, rnd)
    return mid, spread, rnd, np.where(exact, q, 0.0)


def _scaled_copies(Xm, Xr, Wm, Wr, b, scaled, fmt: Format):
    """Where x·Wᵀ + b is one input times a power of two c (``scaled``: the units of one such
    weight) and nothing else (no bias, no cut of a matmul input, every other input finite),
    with no overflow and, for |c| < 1, no result below the normals: every runtime computes it
    exactly, whatever the input's bits (a box straddling a power of two has no common quantum
    that fits, yet c·x is exact for each of its floats). And the quanta of those values, c
    times the input's."""
    single = scaled & (Wr == 0).all(axis=1) & (b == 0)
    if fmt.matmul_bits is not None or not single.any():
        return np.zeros((len(Xm), len(Wm)), dtype=bool), np.zeros((len(Xm), len(Wm)))
    col = np.argmax(Wm != 0, axis=1)
    c = np.abs(Wm[np.arange(len(Wm)), col])
    x, r = Xm[:, col], Xr[:, col]
    with np.errstate(over="ignore", invalid="ignore"):
        ax_hi, ax_lo = np.abs(x) + r, np.maximum(np.abs(x) - r, 0.0)
        ok = (ax_hi * c < fmt.huge / 2) & \
            ((c >= 1) | (ax_lo * c >= fmt.tiny) | ((x == 0) & (r == 0)))
        ok &= (np.isfinite(Xm) & np.isfinite(Xr)).all(axis=1)[:, None]  # 0·inf is nan
        return single & ok, c * quantum(x, r, fmt)


def _linear_exact(Xm, Xr, Wm, Wr, b, part, fmt: Format):
    """Where X Wᵀ + b rounds nowhere in any evaluation: the terms' lowest bits (per unit's
    support, the inputs' least :func:`quantum` times the least lowbit(w); where that is too
    coarse, per term, :func:`_term_quanta`) fit every partial sum in the format, or for
    point inputs in float32 with both stores exact (:func:`_stored_once`); for TF32, every
    input also has at most 11 bits, known only without radius. And those quanta."""
    exact = np.zeros(part.shape, dtype=bool)
    quanta = np.zeros(part.shape)
    nz = Wm != 0
    lbWc = lowbit(Wm)
    lbX, lbW, lbb = quantum(Xm, Xr, fmt), lbWc.min(axis=1, initial=np.inf), lowbit(b)
    okW = (Wr == 0).all(axis=1)
    if fmt.matmul_bits is not None:
        okW &= fits(Wm, fmt.matmul_bits).all(axis=1)
    for units in supports(Wm):
        cols = np.flatnonzero(nz[units[0]])
        qx = lbX[:, cols].min(axis=1, initial=np.inf)
        ok = np.ones(len(Xm), dtype=bool)
        if fmt.matmul_bits is not None:
            ok = fits(Xm[:, cols], fmt.matmul_bits).all(axis=1) & ~(Xr[:, cols] > 0).any(axis=1)
        with np.errstate(over="ignore", invalid="ignore"):
            q = np.minimum(qx[:, None] * lbW[units], lbb[units])
            fit = fits_exactly(part[:, units], q, fmt.bits, fmt.tiny)
            redo = np.flatnonzero(~fit.all(axis=1) & ok)
            if len(redo) and len(cols) * len(units) <= REFINE_TERMS:
                q[redo] = _term_quanta(lbX[redo][:, cols], lbWc[np.ix_(units, cols)], lbb[units])
                fit[redo] = fits_exactly(part[redo][:, units], q[redo], fmt.bits, fmt.tiny)
            late = np.flatnonzero(~fit.all(axis=1) & ok & ~(Xr[:, cols] > 0).any(axis=1))
            if len(late) and fmt.bits < ACC.bits:
                fit[late] |= _stored_once(Xm[late][:, cols], Wm[np.ix_(units, cols)], b[units],
                                          part[late][:, units], q[late], fmt)
        exact[:, units] = ok[:, None] & okW[units] & fit
        quanta[:, units] = q
    return exact, quanta


def _stored_once(X, W, b, part, q, fmt: Format) -> np.ndarray:
    """Where X Wᵀ + b of point inputs X is exact in a 16-bit format although its partial
    sums pass the format's bits: they are multiples of q within float32's (every order adds
    exactly in the float32 accumulator), and the product X Wᵀ and the result are numbers of
    the format, so neither store rounds (a dot product is accumulated in float32 and stored,
    its bias added and stored; docs/numerics.md#proofs-for-reduced-precision-runtimes).
    Exact in float64 too: the same sums within 2^24·q."""
    P = X @ W.T
    Z = P + b
    with np.errstate(over="ignore", invalid="ignore"):
        return fits_exactly(part, q, ACC.bits, fmt.tiny) & (stored(P, fmt) == P) & \
            (stored(Z, fmt) == Z)


def _term_quanta(lbX, lbW, lbb):
    """Per row (lbX: rows × k) and unit (lbW: units × k, lbb: units), the lowest bit of
    every term x_c·w_c and of the bias: each product is a multiple of lowbit(x_c)·lowbit(w_c),
    finer knowledge than the least input bit times the least weight bit."""
    q = np.broadcast_to(lbb, (len(lbX), len(lbb))).copy()
    for c in range(lbX.shape[1]):
        np.minimum(q, lbX[:, c, None] * lbW[None, :, c], out=q)
    return q


def pos_up(x, n: int):
    """:func:`up` of a nonnegative float64 result, leaving exact zeros 0: no product of the
    pass underflows (radii and midpoints below 2^-600 are raised or cleared, :func:`_block`),
    so a computed 0 is a sum of exact zeros."""
    with np.errstate(invalid="ignore"):
        return np.where(x > 0, up(x, n), np.where(x == 0, 0.0, np.inf))  # nan: unknown


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
