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

import math
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

from ..model import FF
from ..numbers import safe_float
from . import enclosure
from .arithmetic import relu

MAX_KEY_COORDINATES = 33  # keys are packed base 3 into integers exact in float64 and int64
MOVE_CHUNK = 8192  # rows moved or keyed at once: their temporaries fit a core's cache


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
    objects = [ff is not None and _is_object(ff) for ff in ffs]
    parts = _float_key_parts(ffs, objects)
    parts = [_key_parts(ff) if obj else p for ff, p, obj in zip(ffs, parts, objects, strict=True)]
    reads = [p[0] for p in parts if p is not None]  # per key layer, the coordinates it reads
    union = np.flatnonzero(np.any(reads, axis=0)) if reads else np.zeros(0, dtype=np.int64)
    shared = len(union) <= MAX_KEY_COORDINATES
    groups: dict = {}  # layers whose codes are packed together: one shape and one Q
    for i, p in enumerate(parts):
        if p is not None:
            groups.setdefault((np.shape(ffs[i].U), objects[i]) if shared else i, []).append(i)
    out: list = [None] * len(ffs)
    for idx in groups.values():
        Q = union if shared else np.flatnonzero(parts[idx[0]][0])
        signs = np.sign(np.array([ffs[i].U for i in idx])[:, :, Q]).astype(np.int64)
        codes = pack(signs)  # (layers, units)
        order = np.argsort(codes, axis=1, kind="stable")
        codes = np.take_along_axis(codes, order, axis=1)
        distinct = ~(codes[:, 1:] == codes[:, :-1]).any(axis=1)
        for k in np.flatnonzero(distinct).tolist():
            out[idx[k]] = KeyLayer(Q, codes[k], order[k], *parts[idx[k]][1:])
    return out


def _is_object(ff: FF) -> bool:
    return np.asarray(ff.U).dtype == object


def _float_key_parts(ffs: list[FF | None], objects: list[bool]) -> list:
    """:func:`_key_parts` for the float64 layers (``objects``: which layers are not), stacked
    by shape and tested at once; the biases first, which rule out most other layers."""
    out: list = [None] * len(ffs)
    shapes: dict = {}
    for i, (ff, obj) in enumerate(zip(ffs, objects, strict=True)):
        if ff is not None and ff.eta == 1 and ff.width and not obj:
            shapes.setdefault(np.shape(ff.U), []).append(i)
    exact: dict = {}  # float -> Fraction, once per distinct value
    for idx in shapes.values():
        b = np.array([ffs[i].b for i in idx])
        even = (b == b[:, :1]).all(axis=1) & (b[:, 0] < 0) & np.isfinite(b[:, 0])
        idx, b = [i for i, e in zip(idx, even.tolist(), strict=True) if e], b[even]
        if not idx:
            continue
        U = np.array([ffs[i].U for i in idx])
        nz = U != 0
        used = nz.any(axis=1)  # (layers, D): the coordinates each layer reads
        kappa = np.abs(U).max(axis=(1, 2))
        w = nz[:, 0].sum(axis=1)
        ok = ((nz.sum(axis=2) == w[:, None]).all(axis=1) & (w >= 1)
              & ((np.abs(U) == kappa[:, None, None]) | ~nz).all(axis=(1, 2))
              & (kappa > 0) & np.isfinite(kappa)
              & (used.sum(axis=1) <= MAX_KEY_COORDINATES))
        for k in np.flatnonzero(ok).tolist():
            out[idx[k]] = (used[k], _fraction(exact, float(kappa[k])), int(w[k]),
                           _fraction(exact, float(b[k, 0])))
    return out


def _fraction(cache: dict, v: float) -> Fraction:
    """Fraction(v), made once per distinct value."""
    if v not in cache:
        cache[v] = Fraction(v)
    return cache[v]


def _key_parts(ff: FF | None):
    """(mask of Q, κ, w, b) of a layer of the key form with its own coordinates Q, or None."""
    if ff is None or ff.eta != 1 or ff.width == 0:
        return None
    U = np.asarray(ff.U)
    reads = (U != 0).any(axis=0)
    Q = np.flatnonzero(reads)
    if not 1 <= len(Q) <= MAX_KEY_COORDINATES:
        return None
    Uq = U[:, Q]
    nz = Uq != 0
    w = int(nz[0].sum())
    if w == 0:  # a unit that reads nothing: no key
        return None
    kappa = abs(Uq[0][nz[0]][0])
    b = ff.b[0]
    if not (kappa > 0 and (nz.sum(axis=1) == w).all() and (np.abs(Uq[nz]) == kappa).all()
            and all(v == b for v in ff.b) and b < 0 and _finite(kappa) and _finite(b)):
        return None
    return reads, Fraction(kappa), w, Fraction(b)


def _finite(v) -> bool:
    """False for a float inf or nan (rationals are always finite)."""
    return not isinstance(v, float) or math.isfinite(v)


def pack(tau: np.ndarray) -> np.ndarray:
    """Each row of a {−1, 0, 1} matrix (or stack of them) as one integer, Σ (τ_k + 1)·3^k."""
    return (tau + 1) @ (3 ** np.arange(tau.shape[-1], dtype=np.int64))


def row_keys(S: np.ndarray, R: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For rows with Q-part S (and radii R there, or None): the packed key τ, the scale g
    (so that S = g·τ exactly) and the number of nonzero entries of τ; rows not of that form
    (or with a nonzero radius in Q, or non-finite) get weight −1. Object rows are read one by
    one, float rows at once, and float rows that are 0 on Q (moved rows of the construction)
    by one test."""
    n, q = S.shape
    if S.dtype == object:
        g = np.array([max((abs(v) for v in r), default=0) for r in S], dtype=object)
        ok = np.array([all(v == 0 or abs(v) == gi for v in r) for r, gi in zip(S, g, strict=True)],
                      dtype=bool)
        g[~ok] = 0  # (a row that is no key has no scale: nan and inf stay out of the index)
        tau = np.array([[0 if v == 0 else (1 if v > 0 else -1) for v in r] for r in S],
                       dtype=np.int64).reshape(n, q)
        weight = np.where(ok, (tau != 0).sum(axis=1), -1)
        return pack(tau), g, weight
    live = S.any(axis=1) if R is None else S.any(axis=1) | R.any(axis=1)  # (nan is nonzero)
    code = np.full(n, pack(np.zeros(q, dtype=np.int64)))
    g, weight = np.zeros(n), np.zeros(n, dtype=np.int64)
    if live.any():
        S = S[live]
        gl = np.abs(S).max(axis=1, initial=0.0)
        ok = np.isfinite(gl) & ((S == 0) | (np.abs(S) == gl[:, None])).all(axis=1)
        if R is not None:
            ok &= ~R[live].any(axis=1)
        tau = np.sign(np.where(np.isfinite(S), S, 0)).astype(np.int64)
        code[live], g[live] = pack(tau), np.where(ok, gl, 0.0)
        weight[live] = np.where(ok, (tau != 0).sum(axis=1), -1)
    return code, g, weight


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
        if g.dtype == object:
            values, inv = list(g), np.arange(len(g))
        else:
            values, inv = np.unique(g, return_inverse=True)
            values = values.tolist()
        for v in values:
            if v not in index:
                index[v] = len(self.gvals)
                self.gvals.append(v)
        self.gid[rows] = np.array([index[v] for v in values], dtype=np.int64)[inv.ravel()]


def keys_of(st, Q: np.ndarray, radius_free: bool = True) -> _RowKeys:
    """The rows' keys along Q, recomputed only for rows changed since the last layer that read
    them (``st.keys`` is dropped by the state whenever rows are replaced or re-indexed, or a
    column of Q is written). ``radius_free``: a row with a radius in Q is no key; else the
    keys are those of the float values, whatever the radii."""
    tag = tuple(Q.tolist()) if radius_free else (*Q.tolist(), -1)  # (−1: no column)
    rk = st.keys.get(tag)
    n = len(st.P)
    if rk is None:
        empty = np.zeros(n, dtype=np.int64)
        rk = st.keys[tag] = _RowKeys(st.epoch, empty, empty.copy(), empty.copy(), [],
                                     np.zeros(n, dtype=bool))
        rows = np.arange(n)
    else:
        rows = np.flatnonzero(st.row_epoch > rk.epoch)
    for start in range(0, len(rows), MOVE_CHUNK):  # (in chunks, as moves are)
        part = rows[start:start + MOVE_CHUNK]
        at = np.ix_(part, Q)
        rk.set_rows(part, st.P[at], None if st.rad is None or not radius_free else st.rad[at])
        rk.live[part] = rk.weight[part] != 0
    rk.epoch = st.epoch
    return rk


def _quiet(g, key: KeyLayer) -> bool:
    """Whether κ·g·(w − 1) + b ≤ 0 (no unit but the one with the row's own key can be
    active), decided exactly."""
    return key.kappa * _exact(g) * (key.w - 1) + key.b <= 0


def _converts(v, f: float) -> bool:
    """Whether the float64 ``f`` read from the number ``v`` is within a relative 2^-53 of
    |v|: a normal float (or ±inf, which no float decision trusts), or |v| itself (every
    float of a float64 pass). A rational or mpmath number that rounds to a subnormal or to 0
    can be off by nearly all of itself."""
    return not abs(f) < SMALLEST_NORMAL or Fraction(abs(f)) == abs(_exact(v))


SMALLEST_NORMAL = 2.0 ** -1022


def _exact(v) -> Fraction:
    """A float, rational (Fraction, gmpy2 mpq) or binary multiprecision number (gmpy2 mpfr,
    mpmath mpf) as the exact Fraction it is."""
    if isinstance(v, (Fraction, int, float)):
        return Fraction(v)
    if hasattr(v, "as_integer_ratio"):
        p, q = v.as_integer_ratio()
        return Fraction(int(p), int(q))
    man, exp = v.man_exp  # of |v|
    return (-1 if v < 0 else 1) * Fraction(int(man)) * Fraction(2) ** int(exp)


class KeyRun:
    """Consecutive key layers on one Q with one weight w, applied by lookup: every unit of
    every layer is in one table sorted by (key, layer), and a row goes straight to the first
    layer at or after its position that holds its key (FF layers act on each row alone, so
    rows need not move in step). Rows the argument above does not cover (a key of weight
    above w, a Q-part that is no key, a radius in Q, a scale at which some later layer is not
    quiet) are applied densely, layer by layer."""

    def __init__(self, ffs: list[FF], keys: list[KeyLayer]):
        self.ffs, self.keys = ffs, keys
        self.Q, self.w = keys[0].Q, keys[0].w
        code = np.concatenate([k.codes for k in keys])
        layer = np.repeat(np.arange(len(keys)), [len(k.codes) for k in keys])
        unit = np.concatenate([k.units for k in keys])
        order = np.lexsort((layer, code))
        self.code, self.layer, self.unit = code[order], layer[order], unit[order]
        self.quiet: dict = {}  # scale g -> per layer k, whether layers k, k + 1, … are quiet
        self._kappa = self._bias = None  # the layers' κ and b in float64, when first needed
        self._kappa_ok = None  # per layer: whether its float64 κ errs by a relative rounding
        self._table = None  # every unit's U on Q, b and W column (:meth:`_units`), when needed
        self._kb = None  # per layer: the index of its (κ, b) among the distinct pairs
        self.dense_rows = 0  # rows ``apply`` has evaluated densely instead of looking them up

    @staticmethod
    def fits(first: KeyLayer, key: KeyLayer) -> bool:
        """Whether ``key`` may join the run that starts with ``first`` (same Q and w)."""
        return first.w == key.w and (first.Q is key.Q or np.array_equal(first.Q, key.Q))

    def _quiet_from(self, g) -> list[bool]:
        """Per layer k: whether every layer from k on is quiet at scale g. Decided in float64
        where the rounding cannot change the sign (bounded generously), exactly elsewhere:
        also wherever κ or g is a number (an exact or mpmath pass's) whose float64 image has
        more than a relative rounding, one that rounds to a subnormal or to 0
        (:func:`_converts`). Such a g times a κ near 2^1000 errs by far more than the
        absolute slack (κ = 2^1000, g = 5·2^-1076 read as 2^-1074, b = −9·2^-77: quiet in
        float64, a unit on by 2^-77 exactly, which the lookup skipped)."""
        if g not in self.quiet:
            if self._kappa is None:
                self._kappa = np.array([safe_float(k.kappa) for k in self.keys])
                self._bias = np.array([safe_float(k.b) for k in self.keys])
                self._kappa_ok = np.array([_converts(k.kappa, v) for k, v in
                                           zip(self.keys, self._kappa.tolist(), strict=True)])
            g_f = safe_float(abs(g))
            with np.errstate(invalid="ignore"):  # inf·0 is nan: decided exactly below
                big = self._kappa * g_f * (self.w - 1)
                val = big + self._bias
                sure = np.abs(val) > 1e-12 * (big + np.abs(self._bias)) + 1e-300
            sure &= self._kappa_ok & _converts(g, g_f)
            each = np.where(sure, val <= 0, False)
            for k in np.flatnonzero(~sure).tolist():
                each[k] = _quiet(g, self.keys[k])
            self.quiet[g] = np.logical_and.accumulate(each[::-1])[::-1].tolist()
        return self.quiet[g]

    def _next(self, code: np.ndarray, at: np.ndarray) -> np.ndarray:
        """Per row: the table entry of the first layer ≥ ``at`` holding ``code``, or −1."""
        i = np.searchsorted(self.code, code)
        end = np.searchsorted(self.code, code, side="right")
        while True:
            behind = (i < end) & (self.layer[np.minimum(i, len(self.code) - 1)] < at)
            if not behind.any():
                return np.where(i < end, i, -1)
            i = i + behind

    def apply(self, st, dense) -> None:
        """The run on every row of the pass state ``st``; ``dense(st, ff, rows)`` applies one
        layer densely to some rows."""
        rk = keys_of(st, self.Q)
        rows = np.flatnonzero(rk.live)
        at = np.zeros(len(rows), dtype=np.int64)
        while len(rows):
            weight = rk.weight[rows]
            gids, inv = np.unique(rk.gid[rows], return_inverse=True)
            table = np.array([self._quiet_from(rk.gvals[g]) for g in gids.tolist()], dtype=bool)
            quiet = table[inv.ravel(), at]
            safe = (weight >= 0) & (weight <= self.w) & quiet
            self._dense_from(st, rows[~safe], at[~safe], dense)
            hit = safe & (weight == self.w)
            rows, at = rows[hit], at[hit]
            entry = self._next(rk.code[rows], at)
            rows, entry = rows[entry >= 0], entry[entry >= 0]
            if len(rows):
                self._move(st, rows, entry, rk.gid[rows], rk.gvals)
                rk = keys_of(st, self.Q)
            at = self.layer[entry] + 1
            keep = at < len(self.ffs)
            rows, at = rows[keep], at[keep]

    def _dense_from(self, st, rows: np.ndarray, at: np.ndarray, dense) -> None:
        """Rows the lookup does not cover, each through the layers from its position on."""
        self.dense_rows += len(rows)
        for k in range(int(at.min(initial=len(self.ffs))), len(self.ffs)):
            dense(st, self.ffs[k], rows[at <= k])

    def _move(self, st, rows: np.ndarray, entry: np.ndarray, gid: np.ndarray,
              gvals: list) -> None:
        """Rows ``rows`` (scale gvals[gid]) each gain W[:, unit]·relu(κ·g·w + b) of their
        table entry; a tracking pass bounds the rounding of the float product and sum exactly
        (TwoSum), so an exact step leaves the radius as it was. In chunks of rows, so that the
        temporaries stay in the cache."""
        for at in range(0, len(rows), MOVE_CHUNK):
            cut = slice(at, at + MOVE_CHUNK)
            self._move_rows(st, rows[cut], entry[cut], gid[cut], gvals)
        st.moved(rows)

    def _move_rows(self, st, rows: np.ndarray, entry: np.ndarray, gid: np.ndarray,
                   gvals: list) -> None:
        """:meth:`_move` on one chunk."""
        layer, unit = self.layer[entry], self.unit[entry]
        X = st.P[rows]
        U, b, Wu = self._units(layer, unit)
        z = self._activations(st.ar, layer, gid, gvals, X[:, self.Q], U, b)
        if st.ar.is_object:
            st.P[rows] = X + Wu * z[:, None]
        else:
            change = Wu * z[:, None]
            new = X + change
            if st.rad is not None:
                ez = self._z_errors(layer, gid, gvals, z)
                st.rad[rows] = _step_radius(st.rad[rows], X, change, new, Wu, z, ez)
            st.P[rows] = new

    def _z_errors(self, layer: np.ndarray, gid: np.ndarray, gvals: list,
                  z: np.ndarray) -> np.ndarray:
        """|relu(κ·g·w + b) − z| per row, exactly (then rounded up), computed once per
        distinct (κ, b, scale, float z): the rows of layers with one κ and b and of one scale
        share their z."""
        pair = self._kb_index()[layer] * len(gvals) + gid
        _, first, inv = np.unique(pair, return_index=True, return_inverse=True)
        inv = inv.ravel()
        odd = np.flatnonzero(~((z == z[first][inv]) & np.isfinite(z)))
        todo = np.concatenate([first, odd])
        err = np.empty(len(z))
        for i in todo.tolist():
            key, g, zf = self.keys[int(layer[i])], gvals[int(gid[i])], float(z[i])
            exact = max(key.kappa * _exact(g) * key.w + key.b, Fraction(0))
            err[i] = _float_error(exact - Fraction(zf)) if np.isfinite(zf) else np.inf
        out = err[first][inv]
        out[odd] = err[odd]
        return np.where(out == 0, 0.0, enclosure.up(out, 1))  # (0 when the float z is exact)

    def _activations(self, ar, layer: np.ndarray, gid: np.ndarray, gvals: list,
                     X: np.ndarray, U: np.ndarray, b: np.ndarray) -> np.ndarray:
        """relu(κ·g·w + b) of each row's own unit (layer[i], scale gvals[gid[i]]; X and U on
        Q, where U is 0 elsewhere, and exact zeros change no float sum): exact in an exact or
        mpmath pass, from the float64 dot product in a float one."""
        if ar.is_object:
            z = np.array([ar.scalar(self.keys[k].kappa * self.keys[k].w) * gvals[g]
                          + ar.scalar(self.keys[k].b)
                          for k, g in zip(layer.tolist(), gid.tolist(), strict=True)],
                         dtype=object)
        else:
            z = (X * U).sum(axis=1) + b
        return relu(z)

    def _kb_index(self) -> np.ndarray:
        """Per layer, the index of its (κ, b) among the run's distinct pairs."""
        if self._kb is None:  # by identity: the recogniser makes one Fraction per float value
            index: dict = {}
            self._kb = np.array([index.setdefault((id(k.kappa), id(k.b)), len(index))
                                 for k in self.keys])
        return self._kb

    def _units(self, layer: np.ndarray, unit: np.ndarray):
        """Rows of U on Q (U is 0 elsewhere), biases and columns of W (as rows) of the units
        (layer[i], unit[i])."""
        if self._table is None:
            self._table = self._unit_table()
        offset, U, b, W = self._table
        at = offset[layer] + unit
        return U[at], b[at], W[at]

    def _unit_table(self):
        """Every unit of the run in one table (U on Q, b, the column of W as a row), layer
        after layer, and where each layer's units start."""
        widths = [ff.width for ff in self.ffs]
        offset = np.concatenate([[0], np.cumsum(widths)])
        first = self.ffs[0]
        U = np.empty((offset[-1], len(self.Q)), dtype=first.U.dtype)
        b = np.empty(offset[-1], dtype=first.b.dtype)
        W = np.empty((offset[-1], first.W.shape[0]), dtype=first.W.dtype)
        for ff, at, to in zip(self.ffs, offset[:-1], offset[1:], strict=True):
            U[at:to], b[at:to], W[at:to] = ff.U[:, self.Q], ff.b, ff.W.T
        return offset[:-1], U, b, W

    def push(self, z: np.ndarray, ar, dense) -> np.ndarray:
        """The run on one row z (the decoder); ``dense(ff, z)`` applies one layer densely."""
        k = 0
        while k < len(self.ffs):
            code, g, weight = (v[0] for v in row_keys(z[self.Q][None, :], None))
            if not 0 <= weight <= self.w or not self._quiet_from(g)[k]:
                z, k = dense(self.ffs[k], z), k + 1
                continue
            e = int(self._next(np.array([code]), np.array([k]))[0])
            if weight < self.w or e < 0:
                return z
            i, u = int(self.layer[e]), int(self.unit[e])
            ff = self.ffs[i]
            v = self._activations(ar, np.array([i]), np.array([0]), [g], z[None, self.Q],
                                  ff.U[u, self.Q][None, :], ff.b[u:u + 1])[0]
            z, k = z + ff.W[:, u] * v, i + 1
        return z


def _float_error(e: Fraction) -> float:
    """|e| as a float that is 0 only when e is: an error below the smallest subnormal would
    round to 0.0 and read as exact."""
    return 0.0 if e == 0 else max(float(abs(e)), 5e-324)


def _step_radius(r, X, change, new, Wu, z, ez) -> np.ndarray:
    """Radii after x ↦ x + W·z: the float z differs from the exact relu(κ·g·w + b) by ez, the
    float product W·z from the exact one by at most half an ulp (none when z is exact and 0, or
    an exact power of two at which every entry of W·z is normal: the float product of the
    smallest |W| and z above the smallest normal means the exact one is above it too; at it,
    a product just below may have rounded up), and the float sum from the exact one by
    exactly the TwoSum error."""
    grow = enclosure.sum_error(X, change, new)
    Wmin = np.where(Wu == 0, np.inf, np.abs(Wu)).min(axis=1, initial=np.inf)
    exact = (ez == 0) & ((z == 0) | ((np.abs(np.frexp(z)[0]) == 0.5)
                                     & (Wmin * np.abs(z) > np.finfo(float).tiny)))
    rest = np.flatnonzero(~exact)
    if len(rest):
        with np.errstate(invalid="ignore"):  # inf·0: an unbounded z error, inf below
            more = np.abs(Wu[rest]) * ez[rest, None] + enclosure.rounding(np.abs(change[rest]), 1)
        grow[rest] += np.where(np.isnan(more), np.inf, more)
    return np.where(grow == 0, r, enclosure.up(r + grow, 3))
