"""Gated layers: FF layers whose units can only be on at the rows that hold their key.

A **gated layer** (docs/numerics.md#gated-layers) has η = 1 and finite parameters, and every
unit k reads a set Q of coordinates shared by the layer as κ_k·σ_k, σ_k a vector of
{−1, 0, 1}^Q with w nonzero entries (w the same for every unit), plus any weights on other
coordinates (its *rest* R_k). The keyed construction's moves are such layers: Q is the code,
the rest the signature and the `one` coordinate (docs/keyed.md#moves). A row whose Q-part is
exactly g·τ, τ in {−1, 0, 1}^Q with at most w nonzero entries and τ ≠ σ_k, has σ_k·τ ≤ w − 1,
so every exact point of the row's box (radius ρ on Q) gives

    U_k·x + b_k ≤ κ_k·g·(w − 1) + κ_k·w·ρ + max over the box of R_k·x + b_k.

Rows are kept in classes (:class:`Classes`) with a box on R each; where the bound, with the
rounding of any float evaluation of U_k·x + b_k, is ≤ 0 for every unit on a class, the layer
leaves the class's rows exactly as they are (x + 0, radius included), and only the rows whose
key is some σ_k, and the rows of the other classes, are evaluated, densely.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from ..model import FF
from ..numbers import safe_float, safe_floats
from . import enclosure
from .keys import MAX_KEY_COORDINATES, keys_of, pack
from .twins import distinct


@dataclass
class Gate:
    """A recognised gated layer: Q, w, and per unit its packed key σ_k, κ_k, bias and rest
    (the columns R it reads off Q, and its weights there, as an h×|R| matrix with zeros) in
    float64, rounded to nearest when the stored numbers are rationals."""

    Q: np.ndarray
    w: int
    codes: np.ndarray  # the units' packed keys σ_k, sorted, each once
    kappa: np.ndarray
    bias: np.ndarray
    R: np.ndarray
    rest: np.ndarray

    def rows(self, st) -> np.ndarray | None:
        """The rows of the pass state ``st`` that the layer may change (the rest are certainly
        left as they are), or None when that is (nearly) every row: at once where more than
        half the rows are no key (their classes are never quiet; a snapped softmax model's
        snaps read the raised codes, docs/keyed.md#softmax)."""
        rk = keys_of(st, self.Q, radius_free=False)
        if 2 * np.count_nonzero(rk.weight < 0) > len(rk.code):
            return None
        cl = classes_of(st, self.Q, self.R, rk)
        on = cl.count > 0
        loud = np.zeros(len(on), dtype=bool)
        loud[on] = ~self.quiet(cl, np.flatnonzero(on), rk.gvals)
        at = np.minimum(np.searchsorted(self.codes, rk.code), len(self.codes) - 1)
        hit = rk.live & (rk.weight == self.w) & (self.codes[at] == rk.code)
        out = np.flatnonzero(hit | loud[cl.row])
        return None if len(out) > len(rk.code) // 2 else out

    def quiet(self, cl: Classes, ids: np.ndarray, gvals: list) -> np.ndarray:
        """Per class in ``ids``: whether every unit is ≤ 0 on every row of the class whose key
        is not its own, in exact arithmetic and in every float evaluation: the bound above,
        computed in float64 from outward-rounded inputs, plus twice the rounding of a sum of
        its terms (once for computing it here, once for the pass's own evaluation). A class
        of rows that are no key of weight ≤ w, or not finite on R, is never quiet."""
        scales = np.array([safe_float(abs(v)) for v in gvals])
        g = np.nextafter(scales, np.inf)[cl.gid[ids]]
        lo, hi = cl.lo[ids], cl.hi[ids]
        with np.errstate(over="ignore", invalid="ignore"):
            key = g[:, None] * self.kappa  # (classes, units)
            spread = cl.spread[ids, None] * self.kappa * self.w
            top = key * (self.w - 1) + spread + self.bias + hi @ np.maximum(self.rest, 0).T + \
                lo @ np.minimum(self.rest, 0).T
            size = key * self.w + spread + np.abs(self.bias) + \
                np.maximum(np.abs(lo), np.abs(hi)) @ np.abs(self.rest).T
            slack = 2 * enclosure.rounding(enclosure.up(size, len(self.R) + 4),
                                           len(self.R) + self.w + 4)
            ok = np.isfinite(size) & (top + slack <= 0)
        return ok.all(axis=1) & (cl.weight[ids] >= 0) & (cl.weight[ids] <= self.w)


def same_form(a: Gate | None, b: Gate | None) -> bool:
    """Whether two gates read one Q, one R and one key weight (:func:`merged` can join them)."""
    return a is not None and b is not None and a.w == b.w and np.array_equal(a.Q, b.Q) \
        and np.array_equal(a.R, b.R)


def merged(gates: list) -> Gate | None:
    """One gate of every unit of ``gates`` (layers on one Q, R and key weight w; else None):
    a row it leaves alone is left alone by each of them (docs/numerics.md#runs-of-gated-layers)."""
    first = gates[0]
    if not all(same_form(first, g) for g in gates):
        return None
    return Gate(first.Q, first.w, np.unique(np.concatenate([g.codes for g in gates])),
                *(np.concatenate([getattr(g, k) for g in gates]) for k in ("kappa", "bias")),
                first.R, np.vstack([g.rest for g in gates]))


def gate_layers(ffs: list) -> list[Gate | None]:
    """Each FF of ``ffs`` as a gated layer, read from its stored numbers (floats or rationals;
    :func:`_form`), or None. The layers share one Q and one R, the unions of theirs, wherever
    a layer reads none of the other layers' Q off its own: the rows' keys and classes are
    then kept once for all of them."""
    forms = [_form(ff) for ff in ffs]
    found = [f for f in forms if f is not None]
    if not found:
        return [None] * len(ffs)
    Q = np.unique(np.concatenate([f[0] for f in found]))
    R = np.setdiff1d(np.unique(np.concatenate([f[1] for f in found])), Q)
    shared = len(Q) <= MAX_KEY_COORDINATES  # (keys are packed into int64)
    return [None if f is None else
            _gate(ff, *((Q, R) if shared and not np.isin(f[1], Q).any() else f[:2]), f[2])
            for ff, f in zip(ffs, forms, strict=True)]


def _form(ff: FF | None):
    """(Q, R, κ per unit) if ``ff`` is a gated layer, else None. Each unit's κ is its most
    frequent nonzero |weight| (the smallest of equally frequent ones), Q the union of where
    the units read it, R the other columns they read; the form is checked exactly."""
    if ff is None or ff.eta != 1 or ff.width == 0:
        return None
    U, b, W = (np.asarray(a) for a in (ff.U, ff.b, ff.W))
    if U.dtype != object and not all(np.isfinite(a).all() for a in (U, b, W)):
        return None
    A = np.abs(U)
    kappa = _most_frequent(A)
    if kappa is None:
        return None
    at = A == kappa[:, None]  # where each unit reads its κ
    Q = np.flatnonzero(at.any(axis=0))
    w = at.sum(axis=1)
    if not (w[0] >= 2 and len(Q) <= MAX_KEY_COORDINATES and (w == w[0]).all()
            and ((U[:, Q] == 0) | at[:, Q]).all()):
        return None
    if U.dtype == object and not all(_normal(a) for a in (U, b)):
        return None
    off = np.delete(np.arange(U.shape[1]), Q)  # (Q: sorted, each once)
    return Q, off[(U[:, off] != 0).any(axis=0)], kappa.tolist()


def _gate(ff: FF, Q: np.ndarray, R: np.ndarray, kappa: list) -> Gate:
    """The gate of a layer of the form :func:`_form` found, on Q and R (supersets of its
    own, R holding every column off Q that it reads)."""
    U = np.asarray(ff.U)
    sigma = (U[:, Q] > 0).astype(np.int64) - (U[:, Q] < 0).astype(np.int64)
    w = int(np.count_nonzero(sigma[0]))
    return Gate(Q, w, np.unique(pack(sigma)), safe_floats(np.array(kappa)),
                safe_floats(np.asarray(ff.b)), R, safe_floats(U[:, R]))


def _normal(a: np.ndarray) -> bool:
    """Whether every nonzero rational of ``a`` is at least float64's smallest normal number
    in magnitude: the bound of :meth:`Gate.quiet` takes them rounded to nearest, with a
    relative error it covers, which a value rounded to a subnormal or to 0 does not have."""
    return all(v == 0 or abs(v) >= SMALLEST_NORMAL for v in a.flat)


SMALLEST_NORMAL = Fraction(2) ** -1022


COUNT_AT_ONCE = 1 << 22  # comparisons (bytes) the float count of _most_frequent may hold


def _most_frequent(A: np.ndarray) -> np.ndarray | None:
    """Per row of A (≥ 0), its most frequent nonzero value (the smallest of the most
    frequent); None if a row is all zeros. Float rows are compared all at once (each entry
    counted against its row: w·d² comparisons, up to :data:`COUNT_AT_ONCE`), anything else
    one row at a time."""
    if A.dtype != object and A.size * A.shape[1] <= COUNT_AT_ONCE:
        counts = ((A[:, :, None] == A[:, None, :]).sum(axis=2)) * (A != 0)
        top = counts.max(axis=1, initial=0)
        if not top.all():
            return None
        return np.where(counts == top[:, None], A, np.inf).min(axis=1)
    out = []
    for row in A.tolist():
        counts = Counter(v for v in row if v != 0)
        if not counts:
            return None
        top = max(counts.values())
        out.append(min(v for v, n in counts.items() if n == top))
    return np.array(out, dtype=A.dtype)


@dataclass
class Classes:
    """The rows of a pass state in classes of equal scale g (its index in the keys'
    ``gvals``), key weight, radius on Q (rounded up to a power of two) and pattern of nonzero
    values on the rest's columns R, each class with a box that holds every exact value its
    rows take on R (±inf where a value is not finite, which makes the class never quiet).
    The pattern keeps rows the construction moved (zeros on R) apart from rows it has not.
    ``row``: each row's class; ``count``: the rows in each class. Kept in ``st.bounds`` and
    updated from the rows changed since ``epoch``: a box only grows, and a bound over rows as
    they were and are is still a bound (the state drops it whenever rows are replaced or
    re-indexed, or a column of Q or R is written)."""

    epoch: int
    keys: object  # the keys.RowKeys the classes were made with (its gid numbering)
    row: np.ndarray
    count: np.ndarray
    gid: np.ndarray
    weight: np.ndarray
    spread: np.ndarray  # per class: a bound on its rows' radius on Q
    lo: np.ndarray
    hi: np.ndarray
    index: dict  # (gid, weight, spread, pattern) -> class

    def put(self, rows: np.ndarray, labels: np.ndarray, lo: np.ndarray, hi: np.ndarray
            ) -> None:
        """Move ``rows`` (their labels: gid, weight, spread, pattern; their boxes on R) to
        their classes, widening each class's box by its new rows."""
        old = self.row[rows]
        np.subtract.at(self.count, old[old >= 0], 1)
        first, which = distinct(labels)  # (the labels repeat: a class per distinct one)
        ids = np.array([self._class(label) for label in map(tuple, labels[first].tolist())],
                       dtype=np.int64)[which]
        self.row[rows] = ids
        np.add.at(self.count, ids, 1)
        np.minimum.at(self.lo, ids, lo)
        np.maximum.at(self.hi, ids, hi)

    def _class(self, label: tuple) -> int:
        """The class of a label, a new (empty) one if unseen."""
        if label not in self.index:
            self.index[label] = len(self.index)
            self.count = np.append(self.count, 0)
            self.gid = np.append(self.gid, int(label[0]))
            self.weight = np.append(self.weight, label[1])
            self.spread = np.append(self.spread, label[2])
            self.lo = np.vstack([self.lo, np.full(self.lo.shape[1], np.inf)])
            self.hi = np.vstack([self.hi, np.full(self.hi.shape[1], -np.inf)])
        return self.index[label]


def classes_of(st, Q: np.ndarray, R: np.ndarray, rk) -> Classes:
    """The rows' classes for a gate on Q with rest R, brought up to date (see
    :class:`Classes`)."""
    tag = (*Q.tolist(), -1, *R.tolist())  # (−1: no column; the state drops tags by column)
    n = len(st.P)
    cl = st.bounds.get(tag)
    if cl is None or cl.keys is not rk:
        empty = np.zeros((0, len(R)))
        cl = st.bounds[tag] = Classes(st.epoch, rk, np.full(n, -1, dtype=np.int64),
                                      np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64),
                                      np.zeros(0), np.zeros(0), empty, empty.copy(), {})
        rows = np.arange(n)
    else:
        rows = np.flatnonzero(st.row_epoch > cl.epoch)
    for start in range(0, len(rows), CLASS_CHUNK):
        part = rows[start:start + CLASS_CHUNK]
        cl.put(part, *_describe(st, part, Q, R, rk))
    cl.epoch = st.epoch
    return cl


CLASS_CHUNK = 1 << 16  # rows described at once


def _describe(st, rows: np.ndarray, Q: np.ndarray, R: np.ndarray, rk):
    """Each row's class label (gid, weight, its largest radius on Q rounded up to a power of
    two, its pattern of nonzeros on R) and its box on R, rounded outward (a float of an exact
    or mpmath value, and P ± r, are within one rounding of the exact value)."""
    X = st.P[np.ix_(rows, R)]
    X = safe_floats(X)  # (exact, mpmath: rounded to nearest, beyond range ±inf)
    if st.rad is None:
        r, spread = np.zeros(X.shape), np.zeros(len(rows))
    else:
        r, rq = st.rad[np.ix_(rows, R)], st.rad[np.ix_(rows, Q)].max(axis=1, initial=0.0)
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            spread = np.where(rq > 0, 2.0 ** np.ceil(np.log2(rq)), 0.0)
        spread[np.isnan(rq)] = np.inf
    with np.errstate(over="ignore", invalid="ignore"):
        lo, hi = np.nextafter(X - r, -np.inf), np.nextafter(X + r, np.inf)
    wild = ~(np.isfinite(X) & np.isfinite(r) & np.isfinite(lo) & np.isfinite(hi)).all(axis=1)
    lo[wild], hi[wild] = -np.inf, np.inf  # unbounded: the class is never quiet
    labels = np.column_stack([rk.gid[rows], rk.weight[rows], spread, X != 0])
    return labels, lo, hi
