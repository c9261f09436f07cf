"""Jacobians of an FF layer's affine pieces, and |J|·r bounds over rows grouped by their
pattern of active units (docs/numerics.md#enclosures)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .grid import lowbit
from .rounding import TINY, U, rounding, up


def jacobian_bound(r, pcs: Pieces) -> np.ndarray:
    """Per row, |J| r (with J's rounding) for J = η·I + Σ_{k active} W_k U_kᵀ, the exact
    Jacobian of the row's affine piece; rows grouped by their pattern of active units."""
    patterns, which = pcs.patterns, pcs.which
    B, c = _bounds(pcs.jac)
    out = np.empty((len(r), B.shape[1]))
    if len(patterns) <= FEW_PATTERNS:
        for g in range(len(patterns)):
            rows = which == g
            out[rows] = r[rows] @ B[g].T
    else:  # many patterns of a few rows each: B gathered per row, in slices
        step = max(1, GATHER // max(B[0].size, 1))
        for s in range(0, len(r), step):
            out[s:s + step] = np.einsum("ic,ioc->io", r[s:s + step], B[which[s:s + step]])
    return out + (c[which] * TINY) * r.sum(axis=1)[:, None]


FEW_PATTERNS = 16  # up to this many patterns, |J| r is one product per pattern
GATHER = 1 << 22  # entries of the per-row Jacobian bounds gathered at once


def pattern_bound(r, active, unsure, W, U_, eta) -> np.ndarray:
    """Per row, the largest |J_P| r (with J_P's rounding) over the patterns P = the active
    units plus any subset of the undecided ones (``unsure``, a few per row). Rows are
    grouped by their (active, undecided) patterns."""
    h = active.shape[1]
    patterns, which = flag_patterns(np.concatenate([active, unsure], axis=1))
    out = np.empty((len(r), W.shape[0]))
    for g, pat in enumerate(patterns):
        rows = which == g
        maybe = np.flatnonzero(pat[h:])
        subsets = np.repeat(pat[None, :h], 2 ** len(maybe), axis=0)
        for bits in range(2 ** len(maybe)):
            subsets[bits, maybe] = [bool(bits >> i & 1) for i in range(len(maybe))]
        B, c = _bounds(jacobians(W, U_, subsets, eta))
        rr = r[rows]
        out[rows] = np.max(rr @ B.transpose(0, 2, 1) + (c * TINY)[:, None, :] *
                           rr.sum(axis=1)[None, :, None], axis=0)
    return out


def flag_patterns(flags) -> tuple[np.ndarray, np.ndarray]:
    """The distinct rows of a boolean array and each row's index among them."""
    if flags.shape[1] < 63:  # a pattern as one integer: sorting those is far faster
        keys = flags.astype(np.int64) @ (np.int64(1) << np.arange(flags.shape[1]))
    else:  # as a few bytes (a staged run's merged layer): far faster than rows of booleans
        packed = np.ascontiguousarray(np.packbits(flags, axis=1))
        keys = packed.view(np.dtype((np.void, packed.shape[1]))).reshape(-1)
    _, first, which = np.unique(keys, return_index=True, return_inverse=True)
    return flags[first], which.reshape(-1)


@dataclass
class Jacobians:
    """Per pattern P: J_P = η·I + Σ_{k ∈ P} W_k U_kᵀ in float64 (P×outputs×inputs), S and n
    with rounding(S_P, n_P) a bound on its error entrywise (n_P = 0: J_P is exact), and the
    entries that float64 computes exactly (:func:`jacobians`)."""

    J: np.ndarray
    S: np.ndarray
    n: np.ndarray
    exact: np.ndarray


@dataclass
class Pieces:
    """The rows' patterns of certainly active units (``which``: each row's index among
    ``patterns``) and their Jacobians, formed once per layer and η for every rule that reads
    them (:func:`jacobian_bound`, :func:`pieces_into`)."""

    patterns: np.ndarray
    which: np.ndarray
    jac: Jacobians


def pieces(active, W, U_, eta) -> Pieces:
    """The :class:`Pieces` of the rows whose certainly active units are ``active``."""
    patterns, which = flag_patterns(active)
    return Pieces(patterns, which, jacobians(W, U_, patterns, eta))


def _bounds(jac: Jacobians) -> tuple[np.ndarray, np.ndarray]:
    """(|J| plus the relative part of its rounding bound, c) per pattern, c·2^-1022 the
    absolute part, the same in every entry of a row of J (0 where the row is exact): added as
    c·2^-1022·Σ_j r_j rather than inside the product, where every zero entry of J (a zero row
    of W) would make its products with the radii subnormal, on which float64 arithmetic is
    many times slower."""
    n = jac.n[:, None, None]
    keep = jac.exact | (n == 0)
    c = np.where(n > 0, 2 * n + 4, 0)  # rounding(S, n) = c·u·S + c·2^-1022
    rows = np.where(keep.all(axis=2), 0, c[:, :, 0])  # (patterns, outputs)
    return np.abs(jac.J) + np.where(keep, 0.0, c * U * jac.S), rows


def jacobians(W, U_, patterns, eta) -> Jacobians:
    """The Jacobians of every pattern (rows of the boolean ``patterns``) at once, each from
    its own units alone (a unit off the pattern takes no part, whatever its weights). Where
    a pattern's units all read one row f of U (every gadget), J_P = η·I + (Σ W_k) fᵀ with the
    column sums correctly rounded, so units that cancel exactly give exactly η·I (n_P = 2).
    An entry is exact where every product W_ck·U_kj and η is a multiple of q, the least
    lowbit(W_c·)·lowbit(U_·j) over the pattern (and lowbit(η) on the diagonal), and every
    partial sum stays below q·2^53. A snapped pair's or a reset's units cancel so, and their
    J = 0 must carry no rounding: a radius left on a cleared coordinate makes the next pair
    reading it undecided, which doubles it (docs/keyed.md). Each pattern's J is one matrix
    product, summed in whatever order BLAS takes: n_P roundings bound the error of every
    order, and an exact entry is exact in every order."""
    eye = _identity(eta, W)
    k = patterns.sum(axis=1)
    idx, pad = _unit_lists(patterns)
    Wt = np.vstack([W.T, np.zeros((1, W.shape[0]))])  # a unit per row, h the zero unit
    Ue = np.vstack([U_, np.zeros((1, U_.shape[1]))])
    Wg, Ug = np.swapaxes(Wt[idx], 1, 2), Ue[idx]  # (P, outputs, units), (P, units, inputs)
    with np.errstate(over="ignore", invalid="ignore"):
        S = np.abs(eye) + np.abs(Wg) @ np.abs(Ug)
        J, n = eye + Wg @ Ug, k + 1
        q = lowbit(Wt)[idx].min(axis=1)[:, :, None] * lowbit(Ue)[idx].min(axis=1)[:, None, :]
        q = np.minimum(q, np.where(eye != 0, lowbit(eye), np.inf))
        exact = (q >= 2.0 ** -1000) & (S < q * 2.0 ** 53)
    one = (k > 0) & ((Ug == Ug[:, :1]).all(axis=2) | pad).all(axis=1)
    if one.any():
        col, f = _column_sums(Wg[one]), Ug[one, 0]
        J[one] = eye + col[:, :, None] * f[:, None, :]
        S[one] = np.abs(eye) + np.abs(col)[:, :, None] * np.abs(f)[:, None, :]
        n[one] = 2
    J[k == 0], n[k == 0] = eye, 0
    return Jacobians(J, S, n, exact)


def _unit_lists(patterns) -> tuple[np.ndarray, np.ndarray]:
    """(idx, pad): per pattern its units in order, padded to the longest with h, the index
    of a zero unit (``pad`` marks the padding)."""
    h = patterns.shape[1]
    k = patterns.sum(axis=1)
    width = max(1, int(k.max(initial=0)))
    order = np.argsort(~patterns, axis=1, kind="stable")[:, :width]
    pad = np.arange(width)[None, :] >= k[:, None]
    return np.where(pad, h, order), pad


def _column_sums(Wg) -> np.ndarray:
    """Per pattern and output, the correctly rounded sum of its units' weights (Wg:
    patterns × outputs × units, zeros padded): a float sum of at most two nonzero terms is
    rounded once, and so correctly; math.fsum for the rest."""
    col = Wg.sum(axis=2)
    for p, o in np.argwhere((Wg != 0).sum(axis=2) > 2).tolist():
        col[p, o] = math.fsum(Wg[p, o])
    return col


def _identity(eta, W) -> np.ndarray:
    """η·I, or the rows of I (η = 1) of the output coordinates when ``eta`` is that matrix
    (W then has the output rows alone, U every input column)."""
    return eta * np.eye(W.shape[0]) if np.ndim(eta) == 0 else eta


def pieces_into(out, rad, X, r, eta, pcs: Pieces, b, W, rows, settled) -> None:
    """On ``rows``, where every unit's sign is certain on the box, F is the affine piece
    x ↦ J_P x + W_P b_P of the row's pattern P of active units. Where the active units'
    slopes cancel (J_P from :func:`jacobians` is exactly η·I, or the rows of I that ``eta``
    gives: a clip pair that is flat), the piece is evaluated so: a coordinate is bounded by
    (|J_P| + e_J)·r + e_J·|X| + the rounding of W_P b_P and of the piece's own sum, and
    where that is below its radius from the units' evaluation it takes this midpoint and
    radius instead (docs/numerics.md#enclosures: the move is added without the rounding of
    the units' large arguments). An output coordinate whose row of J_P is exactly 0 is
    constant on the box; where ``settled`` (rows × outputs: the units' float evaluation at
    the midpoint, ``out`` as it comes in, is the exact one) holds too, its radius is 0
    (docs/numerics.md#exact-rows). That rule runs first: a radius 0 is never replaced, so
    ``settled`` speaks of the midpoint that is kept, not of a flat piece's own evaluation."""
    jac, which = pcs.jac, pcs.which[rows]
    present = np.zeros(len(pcs.patterns), dtype=bool)
    present[which] = True
    constant = ((jac.J == 0) & jac.exact).all(axis=2)  # (each pattern here has a unit)
    for g in np.flatnonzero(present & constant.any(axis=1)).tolist():
        at, cols = rows[which == g], np.flatnonzero(constant[g])
        cut = np.ix_(at, cols)
        rad[cut] = np.where(settled[cut], 0.0, rad[cut])
    flat = present & (jac.J == _identity(eta, W)).all(axis=(1, 2))
    for g in np.flatnonzero(flat).tolist():
        _flat_into(out, rad, X, r, b, W, pcs.patterns[g], jac, g, rows[which == g])


def _flat_into(out, rad, X, r, b, W, pat, jac: Jacobians, g: int, at) -> None:
    """A flat piece (J_P = η·I) evaluated as such where that bounds tighter
    (:func:`pieces_into`)."""
    d, J = X.shape[1], jac.J[g]
    J_err = np.zeros(J.shape) if jac.n[g] == 0 else rounding(jac.S[g], int(jac.n[g]))
    Wp, bp = W[:, pat], b[pat]
    c = Wp @ bp
    Xa, ra = X[at], r[at]
    with np.errstate(all="ignore"):
        m = Xa @ J.T + c
        aJ = np.abs(J)
        e = ra @ (aJ + J_err).T + np.abs(Xa) @ J_err.T + \
            rounding(np.abs(Wp) @ np.abs(bp), int(pat.sum())) + \
            rounding(np.abs(Xa) @ aJ.T + np.abs(c), d + 1)
        e = up(e, 4 * d + 8)
        better = np.isfinite(m) & (e < rad[at]) & (rad[at] != 0)  # 0: called exact
    out[at] = np.where(better, m, out[at])
    rad[at] = np.where(better, e, rad[at])
