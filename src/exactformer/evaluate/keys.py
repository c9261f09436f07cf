"""Key layers: FF layers whose units look a row up by an exact key, applied by lookup.

A **key layer** (docs/numerics.md#key-layers) has η = 1 and units whose rows of U read only a
set Q of coordinates, each κ·σ_i with σ_i a distinct vector of {−1, 0, 1}^Q with exactly w
nonzero entries, and one bias b < 0 for all. A row whose Q-part is exactly g·τ, τ in
{−1, 0, 1}^Q with at most w nonzero entries and κ·g·(w − 1) + b ≤ 0, meets σ_i·τ ≤ w − 1 at
every unit but the one with σ_i = τ: that unit alone can be active (at κ·g·w + b), and a
row with Q-part 0 meets b < 0 everywhere. So each row costs one lookup of its key τ, not one
dot product per unit; rows of any other form (and rows whose Q-part carries a radius) are
evaluated densely. The construction's position keys (construct/position_keys.py) are such
layers; the recognition reads the stored parameters only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from itertools import accumulate
from operator import and_

import numpy as np

from ..model import FF
from . import enclosure
from .arithmetic import relu

MAX_KEY_COORDINATES = 33  # keys are packed base 3 into integers exact in float64 and int64


@dataclass
class KeyLayer:
    """A recognised key layer: its coordinates Q, the packed key of every unit (sorted, with
    the units' indices), κ, w and the common bias b (exact)."""

    Q: np.ndarray
    codes: np.ndarray  # sorted packed keys
    units: np.ndarray  # unit index of each sorted key
    kappa: Fraction
    w: int
    b: Fraction


def key_layers(ffs: list[FF | None]) -> list[KeyLayer | None]:
    """Each FF of ``ffs`` as a key layer (read from its stored parameters), or None. The
    layers share one Q, the union of what they read when that is small enough, so that the
    rows' keys are computed once for all of them: a unit reads only its own coordinates, so
    extending Q by coordinates it gives weight 0 leaves its key and the argument above
    intact."""
    parts = [_key_parts(ff) for ff in ffs]
    Qs = [p[0] for p in parts if p is not None]
    union = np.unique(np.concatenate(Qs)) if Qs else np.zeros(0, dtype=np.int64)
    out = []
    for ff, p in zip(ffs, parts, strict=True):
        if p is None:
            out.append(None)
            continue
        Q = union if len(union) <= MAX_KEY_COORDINATES else p[0]
        codes = _pack(np.sign(np.asarray(ff.U)[:, Q]).astype(np.int64))
        order = np.argsort(codes, kind="stable")
        codes = codes[order]
        ok = not (codes[1:] == codes[:-1]).any()
        out.append(KeyLayer(Q, codes, order, *p[1:]) if ok else None)
    return out


def _key_parts(ff: FF | None):
    """(Q, κ, w, b) of a layer of the key form with its own coordinates Q, or None."""
    if ff is None or ff.eta != 1 or ff.width == 0:
        return None
    U = np.asarray(ff.U)
    Q = np.flatnonzero((U != 0).any(axis=0))
    if not 1 <= len(Q) <= MAX_KEY_COORDINATES:
        return None
    Uq = U[:, Q]
    kappa = abs(Uq[0][Uq[0] != 0][0])
    nz = Uq != 0
    w = int(nz[0].sum())
    b = ff.b[0]
    if not (kappa > 0 and (nz.sum(axis=1) == w).all() and (np.abs(Uq[nz]) == kappa).all()
            and all(v == b for v in ff.b) and b < 0):
        return None
    return Q, Fraction(kappa), w, Fraction(b)


def _pack(tau: np.ndarray) -> np.ndarray:
    """Each row of a {−1, 0, 1} matrix as one integer, Σ (τ_k + 1)·3^k."""
    return (tau + 1) @ (3 ** np.arange(tau.shape[1], dtype=np.int64))


def row_keys(S: np.ndarray, R: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For rows with Q-part S (and radii R there, or None): the packed key τ, the scale g
    (so that S = g·τ exactly) and the number of nonzero entries of τ; rows not of that form
    (or with a nonzero radius in Q, or non-finite) get weight −1. Object rows are read one by
    one, float rows at once."""
    n, q = S.shape
    if S.dtype == object:
        g = np.array([max((abs(v) for v in r), default=0) for r in S], dtype=object)
        ok = np.array([all(v == 0 or abs(v) == gi for v in r) for r, gi in zip(S, g, strict=True)],
                      dtype=bool)
        tau = np.array([[0 if v == 0 else (1 if v > 0 else -1) for v in r] for r in S],
                       dtype=np.int64).reshape(n, q)
    else:
        g = np.abs(S).max(axis=1, initial=0.0)
        ok = np.isfinite(g) & ((S == 0) | (np.abs(S) == g[:, None])).all(axis=1)
        if R is not None:
            ok &= (R == 0).all(axis=1)
        tau = np.sign(np.where(np.isfinite(S), S, 0)).astype(np.int64)
    weight = np.where(ok, (tau != 0).sum(axis=1), -1)
    return _pack(tau), g, weight


@dataclass
class _RowKeys:
    """Every row's key along one Q as of a state's epoch: packed τ, the index of its scale g
    in ``gvals``, its weight (−1: not a key), and the rows whose Q-part is not 0."""

    epoch: int
    code: np.ndarray
    gid: np.ndarray
    weight: np.ndarray
    gvals: list
    live: np.ndarray  # mask
    gindex: dict = field(default_factory=dict)  # scale -> its index in gvals

    def set_rows(self, rows, S: np.ndarray, R: np.ndarray | None) -> None:
        code, g, weight = row_keys(S, R)
        self.code[rows], self.weight[rows] = code, weight
        index = self.gindex
        for v in g.tolist():
            if v not in index:
                index[v] = len(self.gvals)
                self.gvals.append(v)
        self.gid[rows] = np.array([index[v] for v in g.tolist()], dtype=np.int64)


def _keys_of(st, Q: np.ndarray) -> _RowKeys:
    """The rows' keys along Q, recomputed only for rows changed since the last layer that read
    them (``st.keys`` is dropped by the state whenever rows are replaced or re-indexed, or a
    column of Q is written)."""
    tag = tuple(Q.tolist())
    rk = st.keys.get(tag)
    n = len(st.P)
    if rk is None:
        empty = np.zeros(n, dtype=np.int64)
        rk = st.keys[tag] = _RowKeys(st.epoch, empty, empty.copy(), empty.copy(), [],
                                     np.zeros(n, dtype=bool))
        rows = np.arange(n)
    else:
        rows = np.flatnonzero(st.row_epoch > rk.epoch)
    if len(rows):
        rk.set_rows(rows, st.P[rows][:, Q], None if st.rad is None else st.rad[rows][:, Q])
        rk.live[rows] = rk.weight[rows] != 0
    rk.epoch = st.epoch
    return rk


def apply_keys(st, ff: FF, key: KeyLayer) -> np.ndarray:
    """Apply the key layer ``ff`` (in the pass's arithmetic) to every row of ``st`` whose
    Q-part is a key or 0; returns the other rows, which the caller applies densely."""
    rk = _keys_of(st, key.Q)
    live = np.flatnonzero(rk.live)
    weight = rk.weight[live]
    quiet = np.array([_quiet(v, key) for v in rk.gvals], dtype=bool)
    safe = (weight >= 0) & (weight <= key.w) & quiet[rk.gid[live]]
    hit = live[safe & (weight == key.w)]
    pos = np.minimum(np.searchsorted(key.codes, rk.code[hit]), len(key.codes) - 1)
    found = key.codes[pos] == rk.code[hit]
    rows = hit[found]
    if len(rows):
        g = [rk.gvals[i] for i in rk.gid[rows].tolist()]
        _move(st, ff, key, rows, key.units[pos[found]], g)
    return live[~safe]


def _quiet(g, key: KeyLayer) -> bool:
    """Whether κ·g·(w − 1) + b ≤ 0 (no unit but the one with the row's own key can be
    active), decided exactly."""
    return key.kappa * _exact(g) * (key.w - 1) + key.b <= 0


def _exact(v) -> Fraction:
    """A float, rational (Fraction, gmpy2 mpq) or mpmath number as the exact Fraction it is."""
    if isinstance(v, (Fraction, int, float)):
        return Fraction(v)
    if hasattr(v, "denominator"):
        return Fraction(int(v.numerator), int(v.denominator))
    man, exp = v.man_exp
    return Fraction(int(man)) * Fraction(2) ** int(exp)


def _move(st, ff: FF, key: KeyLayer, rows: np.ndarray, units: np.ndarray, g: list):
    """Rows ``rows`` (Q-part g·σ of their unit) each gain W[:, unit]·(κ·g·w + b); a tracking
    pass bounds the rounding of the float product and sum exactly (TwoSum), so an exact step
    leaves the radius as it was."""
    X = st.P[rows]
    Wu = ff.W[:, units].T
    z = unit_values(st.ar, ff, key, X, units, g)
    if st.ar.is_object:
        st.P[rows] = X + Wu * z[:, None]
    else:
        change = Wu * z[:, None]
        new = X + change
        if st.rad is not None:
            st.rad[rows] = _step_radius(st.rad[rows], X, change, new, key, g, Wu, z)
        st.P[rows] = new
    st.moved(rows)


def unit_values(ar, ff: FF, key: KeyLayer, X: np.ndarray, units: np.ndarray, g: list):
    """The activation relu(κ·g·w + b) of each row's own unit: exact in an exact or mpmath
    pass, from the float64 dot product (as a dense pass computes it) in a float one."""
    if ar.is_object:
        z = np.array([ar.scalar(key.kappa * key.w) * gi + ar.scalar(key.b) for gi in g],
                     dtype=object)
    else:
        z = (X * ff.U[units]).sum(axis=1) + ff.b[units]
    return relu(z)


class KeyRun:
    """Consecutive key layers on one Q with one weight w, for a single row at a time (the
    decoder): the row's key is looked up once in a table of every layer's units and the row
    jumps to the first layer that holds it, as :func:`apply_keys` would move it layer by
    layer. ``dense(i, z)`` applies layer i densely where the lemma does not cover the row."""

    def __init__(self, ffs: list[FF], keys: list[KeyLayer]):
        self.ffs, self.keys = ffs, keys
        self.Q, self.w = keys[0].Q, keys[0].w
        self.where: dict = {}  # packed key -> [(layer, unit)] in layer order
        self.quiet: dict = {}  # scale g -> per layer k, whether layers k, k + 1, … are quiet
        for i, key in enumerate(keys):
            for code, unit in zip(key.codes.tolist(), key.units.tolist(), strict=True):
                self.where.setdefault(code, []).append((i, unit))

    @staticmethod
    def fits(run: list[KeyLayer], key: KeyLayer) -> bool:
        """Whether ``key`` may join the run (same coordinates and weight)."""
        return not run or (np.array_equal(run[0].Q, key.Q) and run[0].w == key.w)

    def push(self, z: np.ndarray, ar, dense) -> np.ndarray:
        k = 0
        while k < len(self.ffs):
            code, g, weight = (v[0] for v in row_keys(z[self.Q][None, :], None))
            if g not in self.quiet:
                each = [_quiet(g, key) for key in self.keys]
                self.quiet[g] = list(reversed(list(accumulate(reversed(each), and_))))
            if not 0 <= weight <= self.w or not self.quiet[g][k]:
                z, k = dense(self.ffs[k], z), k + 1
                continue
            later = [(i, u) for i, u in self.where.get(int(code), []) if i >= k]
            if weight < self.w or not later:
                return z
            i, unit = later[0]
            ff = self.ffs[i]
            v = unit_values(ar, ff, self.keys[i], z[None, :], np.array([unit]), [g])[0]
            z, k = z + ff.W[:, unit] * v, i + 1
        return z


def _step_radius(r, X, change, new, key: KeyLayer, g: list, Wu, z) -> np.ndarray:
    """Radii after x ↦ x + W·z: the float z differs from the exact relu(κ·g·w + b) by ez
    (computed exactly), the float product W·z from the exact one by at most half an ulp (none
    when z is 0 or a power of two and nothing underflows), and the float sum from the exact
    one by exactly the TwoSum error."""
    errors: dict = {}  # (g, float z) -> |exact z − float z|: rows share a handful of pairs
    for pair in zip(g, z.tolist(), strict=True):
        if pair not in errors:
            gi, zf = pair
            exact = max(key.kappa * Fraction(gi) * key.w + key.b, Fraction(0))
            errors[pair] = float(abs(exact - Fraction(zf))) \
                if np.isfinite(zf) else np.inf
    ez = np.array([errors[pair] for pair in zip(g, z.tolist(), strict=True)], dtype=float)
    ez = np.where(ez == 0, 0.0, enclosure.up(ez, 1))  # (0 when the float z is exact)
    err = enclosure.sum_error(X, change, new)
    pow2 = ((np.abs(np.frexp(z)[0]) == 0.5) | (z == 0)) & (ez == 0)
    normal = (np.abs(change) >= np.finfo(float).tiny) | (Wu == 0)  # no underflow
    prod = np.where(pow2[:, None] & normal, 0.0, enclosure.rounding(np.abs(change), 1))
    grow = np.abs(Wu) * ez[:, None] + prod + err
    grow = np.where(np.isfinite(grow) & np.isfinite(new), grow, np.inf)
    return np.where(grow == 0, r, enclosure.up(r + grow, 3))
