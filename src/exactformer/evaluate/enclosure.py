"""Rigorous float64 enclosures: the exact value of a float computation, bounded in float64.

A float64 model is judged by the exact evaluation of its stored numbers (docs/verification.md).
The float64 pass can carry, beside every coordinate m it computes, a radius r with
|exact − m| ≤ r, where "exact" is the exact evaluation of the same layers on the exact inputs.
When the radii at the output are small enough to decide a pair's tolerance, the pair needs no
exact pass. Every bound here is an *upper* bound computed in float64: each counts the rounding
of the operations that produced m (a dot product of n terms errs by at most γ·Σ|terms| with
γ ≤ (2n + 4)·2^-53, plus an absolute term for underflow) and is itself inflated to cover the
rounding of its own computation. Decisions (a ReLU's sign, an argmax) are taken only where the
enclosure decides them; elsewhere every outcome is enclosed (docs/numerics.md#enclosures).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..distance import hausdorff_of, pair_distances
from .grid import exact_dots
from .jacobians import Pieces, jacobian_bound, pattern_bound, pieces, pieces_into
from .rounding import FLOOR, TINY, U, lower, rounding, up, upper
from .twins import TWIN_ROWS, distinct


def sum_error(a, b, s):
    """|a + b − s| exactly, for s the float64 sum of a and b (TwoSum: its error term is exact
    in round-to-nearest, subnormals included, barring overflow); inf where s is not finite."""
    bb = s - a
    e = s - bb
    np.subtract(a, e, out=e)
    np.subtract(b, bb, out=bb)
    e += bb
    np.abs(e, out=e)  # inf or nan exactly where s is not finite: then inf
    np.copyto(e, np.inf, where=np.isnan(e))
    return e


def dot_radius(X, r, v) -> np.ndarray:
    """A bound on |x·v − fl(X·v)| for every x with |x − X| ≤ r, however the float64 dot
    product X·v was summed (zero entries of v add nothing and are skipped); 0 where the row
    is exact on v's support and no evaluation rounds the sum (docs/numerics.md#exact-rows)."""
    nz = np.flatnonzero(v)
    if len(nz) == 1:
        k = nz[0]
        av = abs(v[k])
        spread, sums = r[:, k] * av, rounding(np.abs(X[:, k]) * av, 1)
    else:
        av = np.abs(v[nz])
        spread, sums = r[:, nz] @ av, rounding(np.abs(X[:, nz]) @ av, len(nz))
    exact = exact_dots(X[:, nz], v[None, nz], np.zeros(1))[:, 0]  # (grid.py)
    sums[exact] = 0.0
    out = up(spread + sums, len(nz) + 1)
    out[exact & exact_rows(r[:, nz])] = 0.0
    return out


def _pre_activations(X, r, U_, b):
    """Float pre-activations Z = X Uᵀ + b, the rounding of Z alone, and the radius of Z over
    the boxes X ± r (rounding included). A pre-activation that reads only coordinates of
    radius 0 and that no evaluation rounds is the exact value: its radius is 0, not the few
    2^-1022 that :func:`up` adds, so its sign is decided even at 0; the other coordinates of
    the row may carry radii (docs/numerics.md#exact-rows)."""
    aU = np.abs(U_)
    Z = X @ U_.T + b
    z_round = rounding(np.abs(X) @ aU.T + np.abs(b), X.shape[1])
    z_round[exact_dots(X, U_, b)] = 0.0  # no evaluation rounds these (docs/numerics.md#grid)
    z_rad = up(r @ aU.T + z_round, X.shape[1] + 1)
    z_rad[(flagged_reads(r, U_) == 0) & (z_round == 0)] = 0.0
    return Z, z_round, z_rad


def flagged_reads(flags, V) -> np.ndarray:
    """Per row of ``flags`` and row of V: how many of the columns V reads are flagged
    (nonzero; nan counts). For radii: 0 where the row's values there are the exact ones."""
    return (flags != 0).astype(np.float64) @ (V != 0).T.astype(np.float64)


def exact_rows(r) -> np.ndarray:
    """Rows whose radius is 0 in every coordinate: their float point is the exact one."""
    return ~(r != 0).any(axis=1)


def signs(Z, z_rad) -> tuple[np.ndarray, np.ndarray]:
    """Units certainly active (pre-activation interval above 0) and undecided (neither above
    nor at most 0); the rest are certainly off and add exactly nothing."""
    active = lower(Z, z_rad) > 0
    return active, ~active & ~(upper(Z, z_rad) <= 0)


def window_pad(widening, lo, hi):
    """How far to widen a window (lo, hi) for a row search: the rows' reach ``widening`` plus
    the rounding of the float window ends."""
    return widening + 4 * U * np.maximum(np.abs(lo), np.abs(hi))


def _ff_parts(X, r, U_, b, W, etas):
    """(A, per η in ``etas`` a radius part) of a layer's units on the boxes X ± r: the float
    ReLU outputs, and a bound on |F(x) − F̃(X)| for F(x) = η·x + W relu(U x + b), every x in
    the box and F̃ the float evaluation before the rounding of its output sum
    (:func:`units_radius`)."""
    Z, z_round, z_rad = _pre_activations(X, r, U_, b)
    active, unsure = signs(Z, z_rad)
    return np.maximum(Z, 0.0), [units_radius(r, active, unsure, z_round, z_rad, W, U_, eta,
                                             pieces(active, W, U_, eta)) for eta in etas]


PATTERNS = 4  # undecided units per row up to which their on/off patterns are enumerated


def units_radius(r, active, unsure, z_round, z_rad, W, U_, eta, pcs: Pieces) -> np.ndarray:
    """The smaller of two bounds on |F(x) − F̃(X)| per row (docs/numerics.md#enclosures):

    * |J| r for the Jacobian J of the certainly active units, plus the active units'
      rounding and the whole spread |W_k|·(radius of z_k) of every undecided unit;
    * for rows with at most :data:`PATTERNS` undecided units: the largest |J_P| r over the
      patterns P that switch any of them on (F is continuous and affine with Jacobian J_P
      on each piece of the box, so along the segment from X to x it moves by at most that),
      plus the rounding of every unit that may be on. A row sitting on a hat's kink, whose
      units cancel in slope, is then charged the hat's slope, not the sum of its units'.

    ``pcs``: the rows' patterns of active units and their Jacobians."""
    aW = np.abs(W).T
    out = jacobian_bound(r, pcs) + (z_round * active + z_rad * unsure) @ aW
    k = unsure.sum(axis=1)
    rows = np.flatnonzero((k > 0) & (k <= PATTERNS))
    if len(rows):
        on = active[rows] | unsure[rows]
        alt = pattern_bound(r[rows], active[rows], unsure[rows], W, U_, eta) + \
            (z_round[rows] * on) @ aW
        out[rows] = np.minimum(out[rows], alt)
    return out


def zone_change(X, r, U_, b, W, f, lo: float, hi: float) -> np.ndarray:
    """A bound on |W relu(U x + b)| over the boxes X ± r, for rows the float pass leaves
    alone (their float f·x is outside the window (lo, hi)) although their box reaches it.
    The layer is zero outside the window and Lipschitz in t = f·x (slope at most
    Σ |W_k|·|σ_k| with U_k = σ_k·f), so the change is at most that slope times how far the
    box reaches into the window — not the units' outputs, which cancel beyond its far end."""
    if not len(X):
        return np.zeros((0, W.shape[0]))
    t, t_rad = X @ f, dot_radius(X, r, f)
    reach = reach_into(t, t_rad, lo, hi)
    j = int(np.argmax(np.abs(f)))
    sig = np.abs(U_[:, j] / f[j]) * (1 + 4 * U)
    slope = up(np.abs(W) @ sig, len(b) + 2)
    Z, _, z_rad = _pre_activations(X, r, U_, b)
    outputs = np.maximum(upper(Z, z_rad), 0.0) @ np.abs(W).T
    return up(np.minimum(np.outer(reach, slope), outputs), 2 * len(b) + 2)


def reach_into(t, t_rad, lo, hi) -> np.ndarray:
    """How far the intervals t ± t_rad of rows outside (lo, hi) reach into it (0 if not);
    rounded up."""
    into = np.where(t <= lo, upper(t, t_rad) - lo, hi - lower(t, t_rad))
    return np.nextafter(np.maximum(into, 0.0), np.inf)


def ridge_radius(rad, spread: list) -> np.ndarray:
    """``rad`` updated in place to the radii after a residual layer of ridge windows, from
    each window's (rows, whole, alone, near, zone) (see :func:`ff_change`,
    :func:`zone_change`). A row touched by one window only gets that window's ``whole``; a
    row touched by several gets its radius plus the sum of their separate terms (triangle
    inequality)."""
    if len(spread) == 1 and not len(spread[0][3]):  # one window, no row near its ends
        rad[spread[0][0]] = spread[0][1]
        return rad
    rows = np.concatenate([np.concatenate([s[0], s[3]]) for s in spread]).astype(int)
    if not len(rows):
        return rad
    terms = np.concatenate([np.concatenate([s[2], s[4]]) for s in spread])
    whole = np.concatenate([np.concatenate([s[1], np.full_like(s[4], np.nan)])
                            for s in spread])
    uniq, inv, count = np.unique(rows, return_inverse=True, return_counts=True)
    extra = np.zeros((len(uniq), rad.shape[1]))
    np.add.at(extra, inv, terms)
    new = up(rad[uniq] + extra, len(spread) + 2)
    alone = (count[inv] == 1) & ~np.isnan(whole[:, 0])
    new[inv[alone]] = whole[alone]
    rad[uniq] = new
    return rad


def gadget_form(U_, b, W):
    """(f, σ, w, ω) with U_k = σ_k·f and W_k = ω_k·w exactly, every σ_k, ω_k a signed power
    of two, or None (:func:`gadget_forms` for one layer)."""
    ok, f, sig, w, om = gadget_forms(U_[None], b[None], W[None])
    return (f[0], sig[0], w[0], om[0]) if ok[0] else None


def gadget_forms(U_, b, W):
    """The gadget forms of n layers of one shape at once (U_ n×h×d, b n×h, W n×d×h): ok (n,)
    and f (n×d), σ (n×h), w (n×d), ω (n×h) with U_k = σ_k·f and W_k = ω_k·w exactly, every
    σ_k, ω_k a signed power of two; the rows where ok is False mean nothing. Every hat and lift
    of the construction has this form (docs/gadgets.md). The form is refused unless the
    products the gadget evaluation forms — σ_k·f, ω_k·w, ω_k·σ_k and ω_k·b_k — are all exact
    (normal floats, far from underflow and overflow) and every sum of the ω_k·σ_k is exact
    too."""
    with np.errstate(all="ignore"):
        ok_u, f, sig = _scaled_rows(U_)
        ok_w, w, om = _scaled_rows(np.swapaxes(W, 1, 2))
        scaled = np.abs(om * b)
        shifts = ((b == 0) | ((scaled >= 2.0 ** -1000) & (scaled <= 2.0 ** 1000))).all(axis=1)
        slopes = np.abs(sig * om)  # powers of two within 2^40 of each other: sums are exact
        close = ~(slopes.max(axis=1) > 2.0 ** 40 * slopes.min(axis=1))
    return ok_u & ok_w & shifts & close, f, sig, w, om


def _scaled_rows(rows):
    """For n stacks of rows (n×h×d): ok, the first row ``lead`` of each stack and k with
    rows_i = k_i·lead exactly, k_i a power of two; every row ±lead (every hat) needs no
    division."""
    lead = rows[:, 0]
    size = np.abs(lead)
    nz = lead != 0
    ok = nz.any(axis=1) & (~nz | ((size >= 2.0 ** -500) & (size <= 2.0 ** 500))).all(axis=1)
    same = (rows == lead[:, None]).all(axis=2)
    fits = (same | (rows == -lead[:, None]).all(axis=2)).all(axis=1)  # every row ±lead
    k = np.where(same, 1.0, -1.0)
    rest = np.flatnonzero(ok & ~fits)
    if len(rest):
        k[rest], fits[rest] = _power_scales(rows[rest], lead[rest], nz[rest])
    return ok & fits, lead, k


def _power_scales(rows, lead, nz):
    """k with rows_i = k_i·lead exactly (lead ≠ 0), and whether every k_i is a power of two
    in [2^-400, 2^400]."""
    n = len(rows)
    j = np.argmax(nz, axis=1)  # the first nonzero entry of lead
    k = rows[np.arange(n), :, j] / lead[np.arange(n), j][:, None]
    size = np.abs(k)
    return k, ((np.frexp(size)[0] == 0.5).all(axis=1)
               & ((size >= 2.0 ** -400) & (size <= 2.0 ** 400)).all(axis=1)
               & (rows == k[:, :, None] * lead[:, None]).all(axis=(1, 2)))


@dataclass
class GadgetStep:
    """What :func:`gadget_rows` finds for rows each meeting one gadget window."""

    change: np.ndarray  # float change to add to the rows inside their window
    inside: np.ndarray  # float f·x strictly inside the window
    whole: np.ndarray  # radius of x + change (rows inside)
    alone: np.ndarray  # radius of the change alone (rows inside) or bound on it (outside)


def gadget_rows(X, r, f, sig, b, om, w, lo, hi) -> GadgetStep:
    """Rows X ± r, each meeting one gadget window (units U_k = σ_k·f, b_k, W_k = ω_k·w of
    :func:`gadget_form`; per row: σ, b, ω (n×h), w (n×d), lo, hi (n,)).

    A row inside its window by float f·x moves by the window's affine piece on the units
    certainly active: (Σ ω_k σ_k)(f·x)·w + (Σ ω_k b_k)·w with both sums exact or correctly
    rounded, so on a flat top (Σ ω_k σ_k = 0) the move is exact to within one rounding and the
    radius passes through unchanged; an undecided unit adds |ω_k|·|w|·(its pre-activation's
    radius) (ReLU is 1-Lipschitz). A row outside keeps its value: the window is zero outside
    and Lipschitz inside with slope Σ|ω_k σ_k|·|w|, so its change is at most that slope times
    how far its box reaches into the window (the units' outputs would not do: beyond the
    window they are large and cancel).
    """
    h, d = sig.shape[1], X.shape[1]
    t, t_rad = X @ f, dot_radius(X, r, f)
    Z = t[:, None] * sig + b
    z_round = rounding(np.abs(sig) * (np.abs(X) @ np.abs(f))[:, None] + np.abs(b), d)
    z_rad = up(np.abs(sig) * t_rad[:, None] + z_round, d + 3)
    active, unsure = signs(Z, z_rad)
    slope = (om * sig * active).sum(axis=1)  # exact (gadget_form)
    shift = np.array([math.fsum(v) for v in (om * b * active).tolist()])
    loose = (np.maximum(Z, 0.0) * unsure * om).sum(axis=1)
    aw = np.abs(w)
    err = (np.abs(slope) * (t_rad + 2 * U * np.abs(t)) + 2 * U * np.abs(shift)
           + (z_rad * unsure * np.abs(om)).sum(axis=1))
    size = (np.abs(slope * t) + np.abs(shift) + np.abs(loose))[:, None] * aw + np.abs(X)
    moved = err[:, None] * aw + rounding(size, h + 3)
    into = reach_into(t, t_rad, lo, hi)
    lip = np.minimum(np.abs(om * sig).sum(axis=1) * into,
                     (np.maximum(upper(Z, z_rad), 0.0) * np.abs(om)).sum(axis=1))
    inside = (t > lo) & (t < hi)
    alone = np.where(inside[:, None], up(moved, 2 * h + 12), up(lip[:, None] * aw, 2 * h + 4))
    return GadgetStep((slope * t + shift + loose)[:, None] * w, inside,
                      up(r + moved, 2 * h + 12), alone)


def ff_change(X, r, U_, b, W):
    """For rows X ± r inside a residual layer's window (a layer of any form; gadgets take
    :func:`gadget_rows`): the float64 change relu(X Uᵀ + b) Wᵀ, the radius of x + change
    (|I + J| r for the Jacobian J of the units certainly active, grouped by activity pattern,
    plus every unit's rounding and the undecided units' spread), and of the change alone."""
    h = len(b)
    A, (whole, alone) = _ff_parts(X, r, U_, b, W, (1.0, 0.0))
    spread = rounding(np.abs(X) + A @ np.abs(W).T, h + 1)
    n = 2 * (h + X.shape[1]) + 4
    return A @ W.T, up(whole + spread, n), up(alone + spread, n)


def ff_dense(X, r, eta: float, U_, b, W) -> tuple[np.ndarray, np.ndarray]:
    """A whole FF layer on every row: float64 output η·X + relu(X Uᵀ + b) Wᵀ and its radius
    (as in :func:`ff_change`), as new arrays (:func:`ff_dense_into` writes into X and r)."""
    out, rad = X.copy(), r.copy()
    ff_dense_into(out, rad, eta, U_, b, W)
    return out, rad


def ff_dense_into(X, r, eta: float, U_, b, W, off=None) -> np.ndarray | None:
    """:func:`ff_dense` in place; returns the rows it may have changed (None: any row). With
    η = 1, a finite output coordinate that no unit which may be on writes is x itself in both
    passes and keeps its radius (docs/numerics.md, keyed models), a coordinate no unit reads
    or writes is not even looked at (a keyed layer touches a few of the model's coordinates),
    a row whose units are all certainly off is left as it is (not among the rows returned),
    and rows equal on those coordinates (radii included) are evaluated once. ``off`` (rows ×
    units, W finite): units that are no part of the row's layer, held off (:func:`_ff_dense`)."""
    cols = np.flatnonzero(U_.any(axis=0) | W.any(axis=1))
    if eta != 1 or (len(cols) == X.shape[1] and off is None):  # (a stage: its live rows alone,
        X[:], r[:] = _ff_dense(X, r, eta, U_, b, W, off)       # however wide the model)
        return None
    outs = np.flatnonzero(W[cols].any(axis=1))  # of cols: those a unit writes
    if not len(outs):  # the layer writes nothing: x + 0
        return np.zeros(0, dtype=np.int64)
    rows, Uc = stirred(X, r, U_, b), U_[:, cols]
    cut = np.ix_(rows, cols)
    on = maybe_on(X[cut], r[cut], Uc, b)
    if off is not None:
        on &= ~off[rows]
    live = rows[on.any(axis=1)]
    Xc, rc = X[np.ix_(live, cols)], r[np.ix_(live, cols)]
    first, inv = _twins(Xc, rc) if off is None else _twins(Xc, rc, off[live])
    held = None if off is None else off[live][first]
    out, rad = _ff_dense(Xc[first], rc[first], np.eye(len(cols))[outs], Uc, b, W[cols[outs]],
                         held)
    if not np.isfinite(out).all():  # an infinite unit makes inf·0 = nan elsewhere
        X[:], r[:] = _ff_dense(X, r, eta, U_, b, W, off)
        return None
    to = cols[outs]
    X[np.ix_(live, to)], r[np.ix_(live, to)] = out[inv], rad[inv]
    return live


def stirred(X, r, U_, b) -> np.ndarray:
    """The rows on which some unit may be on, or a superset: every row, unless every bias is
    ≤ 0 and every weight finite, when a row whose read coordinates are all exact zeros
    (value and radius 0) has each pre-activation exactly its bias, so every unit off
    (:func:`maybe_on`'s rule, found here with one comparison of the read columns rather
    than the bound's products over every row: a snapped pair or a reset reads one or two
    coordinates, 0 at all but a few of thousands of rows)."""
    if not (b <= 0).all() or not np.isfinite(U_).all():  # (a nan bias is not ≤ 0)
        return np.arange(len(X))
    reads = np.flatnonzero(U_.any(axis=0))
    return np.flatnonzero(((X[:, reads] != 0) | (r[:, reads] != 0)).any(axis=1))


def _twins(Xc, rc, off=None) -> tuple[np.ndarray, np.ndarray]:
    """(first, inv): the live rows of many that are distinct on the layer's coordinates, values
    and radii (and units held ``off``) (:func:`.twins.distinct`), so that each is evaluated
    once; every row alone when there are few (the moves: a few live rows of tens of
    thousands)."""
    if len(Xc) < TWIN_ROWS:
        return np.arange(len(Xc)), np.arange(len(Xc))
    parts = [Xc, rc] if off is None else [Xc, rc, off.astype(np.float64)]
    return distinct(np.concatenate(parts, axis=1))


def maybe_on(X, r, U_, b) -> np.ndarray:
    """Per row and unit: whether U·x + b may be > 0 at an exact point x of the row's box, or
    in a float evaluation there, by the generic rounding bound alone (no grid certificate:
    cheaper, and never smaller); True where the bound is not finite or nan. A unit that
    reads only exact zeros (value and radius 0; U finite) is b, exactly: a snapped pair
    reads its snap, 0 at every row but the few it moves (docs/keyed.md)."""
    aU = np.abs(U_)
    Z = X @ U_.T + b
    z_rad = up(r @ aU.T + rounding(np.abs(X) @ aU.T + np.abs(b), X.shape[1]), X.shape[1] + 1)
    with np.errstate(invalid="ignore"):  # upper(Z, z_rad) <= 0 (z_rad > 0) without its
        on = ~(Z + z_rad < 0)  # nextafter: a float sum < 0 is exactly < 0; nan is on
    if np.isfinite(U_).all():
        zeros = flagged_reads((X != 0) | (r != 0), U_) == 0
        on = np.where(zeros, np.broadcast_to(~(b <= 0), on.shape), on)  # (nan: may be on)
    return on


def _ff_dense(X, r, eta, U_, b, W, off=None) -> tuple[np.ndarray, np.ndarray]:
    """:func:`ff_dense` on every coordinate of X; a coordinate of a row whose units' signs
    are all certain takes the affine piece's evaluation where that bounds it tighter
    (:func:`.jacobians.pieces_into`). ``eta``: η, or (η = 1) the rows of the identity of
    the output coordinates, W then having those rows alone: coordinates no unit writes are
    left out of the output (a tagging window reads every data coordinate and writes one).
    ``off`` (rows × units, W finite): per row, units that are no part of its layer (a staged
    run's other layers, :mod:`.staged`): certainly off with radius 0, so each adds an exact
    0, and the sums' rounding counts the row's own units alone."""
    d, h = X.shape[1], len(b)
    Xo, ro, eta = _outputs(X, r, eta)
    Z, z_round, z_rad = _pre_activations(X, r, U_, b)
    if off is not None:
        Z[off], z_round[off], z_rad[off] = -1.0, 0.0, 0.0
        h = int((~off).sum(axis=1).max(initial=0))
    active, unsure = signs(Z, z_rad)
    A, may_be_on = np.maximum(Z, 0.0), active | unsure
    pcs = pieces(active, W, U_, eta)
    rad = units_radius(r, active, unsure, z_round, z_rad, W, U_, eta, pcs)
    e = eta if np.ndim(eta) == 0 else 1.0
    exact = flagged_reads((z_rad != 0) & may_be_on, W) == 0  # exact units write it
    if e != 0:
        exact &= ro == 0  # and the coordinate itself is exact
    out = e * Xo + A @ W.T
    sums = rounding(abs(e) * np.abs(Xo) + A @ np.abs(W).T, h + 1)
    written = np.flatnonzero(W.any(axis=1))
    if e in (0, 1, -1):  # η·x exact: the row's own term of each sum (grid.py)
        sums[:, written] *= ~exact_dots(A, W[written], e * Xo[:, written], held=off)
    rad = up(rad + sums, 2 * (h + d) + 4)
    rad[exact & (sums == 0)] = 0.0  # exact terms, a sum no evaluation rounds
    if e == 1:  # a coordinate no unit that may be on writes: x + 0, exactly, in both
        untouched = flagged_reads(may_be_on, W) == 0
        rad = np.where(untouched & np.isfinite(out), ro, rad)  # inf·0 = nan is not x
    rows = np.flatnonzero(~unsure.any(axis=1) & active.any(axis=1))
    if len(rows):
        settled = (sums == 0) & np.isfinite(out) & \
            (flagged_reads((z_round != 0) & active, W) == 0)
        pieces_into(out, rad, X, r, eta, pcs, b, W, rows, settled)
    return out, rad


def _outputs(X, r, eta):
    """The output coordinates of X and r, and η as :func:`.jacobians.jacobians` takes it."""
    if np.ndim(eta) == 0:
        return X, r, eta
    at = np.argmax(eta, axis=1)
    return X[:, at], r[:, at], eta


def hausdorff_upper(O, o_rad, Y, y_rad, D=None) -> np.ndarray:
    """Upper bounds on the Hausdorff distance between the exact point sets that the boxes
    O ± o_rad and Y ± y_rad enclose (token by token), for a stack of pairs of one shape
    (O, o_rad: B×n×d; Y, y_rad: B×m×d); nan where unknown. Each distance |x − y| of points in
    two boxes is at most |O_i − Y_j| + |o_rad_i + y_rad_j|, both computed in float64 and
    inflated by their rounding (squares below 2^-1022 may vanish: d · 2^-510 covers them).
    ``D``: the float distances |O_i − Y_j| when already computed (``pair_distances``)."""
    d = O.shape[-1]
    with np.errstate(over="ignore", invalid="ignore"):
        D = pair_distances(O, Y) if D is None else D
        if y_rad.any():
            R = np.sqrt(((o_rad[:, :, None, :] + y_rad[:, None, :, :]) ** 2).sum(axis=3))
        else:  # exact targets: |o_rad_i|, the same float sums, for every j
            R = np.sqrt((o_rad ** 2).sum(axis=2))[:, :, None]
        slack = 1 + (4 * d + 16) * U
        h = hausdorff_of(up(D * slack + R * slack + 2 * d * FLOOR, 4))
    return np.where(np.isfinite(h), h, np.nan)


def float_radius(exact: np.ndarray, approx: np.ndarray) -> np.ndarray:
    """A bound on |exact − approx| for exact values (Fractions) rounded to the floats
    ``approx``: 0 where they are equal, else one unit in the last place (inf beyond range)."""
    same = np.array([a == e for a, e in zip(approx.flat, exact.flat, strict=True)],
                    dtype=bool).reshape(approx.shape)
    with np.errstate(over="ignore"):
        ulp = 2 * U * np.abs(approx) + TINY
    return np.where(same, 0.0, np.where(np.isfinite(approx), ulp, np.inf))
