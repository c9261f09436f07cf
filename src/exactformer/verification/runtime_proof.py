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
which is what lets keyed models be proved. This module holds the FF layers and the pass; the
boxes and linear maps are :mod:`.runtime_boxes`, the attention :mod:`.runtime_attention` and
:mod:`.runtime_scores`. NumPy only.
"""

from __future__ import annotations

import copy

import numpy as np

from ..evaluate.enclosure import lower, rounding, sum_error, up, upper
from ..evaluate.grid import fits_exactly, lowbit
from ..evaluate.jacobians import jacobian_bound, pieces
from ..evaluate.twins import TWIN_ROWS, distinct
from ..model import Transformer
from ..numbers import pad_columns
from .formats import (
    DEFAULT_EXP_ULPS,
    Format,
    conversions,
    fits,
    matmul_input_error,
    theta,
    thetas,
)
from .runtime_attention import narrow_box, narrowed, sa_box
from .runtime_boxes import (
    Weights,
    ff_units,
    finite,
    guard,
    high,
    linear,
    low,
    pos_up,
    quantum,
    scalar,
    sign_parts,
    unknown_if_overflow,
)
from .runtime_keys import apply_stretch, coarse_bound, key_layer, key_rows, stretches
from .runtime_scores import Context
from .runtime_staged import apply_staged, staged_runs
from .runtime_windows import pair_layer, runtime_pairs

CHUNK_CELLS = 1 << 20  # rows × units of a residual FF's coarse test at once (in cache)
BLOCK_ROWS = 64  # rows a block of a residual FF takes at least (:func:`unit_blocks`)
BLOCKS = 64  # blocks a residual FF's rows are cut into at most


# ------------------------------------------------------------------------------ FF layers
def ff_box(Xm, Xr, w: Weights, fmt: Format):
    """Every runtime value of η·x + W·relu(U·x + b) on the boxes X ± Xr (T×D): the
    certainly active units' affine piece moves by at most |J|·r (:func:`jacobian_spread`),
    every undecided unit by its output's spread, and the output sum rounds once more
    (nowhere, where the terms' quanta fit every partial sum). In a residual layer, rows at
    which every unit is off even under a coarse bound pass as they are (x + 0 is x), and only
    the others are enclosed, in blocks of rows with only the units that may be on at one of
    them (a unit certainly off adds an exact 0): a keyed layer moves a few rows, each by a few
    units. Boxes that come in :func:`guard`-ed go out so."""
    with np.errstate(invalid="ignore"):
        kept = (np.abs(w.W) + w.W_r <= fmt.largest_product_input).all()
    if not kept:
        # a weight the format stores as ±inf, or that TF32's cut may round up to inf: inf·0
        # is nan, so even an off unit (relu 0) writes nan into its columns, in every row; no
        # row is x + 0 nor any sum's terms known
        return Xm.copy(), np.full_like(Xr, np.inf)
    if scalar(w.eta) == 1 and w.eta_r == 0 and len(Xm) >= TWIN_ROWS:
        return _ff_twins(Xm, Xr, w, fmt)
    return _ff_residual(Xm, Xr, w, fmt)


def _ff_twins(Xm, Xr, w: Weights, fmt: Format):
    """:func:`ff_box` of a residual layer on many rows, once per group of rows equal on the
    columns it reads or writes (radii included; every column that is not finite somewhere
    counts as read): each output there is a function of those columns alone (a column no
    unit reads adds exact zeros, one no unit writes is x + 0), so a group's first row gives
    them all; the rows keep their own other columns. After the first attention a keyed
    model's rows differ by their signatures, which a tagging or separation layer does not
    read (docs/numerics.md#proofs-for-reduced-precision-runtimes, Cost). Where the first
    row's other columns changed (a unit's output may be infinite: every column unknown),
    the group's rows are taken one by one."""
    used = (w.U != 0).any(axis=0) | (w.U_r != 0).any(axis=0) | (w.W != 0).any(axis=1) | \
        (w.W_r != 0).any(axis=1) | ~(np.isfinite(Xm) & np.isfinite(Xr)).all(axis=0)
    first, inv = distinct(np.concatenate([Xm[:, used], Xr[:, used]], axis=1))
    if used.all() or 2 * len(first) > len(Xm):
        return _ff_residual(Xm, Xr, w, fmt)
    Fm, Fr = _ff_residual(Xm[first], Xr[first], w, fmt)
    Ym, Yr = Xm.copy(), Xr.copy()
    Ym[:, used], Yr[:, used] = Fm[inv][:, used], Fr[inv][:, used]
    off = ~used
    moved = ((Fm[:, off] != Xm[first][:, off]) | (Fr[:, off] != Xr[first][:, off])).any(axis=1)
    redo = np.flatnonzero(moved[inv])
    if len(redo):
        Ym[redo], Yr[redo] = _ff_residual(Xm[redo], Xr[redo], w, fmt)
    return Ym, Yr


def _ff_residual(Xm, Xr, w: Weights, fmt: Format):
    """:func:`ff_box` on finite weights; a residual layer passes the rows where every unit
    is certainly off as they are, and encloses the others in blocks of rows (also where
    every row may turn on a unit but few: a stretch's units side by side,
    :mod:`.runtime_keys`). The boxes it computes are :func:`guard`-ed (the rows it passes
    were on the way in)."""
    if scalar(w.eta) == 1 and w.eta_r == 0 and len(Xm) > 1:
        maybe = maybe_on(Xm, Xr, w, fmt)
        rows = np.flatnonzero(maybe.any(axis=1))
        if len(rows) < len(Xm) or 4 * np.count_nonzero(maybe) < maybe.size:
            Ym, Yr = Xm.copy(), Xr.copy()
            for block, units in unit_blocks(maybe[rows]):
                at = rows[block]
                Ym[at], Yr[at] = guard(*ff_rows(Xm[at], Xr[at], ff_units(w, units), fmt))
            return Ym, Yr
    return guard(*ff_rows(Xm, Xr, w, fmt))


def maybe_on(Xm, Xr, w: Weights, fmt: Format) -> np.ndarray:
    """Per row and unit (T × units): may the unit be on at some runtime value of the row's
    box, or may its float32 partial sums overflow (inf − inf is nan, and relu(nan) reaches
    every output through W)? False only where Z ≤ −R, compared exactly, for the float64
    Z = U·x + b and R a bound on the spread |U|·r, the weights' conversion radii, the
    runtime's rounding (θ of the sizes S) and Z's own (:func:`.rounding`), inflated by
    :func:`.up`'s factor; in chunks of rows. In a key layer (:mod:`..evaluate.keys`) a row
    whose key part is an exact scaled key is decided by the key lemma instead, one lookup
    a row (:func:`.runtime_keys.key_rows`)."""
    key = key_layer(w)
    if key is None:
        return _maybe_on(Xm, Xr, w, fmt)
    lone, unit = key_rows(Xm, Xr, w, fmt, key)
    out = np.zeros((len(Xm), len(w.U)), dtype=bool)
    hit = np.flatnonzero(lone & (unit >= 0))
    out[hit, unit[hit]] = True
    rest = np.flatnonzero(~lone)
    out[rest] = _maybe_on(Xm[rest], Xr[rest], w, fmt)
    return out


def _maybe_on(Xm, Xr, w: Weights, fmt: Format) -> np.ndarray:
    """:func:`maybe_on` by one product of every row with every unit."""
    out = np.empty((len(Xm), len(w.U)), dtype=bool)
    step = max(1, CHUNK_CELLS // max(1, len(w.U)))
    with np.errstate(invalid="ignore"):
        for a in range(0, len(Xm), step):
            Z, R = coarse_bound(Xm[a:a + step], Xr[a:a + step], w, fmt)
            out[a:a + step] = ~(Z <= -R) | ~(R < np.inf)  # (Z = −inf at R = inf: unknown)
    _zero_reads(out, Xm, Xr, w, fmt)
    return out


def _zero_reads(out, Xm, Xr, w: Weights, fmt: Format) -> None:
    """``out`` (rows × units, :func:`maybe_on`) decided by the bias alone where a unit reads
    only exact zeros (value and radius 0) and stores every weight finite: each product is an
    exact 0 and so is their sum, in any order and format, so the unit is b (within its
    conversion radius) in every runtime, where the coarse bound's absolute terms would leave
    it undecided at b = 0 (a snap's pair reading its snap, 0 at every row it does not move)."""
    reads = (w.U != 0) | (w.U_r != 0)
    with np.errstate(invalid="ignore"):
        stored = bool((np.abs(w.U) + w.U_r <= fmt.largest_product_input).all())
    if not stored:
        return
    live = ((Xm != 0) | (Xr != 0)).astype(float) @ reads.T.astype(float)
    out[:] = np.where(live == 0, ~(w.b + w.b_r <= 0), out)  # (a nan bias may be on)


def unit_blocks(maybe: np.ndarray):
    """(rows, units) blocks covering every row of ``maybe`` (rows × units: may the unit be
    on there?), each block with the units that may be on at one of its rows: rows ordered by
    their first such unit and cut into at most :data:`BLOCKS` blocks of at least
    :data:`BLOCK_ROWS` rows."""
    order = np.argsort(maybe.argmax(axis=1), kind="stable")
    size = max(BLOCK_ROWS, -(-len(order) // BLOCKS))
    for a in range(0, len(order), size):
        block = order[a:a + size]
        yield block, np.flatnonzero(maybe[block].any(axis=0))


def ff_outputs(w: Weights, cols) -> Weights:
    """The FF layer ``w`` writing only the output columns ``cols`` (rows of W)."""
    out = copy.copy(w)
    out.W, out.W_r = w.W[cols], w.W_r[cols]
    return out


def _guarded_rows(Xm, Xr, w: Weights, fmt: Format, off=None):
    return guard(*ff_rows(Xm, Xr, w, fmt, off=off))


def ff_rows(Xm, Xr, w: Weights, fmt: Format, off=None):
    """:func:`ff_box` on every row. In a residual layer (η exactly 1) a column that no unit
    writes, finite in every row, is x + 0: it is x, and only the others are computed.
    ``off`` (rows × units): per row, units that are no part of its layer, held off
    (:mod:`.runtime_staged`)."""
    if scalar(w.eta) == 1 and w.eta_r == 0:
        cols = np.flatnonzero(w.W.any(axis=1) | w.W_r.any(axis=1) |
                              ~np.isfinite(Xm).all(axis=0))
        if len(cols) < Xm.shape[1]:
            Ym, Yr = Xm.copy(), Xr.copy()
            Ym[:, cols], Yr[:, cols], wild = _ff_columns(Xm, Xr, w, fmt, cols, off)
            Yr[wild] = np.inf  # 0·inf and 0·nan are nan: no column is x + 0 there
            return Ym, Yr
    return _ff_columns(Xm, Xr, w, fmt, np.arange(Xm.shape[1]), off)[:2]


def _ff_columns(Xm, Xr, w: Weights, fmt: Format, cols: np.ndarray, off=None):
    """:func:`ff_box`'s output columns ``cols`` on every row, and the rows where a unit's
    stored output may be inf or nan (its box is not finite): the runtime's product with
    the units then is nan in every column, a weight 0 included (0·inf), so those rows
    are unknown everywhere. A unit held ``off`` at a row is certainly off there with no
    spread: it adds an exact 0 and is no term of the row's sums, as in the row's own layer,
    which does not hold it."""
    eta = scalar(w.eta)
    Zm, Zs, Zq, Zexact = linear(Xm, Xr, w.U, w.U_r, w.b, w.b_r, fmt)
    if off is not None:
        Zm, Zs, Zq = np.where(off, -1.0, Zm), np.where(off, 0.0, Zs), np.where(off, 0.0, Zq)
    w = ff_outputs(w, cols)
    W, R = w.W, Xr  # R: every input column's radius, which the Jacobian reads
    Xm, Xr = Xm[:, cols], Xr[:, cols]
    Zr = Zs + Zq
    with np.errstate(invalid="ignore"):
        lo, hi = low(Zm, Zr), high(Zm, Zr)
        active, unsure = lo > 0, ~(lo > 0) & ~(hi <= 0)
        top = np.where(unsure, upper(np.maximum(hi, 0.0) * 0.5, 0.0), 0.0)
    Am = np.where(active, Zm, top)  # the stored ReLU outputs' boxes: Am ± Ar
    Ar = np.where(active, Zr, top)
    aW = np.abs(W)
    AW, AWr = Am @ W.T, Ar @ aW.T  # the units' part of the output, as a box
    mid = eta * Xm + AW
    jac = jacobian_spread(R, active, W, w.U, eta, cols)
    chain = pos_up((Zq * active + top) @ aW.T, W.shape[1] + 2)
    # terms per row: η·x and the units that may be on there (an off unit adds an exact 0)
    writes = ((W != 0) | (w.W_r != 0)).T.astype(float)
    k = ((active | unsure).astype(float) @ writes).max(axis=1, initial=0.0)[:, None] + 1
    S = pos_up(abs(eta) * (np.abs(Xm) + Xr) + (np.abs(Am) + Ar) @ (aW + w.W_r).T, k + 2)
    rnd = (thetas(k + 2, 3, fmt) + matmul_input_error(fmt)) * S + (2 * k + 6) * fmt.tiny
    rnd = up(rnd + rounding(S, k) + (np.abs(Am) + Ar) @ w.W_r.T, 6)
    exact, q = _ff_exact(Xm, Xr, Am, Ar, Zexact, active | unsure, w, k, fmt)
    writers = _writers(active | unsure, W)
    err64 = _midpoint_error(Xm, AW, mid, Am, active | unsure, writers, w, S, k)
    moving = ((active | unsure) & (Ar > 0)).astype(float) @ (W != 0).T.astype(float) > 0
    rnd = _two_terms(rnd, Xm, Xr, (AW, AWr + moving * 2.0 ** -1074), writers,
                     np.abs(mid) + jac + chain + err64, w, fmt)
    inexact_in = ((Xr > 0) & (eta != 0)) | moving
    f64 = np.where(inexact_in, err64, 0.0)  # the float64 midpoint's own rounding
    rad = unknown_if_overflow(mid, jac + chain + np.where(exact, f64, rnd), fmt, S)
    with np.errstate(over="ignore", invalid="ignore"):  # the stored η·x and A·Wᵀ themselves
        lost = ~(np.abs(AW) + AWr + (np.abs(Am) + Ar) @ w.W_r.T + rnd < fmt.huge)
        if eta != 1:
            lost |= ~(abs(eta) * (np.abs(Xm) + Xr) + rnd < fmt.huge)
    rad = np.where(lost, np.inf, rad)
    # a value every evaluation computes alike: no rounding, a constant affine piece (J = 0),
    # and the midpoint nearer to it than half its quantum — it is the multiple of q nearest
    loose = (unsure | (active & (Zexact == 0))).astype(float) @ (W != 0).T.astype(float)
    snap = exact & (jac == 0) & (loose == 0)  # only units exactly computed write it
    snap &= rad < np.inf  # and it may not overflow (exact is about the bits, not the range)
    snap &= q < np.inf  # a cell of no terms (x_c = 0, no unit): rint(0/inf)·inf would be nan
    with np.errstate(invalid="ignore", over="ignore"):
        snap &= up(chain + f64, 4) < q * 0.5
        mid = np.where(snap, np.rint(mid / np.where(snap, q, 1.0)) * np.where(snap, q, 1.0), mid)
    rad = np.where(snap, 0.0, rad)
    if eta == 1 and w.eta_r == 0:  # a coordinate no unit that may be on writes: x + 0
        keep = (writers[0] == 0) & np.isfinite(Xm)
        mid, rad = np.where(keep, Xm, mid), np.where(keep, Xr, rad)
    wild = ~(np.isfinite(Am) & np.isfinite(Ar)).all(axis=1)
    return mid, np.where(wild[:, None], np.inf, rad), wild


def _writers(on, W) -> tuple[np.ndarray, np.ndarray]:
    """Per output cell, how many units that may be on (``on``) write it, and whether every
    one of them writes through a power of two (so that its product is exact where it stays
    among the normal numbers)."""
    power = (W == 0) | (lowbit(W) == np.abs(W))
    on = on.astype(float)
    return on @ (W != 0).T.astype(float), on @ (~power).T.astype(float) == 0


def _midpoint_error(Xm, AW, mid, Am, on, writers, w: Weights, S, k):
    """Per output cell, a bound on the float64 midpoint's own rounding, |η·x + Σ W·a − mid|:
    :func:`.rounding` of the terms' sizes, or the error itself where the sum holds at most
    one unit's term beside η·x and both are exact products (η and that unit's W entries
    powers of two, no bit lost below the subnormals), so that its one float64 addition's
    error is TwoSum's. A flip x − relu(x) on an inexact slot thus keeps its exact 0
    (docs/numerics.md#proofs-for-reduced-precision-runtimes). ``writers``: :func:`_writers`."""
    tiny = 2.0 ** -1074
    eta, W = scalar(w.eta), w.W
    with np.errstate(over="ignore", invalid="ignore"):
        if not (eta == 0 or lowbit(eta) == abs(eta)):
            return rounding(S, k)
        eta_ok = (Xm == 0) | (lowbit(Xm) * abs(eta) >= tiny)
        least = np.where(W != 0, np.abs(W), np.inf).min(axis=0, initial=np.inf)  # per unit
        unit_ok = ~on | (Am == 0) | ((lowbit(Am) * least >= tiny) & np.isfinite(Am))
        lost = (~unit_ok).astype(float) @ (W != 0).T.astype(float) > 0
        one = (writers[0] <= 1) & writers[1] & ~lost & eta_ok
        return np.where(one, sum_error(eta * Xm, AW, mid), rounding(S, k))


def _two_terms(rnd, Xm, Xr, unit_term, writers, size, w: Weights, fmt: Format):
    """``rnd`` with the cells of two exact terms (:func:`_two_exact_terms`) rounded once, by
    θ of the result's ``size`` (|mid| + spread + the float64 midpoint's error), and not at all
    where they cancel (:func:`_cancelling`; ``unit_term``: the one unit's W·a as a box, its
    radius already raised by what an underflow of |W|·r may lose; ``writers``:
    :func:`_writers`)."""
    eta = scalar(w.eta)
    two = _two_exact_terms(Xm, Xr, writers, w, fmt)
    rnd = np.where(two, up(theta(2, 3, fmt) * size + 4 * fmt.tiny, 6), rnd)
    lone = (eta != 0) & (writers[0] == 1)
    cancel = _cancelling(eta * Xm, abs(eta) * Xr + (Xr > 0) * 2.0 ** -1074, *unit_term, fmt)
    return np.where(two & lone & cancel, 0.0, rnd)


def _cancelling(T1, T1r, AW, AWr, fmt: Format) -> np.ndarray:
    """Cells whose two terms, η·x in the box T1 ± T1r and one unit's W·a in AW ± AWr (both
    exact products, :func:`_two_exact_terms`), have opposite signs and magnitudes within a
    factor 2 of each other in every runtime, all normal numbers of the format: their sum is
    then exact in any format (Sterbenz), so no evaluation rounds it. A flip's
    slot − relu(slot) is one: an exact 0 however inexact the slot."""
    with np.errstate(over="ignore", invalid="ignore"):
        lo1, hi1 = lower(np.abs(T1), T1r), upper(np.abs(T1), T1r)
        lo2, hi2 = lower(np.abs(AW), AWr), upper(np.abs(AW), AWr)
        return (np.sign(T1) == -np.sign(AW)) & (lo1 >= fmt.tiny) & (lo2 >= fmt.tiny) & \
            (hi1 <= 2 * lo2) & (hi2 <= 2 * lo1) & (hi1 < fmt.huge) & (hi2 < fmt.huge)


def _two_exact_terms(Xm, Xr, writers, w: Weights, fmt: Format) -> np.ndarray:
    """Output cells whose sum η·x_c + Σ_k W_ck·a_k has at most two nonzero terms, each an exact
    product (η and the W entries of the units that may be on are powers of two or 0, stored
    exactly, and no matmul input is cut): every runtime rounds such a sum once, by at most θ
    of its own size, however large its terms (x_c − relu(x_c) is exactly 0). ``writers``:
    :func:`_writers`."""
    if fmt.matmul_bits is not None or w.eta_r != 0 or (w.W_r != 0).any():
        return np.zeros(Xm.shape, dtype=bool)
    eta = scalar(w.eta)
    if not (eta == 0 or lowbit(eta) == abs(eta)):
        return np.zeros(Xm.shape, dtype=bool)
    terms = writers[0] + ((eta != 0) & ((Xm != 0) | (Xr != 0)))
    return (terms <= 2) & writers[1]


def _ff_exact(Xm, Xr, Am, Ar, Zq, on, w: Weights, k: int, fmt: Format):
    """Where the FF's output sum η·x_c + Σ_k W_ck·a_k rounds nowhere: its terms' quanta (the
    units that may be on, :func:`quantum`) fit every partial sum in the format; and the
    quanta (each output a multiple of it). ``Zq``: the quanta of exactly computed
    pre-activations (:func:`linear`), finer knowledge than their boxes give."""
    eta = scalar(w.eta)
    W = w.W
    qA = np.where(on, np.maximum(quantum(Am, Ar, fmt), Zq), np.inf)
    lbW = lowbit(W)
    if fmt.matmul_bits is not None:  # the second product's inputs are cut in TF32
        qA = np.where(fits(Am, fmt.matmul_bits) & (Ar == 0), qA, 0.0)
        lbW = np.where(fits(W, fmt.matmul_bits), lbW, 0.0)
    with np.errstate(over="ignore", invalid="ignore"):
        q = np.where(eta == 0, np.inf, lowbit(eta) * quantum(Xm, Xr, fmt))
        step = max(1, CHUNK_CELLS // max(1, W.size))  # rows × units × outputs at once
        for a in range(0, len(q), step):  # per output, over the units that may write it
            term = qA[a:a + step, :, None] * lbW.T[None]
            term[np.isnan(term)] = np.inf
            q[a:a + step] = np.minimum(q[a:a + step], term.min(axis=1, initial=np.inf))
    Ap, An = sign_parts(np.where(on, Am, 0.0), np.where(on, Ar, 0.0))
    Xp, Xn = sign_parts(eta * Xm, abs(eta) * Xr)
    Wp, Wn = np.maximum(W, 0.0), np.maximum(-W, 0.0)
    part = np.maximum(Xp + Ap @ Wp.T + An @ Wn.T, Xn + An @ Wp.T + Ap @ Wn.T)
    ok = (w.W_r == 0).all() & (w.eta_r == 0)
    return ok & fits_exactly(pos_up(part, k + 2), q, fmt.bits, fmt.tiny), q


def jacobian_spread(Xr, active, W, U_, eta: float, cols=None):
    """Per row, |J|·r for J = η·I + Σ_{k active} W_k U_kᵀ, the exact Jacobian of the row's
    affine piece, with J's float64 rounding unless J is exact (its entries' quanta fit); J's
    rows are the output columns ``cols`` (W's rows), all of them by default. The rows'
    patterns of active units and their Jacobians are formed at once, as the float64
    enclosures form them (:func:`..evaluate.jacobians.pieces`); rows without radius get 0."""
    d = Xr.shape[1]
    eye = np.eye(d) if cols is None else np.eye(d)[cols]
    out = np.zeros((len(Xr), len(eye)))
    moving = np.flatnonzero(Xr.any(axis=1))
    if len(moving):
        pcs = pieces(active[moving], W, U_, eta * eye)
        out[moving] = pos_up(jacobian_bound(Xr[moving], pcs), d + 2)
    return out


# ------------------------------------------------------------------------------ the pass
def prepare(model: Transformer, fmt: Format):
    """Each block's runtime weights: (FF Weights or None, (ρ Weights, [head Weights]) or
    None). A head's ``V`` is its dense V = β·I + p·qᵀ as the ρ/η and TransformerLens exports
    store it: formed in the model's own numbers (exact for a rational model) and converted
    once, which need not equal β·I + p·qᵀ of the stored β, p and q that the torch module
    reads (:func:`.runtime_attention.value_gap`)."""
    params = model.to_float() if model.exact else model
    ffs = iter(Weights.many([{"eta": b.ff.eta, "U": b.ff.U, "b": b.ff.b, "W": b.ff.W}
                             for b in params.blocks if b.ff is not None], fmt))
    out = []
    for own, blk in zip(model.blocks, params.blocks, strict=True):
        ff = None if blk.ff is None else next(ffs)
        sa = None
        if blk.sa is not None and not blk.sa.is_identity():
            heads = [Weights({"alpha": h.A.alpha, "a": h.A.a, "c": h.A.c, "beta": h.V.beta,
                              "p": h.V.p, "q": h.V.q,
                              "V": np.asarray(o.V.dense(), dtype=float)}, fmt)
                     for o, h in zip(own.sa.heads, blk.sa.heads, strict=True)]
            sa = (Weights({"v": blk.sa.rho}, fmt), heads)
        out.append((ff, sa))
    return out, params


def enclose_runtime(model: Transformer, inputs: list[np.ndarray], fmt: Format,
                    exp_ulps: float = DEFAULT_EXP_ULPS) -> list[tuple[np.ndarray, np.ndarray]]:
    """(midpoints, radii) per sequence (n_j × D) enclosing the output of every evaluation of
    the exported dense computation in ``fmt`` on ``inputs`` (zero-padded to the model's
    width and stored in the format first; a causal model's positions added, rounded). The
    rows of every sequence are one array, grouped by length: an FF layer acts on each row
    alone, so it runs once over the distinct rows (equal bits, radius included, give equal
    boxes: a set model's shared tokens before the first attention), and each attention layer
    once per length, after which the distinct rows are found again."""
    layers, params = prepare(model, fmt)
    ctx = Context(model, fmt, exp_ulps)
    xs = pad_columns([np.asarray(x, dtype=float) for x in inputs], model.d)
    groups = [(n, [j for j, x in enumerate(xs) if len(x) == n])
              for n in sorted({len(x) for x in xs})]
    parts = [_stored_inputs([xs[j] for j in js], params, fmt) for _, js in groups]
    Xm = np.concatenate([m.reshape(-1, model.d) for m, _ in parts])
    Xr = np.concatenate([r.reshape(-1, model.d) for _, r in parts])
    spans = np.cumsum([0] + [n * len(js) for n, js in groups])
    first, inv = distinct(np.concatenate([Xm, Xr], axis=1))
    Um, Ur = Xm[first], Xr[first]
    mixing, runs, i = padding_attention(params), stretches(layers, fmt), 0
    keyed = {k for r in runs.values() for k in range(r.start, r.end)}
    pairs, closing = runtime_pairs(layers, fmt, keyed), {}  # (pairs whose flip is at i)
    staged = staged_runs(layers, fmt, keyed | set(pairs) | {L + 1 for L in pairs})
    with np.errstate(invalid="ignore", over="ignore"):
        while i < len(layers):
            (ff, sa), run = layers[i], None if closing else runs.get(i, staged.get(i))
            if ff is not None and mixing[i]:  # (no row that may not be finite while closing)
                Um, Ur, inv = unknown_sequences(Um, Ur, inv, groups, spans)
            if run is None:
                done = None
            elif i in runs:
                done = apply_stretch(Um, Ur, run, fmt, ff_box)
            else:
                done = apply_staged(Um, Ur, run, fmt, maybe_on, _guarded_rows)
            if done is not None:
                (Um, Ur), i = done, run.end
                continue
            opening = pairs.get(i, [])
            opening = opening if opening and finite(Um, Ur) else []
            if opening or closing:
                Um, Ur, closing = pair_layer(Um, Ur, ff, opening, closing, fmt, maybe_on,
                                             _guarded_rows)
            elif ff is not None:
                Um, Ur = ff_box(Um, Ur, ff, fmt)  # (guarded: only the rows it computed)
            i += 1
            if sa is None:
                continue
            Um, Ur, inv = _attend(Um, Ur, inv, sa, groups, spans, ctx)
    Xm, Xr = Um[inv], Ur[inv]
    outs: list = [None] * len(xs)
    for (n, js), a in zip(groups, spans[:-1], strict=True):
        for i, j in enumerate(js):
            outs[j] = (Xm[a + i * n:a + (i + 1) * n], Xr[a + i * n:a + (i + 1) * n])
    return outs


def padding_attention(params: Transformer) -> list[bool]:
    """Per block, whether the ρ/η or TransformerLens layout runs an attention layer of zero
    weights right before its FF: the ρ/η layout pairs every FF with the attention before it,
    zero where that is absent (before the first FF, after a block without attention), and the
    TransformerLens layout opens a block, with zero attention weights, for an FF whose
    preceding block has no attention or a non-residual one (ρ ≠ 1, whose ρ·x takes that
    block's MLP). Such a layer adds π·(0·x_l) to every row: 0·inf is nan, so one row that may
    not be finite makes every row of its sequence nan, constrained positions included."""
    before = [None] + [blk.sa for blk in params.blocks[:-1]]
    return [sa is None or sa.is_identity() or sa.rho != 1 for sa in before]


def unknown_sequences(Um, Ur, inv, groups: list, spans: np.ndarray):
    """The distinct rows ``Um`` ± ``Ur`` (full rows ``inv``) with every row of a sequence
    holding a row that may not be finite made unknown (radius inf), as an attention layer of
    zero weights leaves them (:func:`padding_attention`), as distinct rows and ``inv``."""
    bad = ~(np.isfinite(Um).all(axis=1) & np.isfinite(Ur).all(axis=1))
    if not bad.any():
        return Um, Ur, inv
    Xm, Xr = Um[inv], Ur[inv]
    for (n, js), a, b in zip(groups, spans[:-1], spans[1:], strict=True):
        lost = bad[inv[a:b]].reshape(len(js), n).any(axis=1)
        Xr[a:b].reshape(len(js), n, -1)[lost] = np.inf
    first, inv = distinct(np.concatenate([Xm, Xr], axis=1))
    return Xm[first], Xr[first], inv


def _attend(Um, Ur, inv, sa, groups: list, spans: np.ndarray, ctx: Context):
    """One attention layer on the distinct rows ``Um``, ``Ur`` (the stacked rows are
    ``Um[inv]``), each group of sequences of one length at once; returns the new distinct
    rows and ``inv``. A layer that changes a few coordinates (:func:`.narrowed`: a keyed
    separation round) reads those alone, and only the sequences it may change."""
    narrow = narrowed(Um, Ur, sa[1], sa[0], ctx.fmt)
    if narrow is None:
        Xm, Xr = Um[inv], Ur[inv]
        for (n, js), a, b in zip(groups, spans[:-1], spans[1:], strict=True):
            m, r = sa_box(Xm[a:b].reshape(len(js), n, -1), Xr[a:b].reshape(len(js), n, -1),
                          sa[1], sa[0], ctx)
            Xm[a:b], Xr[a:b] = m.reshape(b - a, -1), r.reshape(b - a, -1)
        return _redistinct(Um, Ur, inv, np.arange(len(inv)), Xm, Xr)
    cols, heads = narrow
    Cm, Cr = Um[:, cols][inv], Ur[:, cols][inv]
    rows, Ym, Yr = [np.zeros(0, dtype=np.int64)], [Um[:0]], [Ur[:0]]
    for (n, js), a, b in zip(groups, spans[:-1], spans[1:], strict=True):
        busy, m, r = narrow_box(Cm[a:b].reshape(len(js), n, -1),
                                Cr[a:b].reshape(len(js), n, -1), heads, sa[0], ctx)
        at = a + (busy[:, None] * n + np.arange(n)).reshape(-1)
        m, r = m.reshape(-1, len(cols)), r.reshape(-1, len(cols))
        Xm, Xr = Um[inv[at]], Ur[inv[at]]
        Xm[:, cols], Xr[:, cols] = m, r
        Xr[~np.isfinite(r).all(axis=1)] = np.inf  # unknown there: unknown everywhere
        rows.append(at)
        Ym.append(Xm)
        Yr.append(Xr)
    return _redistinct(Um, Ur, inv, np.concatenate(rows), np.concatenate(Ym),
                       np.concatenate(Yr))


def _redistinct(Um, Ur, inv, rows, Ym, Yr):
    """The distinct rows and ``inv`` once the stacked rows ``rows`` hold Ym ± Yr: a row whose
    bits did not change keeps its distinct row, and the others are found distinct again."""
    Xm, Xr = Um[inv[rows]], Ur[inv[rows]]
    moved = ((Ym.view(np.uint64) != Xm.view(np.uint64)) |
             (Yr.view(np.uint64) != Xr.view(np.uint64))).any(axis=1)
    rows, Ym, Yr = rows[moved], Ym[moved], Yr[moved]
    if not len(rows):
        return Um, Ur, inv
    first, at = distinct(np.concatenate([Ym, Yr], axis=1))
    inv = inv.copy()
    inv[rows] = len(Um) + at
    kept, inv = np.unique(inv, return_inverse=True)  # (rows no row reads any more go)
    Um, Ur = np.concatenate([Um, Ym[first]]), np.concatenate([Ur, Yr[first]])
    return Um[kept], Ur[kept], inv.reshape(-1)


def _stored_inputs(xs: list[np.ndarray], params: Transformer, fmt: Format):
    """Sequences of one length (B × n × d), stored in the format, positions added."""
    Xm, Xr = guard(*conversions(np.stack(xs), fmt))
    if params.positions is not None:
        P = np.asarray(params.positions[:Xm.shape[1]], dtype=float)
        Xm, Xr = guard(*_add_positions(Xm, Xr, P, fmt))
    return Xm, Xr


def _add_positions(Xm, Xr, P, fmt: Format):
    """x + position, stored: exact where the float64 sum is (TwoSum) and is a stored value."""
    Pm, Pr = conversions(P, fmt)
    mid = Xm + Pm
    err = sum_error(Xm, np.broadcast_to(Pm, Xm.shape), mid)
    size = np.abs(mid) + Xr + Pr
    exact = (err == 0) & (Xr == 0) & (Pr == 0) & (conversions(mid, fmt)[0] == mid)
    rad = up(Xr + Pr + err + theta(1, 1, fmt) * size + fmt.tiny, 4)
    return mid, unknown_if_overflow(mid, np.where(exact, 0.0, rad), fmt)
