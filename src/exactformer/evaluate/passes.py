"""Forward passes in three arithmetics: exact (rational), float64 and mpmath (any precision).

The exact pass computes with gmpy2's ``mpq`` (GMP rationals, several times faster than
``fractions.Fraction`` in the hot loops); its inputs and outputs are ``Fraction``s, converted at
entry and exit, so users only ever see Fractions (see docs/numerics.md).

The pass keeps each sequence as a *multiset* of points (rows with counts): two tokens of one
sequence at the same point stay together forever, because FF acts per token and SA depends only
on the token and the multiset of its sequence. Equal points are merged after every attention
layer, so after the collapse a sequence costs m_j rows, not n_j.

FF layers whose hidden units all read one direction f, and that add exactly zero outside an
interval of f·x (every gadget of the construction), are *ridge windows*: they are applied only
to the rows inside the interval, found through a sorted index of f·x. This keeps a pass over
L blocks and T tokens near O(T + L log T) for constructed models; any other layer is dense.
"""

from __future__ import annotations

import bisect
import gc
import math
import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from fractions import Fraction

import mpmath
import numpy as np
from gmpy2 import mpq
from tqdm import tqdm

from ..model import FF, SA, Transformer, ValueMatrix
from ..numbers import mix64, safe_float, safe_floats, sparse_dot, to_fraction, to_fraction_array
from . import enclosure, rank_one, runs

ARITHMETICS = ("exact", "float", "mp")


# ------------------------------------------------------------------------------ arithmetic
@dataclass
class Arithmetic:
    """How numbers are represented: 'exact' (gmpy2 mpq inside a pass, Fraction outside),
    'float' (float64), 'mp' (mpmath)."""

    kind: str = "float"
    dps: int = 50

    def __post_init__(self):
        if self.kind not in ARITHMETICS:
            raise ValueError(f"arithmetic must be one of {ARITHMETICS}, got {self.kind!r}")

    @property
    def is_object(self) -> bool:
        return self.kind != "float"

    def scalar(self, v):
        if isinstance(v, np.integer):
            v = int(v)
        if self.kind == "float":
            return float(v)
        if self.kind == "exact":
            if isinstance(v, mpq):
                return v
            if isinstance(v, (int, Fraction)) or (isinstance(v, float) and math.isfinite(v)):
                return mpq(v)  # exact, also for a float
            return mpq(to_fraction(v))
        if isinstance(v, Fraction):
            return mpmath.mpf(v.numerator) / v.denominator
        return mpmath.mpf(v)

    def array(self, a) -> np.ndarray:
        a = np.asarray(a)
        if self.kind == "float":
            return a.astype(float)
        out = np.empty(a.shape, dtype=object)
        direct = self.kind == "exact" and (a.dtype.kind in "iu" or (
            a.dtype.kind == "f" and bool(np.isfinite(a).all())))  # mpq(float) is exact
        if direct:  # one mpq per distinct value (counts, pixel values), shared: mpq is immutable
            distinct, inverse = np.unique(a, return_inverse=True)
            table = np.empty(len(distinct), dtype=object)
            table[:] = list(map(mpq, distinct.tolist()))  # Python scalars convert faster
            out[...] = table[inverse.reshape(a.shape)]
            return out
        out.flat[:] = list(map(self.scalar, a.ravel().tolist()))
        return out

    def public(self, a: np.ndarray) -> np.ndarray:
        """``a`` as users see it: the exact pass's mpq values become Fractions; float and mp
        arrays are returned unchanged."""
        if self.kind != "exact":
            return a
        out = np.empty(a.shape, dtype=object)
        out.flat[:] = [Fraction(int(v.numerator), int(v.denominator))
                       for v in a.ravel().tolist()]
        return out

    def exp(self, a: np.ndarray) -> np.ndarray:
        if self.kind == "float":
            return np.exp(a)
        if self.kind == "exact":
            raise ValueError("softmax attention cannot be evaluated in exact rational arithmetic; "
                             "use arithmetic='mp' (high precision) or 'float'")
        return np.frompyfunc(mpmath.exp, 1, 1)(a)


_EXACT = Arithmetic("exact")


def relu(z: np.ndarray) -> np.ndarray:
    return np.where((z > 0).astype(bool), z, 0 * z)


# ------------------------------------------------------------------------------ statistics
@dataclass
class PassStats:
    """Margins seen during a pass (None where the model has no such layer)."""

    hardmax_margin: float | None = None  # smallest best-minus-second score gap / score scale
    hardmax_ties: int = 0  # queries whose best score is shared by two distinct points
    hat_clearance: float | None = None  # smallest distance of an untouched token to a window
    enabled: bool = field(default=True, repr=False, compare=False)  # False: record nothing

    def _min(self, name: str, v) -> None:
        v = float(v)
        cur = getattr(self, name)
        setattr(self, name, v if cur is None else min(cur, v))

    def merge(self, other: PassStats) -> None:
        """Fold in the statistics of a pass over other sequences (a chunk of a parallel pass):
        counts add up, margins take the smaller value, so the result equals one serial pass."""
        for f in fields(self):
            if f.name == "enabled":
                continue
            v = getattr(other, f.name)
            if isinstance(v, int):
                setattr(self, f.name, getattr(self, f.name) + v)
            elif v is not None:
                self._min(f.name, v)


# ------------------------------------------------------------------------------ ridge FFs
@dataclass
class Ridge:
    """An FF with η = 1 that adds exactly zero unless lo < f·x < hi."""

    f: np.ndarray
    lo: object
    hi: object
    f_norm: float | None = field(default=None, compare=False, repr=False)

    @property
    def norm(self) -> float:
        """‖f‖ in float64 (a window's clearance is reported relative to it); batch-built
        windows get it with the batch."""
        if self.f_norm is None:
            self.f_norm = float(np.linalg.norm(safe_floats(np.asarray(self.f))))
        return self.f_norm


def ridge_window(ff: FF) -> Ridge | None:
    """Detect whether ``ff`` is a ridge window, deciding exactly on the exact values of its
    parameters (floats included, so float models qualify too).

    Every gadget repeats one row f in U (scale k = 1); other rank-one U are decided with
    Fractions. The layer must add exactly zero beyond its outermost breakpoints.
    """
    if ff.eta != 1:
        return None
    U, b, W = ff.U, ff.b, ff.W
    if any(a.dtype == float and not np.isfinite(a).all() for a in (U, b, W)):
        return None  # inf or nan: no exact window; the layer is applied densely
    found = direction_scales(U)
    if found is None:
        return None
    f, ks = found
    for i, k in enumerate(ks):
        if k == 0 and b[i] > 0 and any(v != 0 for v in W[:, i]):
            return None  # a constant shift everywhere
    bps = _breakpoints(b, ks)
    for sign in (1, -1):  # beyond the last breakpoint on each side the sum must vanish
        act = [i for i in range(len(ks)) if ks[i] * sign > 0]
        if not act:
            continue
        w = W[:, act[0]]
        signs = [1 if np.array_equal(W[:, i], w) else -1 if np.array_equal(W[:, i], -w)
                 else 0 for i in act]
        if all(signs):  # columns ±w (every hat): two scalar conditions
            rows = [(signs, [ks[i] for i in act]), (signs, [b[i] for i in act])]
        else:
            rows = [(list(W[r, act]), list(vals)) for r in range(W.shape[0])
                    if any(v != 0 for v in W[r, act])
                    for vals in ([ks[i] for i in act], [b[i] for i in act])]
        if not all(_zero_dot(x, y) for x, y in rows):
            return None
    return Ridge(f if f.dtype == float else to_fraction_array(f), min(bps), max(bps))


def _breakpoints(b: np.ndarray, ks: list) -> list:
    """The units' breakpoints −b_i/k_i (k_i ≠ 0), exactly: float biases with k = 1 are their
    own exact negations, anything else goes through Fractions."""
    if b.dtype == float and all(k in (0, 1) for k in ks):
        return [-v for v, k in zip(b.tolist(), ks, strict=True) if k]
    return [-to_fraction(b[i]) / to_fraction(ks[i]) for i in range(len(ks)) if ks[i] != 0]


def direction_scales(U: np.ndarray) -> tuple[np.ndarray, list] | None:
    """(f, k) with every row U_i = k_i·f exactly, f the first nonzero row, or None when the
    hidden units do not all read one direction (or all are zero): the one test behind the ridge
    windows here and the profile form of the torch export (docs/numerics.md). Every gadget
    repeats f itself (k = 1, decided on the numbers as they are); other rows are decided in
    Fractions."""
    nz = [i for i in range(U.shape[0]) if any(v != 0 for v in U[i])]
    if not nz:
        return None
    f = U[nz[0]]
    if U.dtype != object and (U[nz] == f).all() or \
            all(i not in nz or np.array_equal(U[i], f) for i in range(U.shape[0])):
        return f, [1 if i in nz else 0 for i in range(U.shape[0])]
    ks = _row_scales(to_fraction_array(U), nz[0])
    return None if ks is None else (f, ks)


def _row_scales(U: np.ndarray, first: int) -> list | None:
    """k_i with U[i] = k_i·U[first] exactly, or None if U is not rank one that way."""
    f = U[first]
    j0 = next(j for j, v in enumerate(f) if v != 0)
    ks = []
    for i in range(U.shape[0]):
        k = U[i, j0] / f[j0]
        if any(U[i, j] != k * f[j] for j in range(U.shape[1])):
            return None
        ks.append(k)
    return ks


def _zero_dot(xs: list, ys: list) -> bool:
    """Σ x·y == 0 exactly. Floats are binary fractions, so their products are summed as
    integers over a common power-of-two denominator; anything else goes through Fraction."""
    if all(isinstance(v, (float, np.floating, int)) for v in xs + ys):
        terms = []
        for x, y in zip(xs, ys, strict=True):
            (a, p), (c, q) = float(x).as_integer_ratio(), float(y).as_integer_ratio()
            terms.append((a * c, p * q))
        den = max((q for _, q in terms), default=1)
        return sum(n * (den // q) for n, q in terms) == 0
    return sum((to_fraction(x) * to_fraction(y) for x, y in zip(xs, ys, strict=True)),
               Fraction(0)) == 0


def _float_image(a: np.ndarray) -> np.ndarray | None:
    """float64 values of ``a``; None for an object array with a value beyond float range.
    Each exact value has a single image and the conversion is monotone (rounding or
    truncation), so floats can pre-sort and pre-group exact values."""
    try:
        return a.astype(float)
    except OverflowError:
        return None


def _max_abs(x: np.ndarray) -> float:
    """The largest |coordinate| of ``x`` as a float (inf beyond float range)."""
    f = _float_image(x)
    return float(np.abs(f).max(initial=0.0)) if f is not None else math.inf


def _stable_argsort(t: np.ndarray) -> np.ndarray:
    """``np.argsort(t, kind="stable")`` for exact or mpmath values, sorting by the values' float
    images first and comparing exactly only within runs of equal floats."""
    tf = _float_image(t) if t.dtype == object else t
    if tf is None or t.dtype != object:
        return np.argsort(t, kind="stable")
    order = np.argsort(tf, kind="stable")
    sf = tf[order]
    starts = np.flatnonzero(np.concatenate([[True], sf[1:] != sf[:-1], [True]]))
    for s, e in zip(starts[:-1].tolist(), starts[1:].tolist(), strict=True):
        if e - s > 1:
            order[s:e] = sorted(order[s:e].tolist(), key=t.__getitem__)
    return order


class _SortedProjection:
    """Rows' values t = P·f kept in a sorted index; moved rows wait in a dirty set (checked
    one by one by every query) until there are enough of them to be merged back in."""

    def __init__(self, t: np.ndarray):
        self.t = t
        self.order = _stable_argsort(t)
        self._sorted()

    def _sorted(self):
        self.sorted_t = self.t[self.order]
        self.dirty = np.zeros(0, dtype=np.int64)
        self.is_dirty = np.zeros(len(self.t), dtype=bool)

    def _rebuild(self):
        """Fold the moved rows in: the others keep their sorted order, the moved ones are
        sorted alone and merged in (linear in the rows, not a sort of them all)."""
        moved = self.dirty[_stable_argsort(self.t[self.dirty])]
        keep = self.order[~self.is_dirty[self.order]]
        self.order = np.insert(keep, np.searchsorted(self.t[keep], self.t[moved]), moved)
        self._sorted()

    def rows_in(self, lo, hi) -> tuple[np.ndarray, object]:
        """Rows with lo < t < hi, and the smallest distance from a row outside to [lo, hi]."""
        i0 = int(np.searchsorted(self.sorted_t, lo, side="right"))
        i1 = int(np.searchsorted(self.sorted_t, hi, side="left"))
        rows = [np.zeros(0, dtype=np.int64)]
        if i0 < i1:  # (most windows hold no row: skip the work on empty arrays)
            cand = self.order[i0:i1]
            cand = cand[~self.is_dirty[cand]]
            rows.append(cand[(self.t[cand] > lo).astype(bool) & (self.t[cand] < hi).astype(bool)])
        gaps = []
        j = i0 - 1
        while j >= 0 and self.is_dirty[self.order[j]]:
            j -= 1
        if j >= 0:
            gaps.append(lo - self.sorted_t[j])
        j = i1
        while j < len(self.order) and self.is_dirty[self.order[j]]:
            j += 1
        if j < len(self.order):
            gaps.append(self.sorted_t[j] - hi)
        if len(self.dirty):
            td = self.t[self.dirty]
            inside = (td > lo).astype(bool) & (td < hi).astype(bool)
            rows.append(self.dirty[inside])
            gaps += _gaps(td[~inside], lo, hi)
        return np.concatenate(rows).astype(int), (min(gaps) if gaps else None)

    def refresh(self) -> None:
        """Fold the moved rows back into the sorted order (a rebuild) if there are any."""
        if len(self.dirty):
            self._rebuild()

    def update(self, rows: np.ndarray, t_new: np.ndarray) -> None:
        self.t[rows] = t_new
        rows = np.unique(rows)
        self.dirty = np.concatenate([self.dirty, rows[~self.is_dirty[rows]]])
        self.is_dirty[rows] = True
        if len(self.dirty) > 64 + len(self.t) // 64:
            self._rebuild()


def _gaps(t: np.ndarray, lo, hi) -> list:
    """The smallest distance from the values t (all outside (lo, hi)) to [lo, hi], as a
    one-element list (empty when there is none; float nan values are not distances)."""
    if t.dtype == object:
        return [min(lo - v if v <= lo else v - hi for v in t.tolist())] if len(t) else []
    with np.errstate(invalid="ignore"):
        g = np.where(t <= lo, lo - t, t - hi)
    g = g[~np.isnan(g)]
    return [g.min()] if len(g) else []


# ------------------------------------------------------------------------------ state
class _State:
    """Rows of points per sequence (equal points merged at compactions), contiguous by
    sequence. A float64 pass may carry ``rad``: per coordinate, a bound on the distance of the
    exact evaluation from the float one (docs/numerics.md#enclosures)."""

    def __init__(self, inputs: list[np.ndarray], ar: Arithmetic, rad: list | None = None):
        self.ar = ar
        self.N = len(inputs)
        self.lengths = [x.shape[0] for x in inputs]
        P = np.concatenate(inputs, axis=0)
        self.P = P if P.dtype == float and ar.kind == "float" else ar.array(P)
        self.rad = None if rad is None else \
            np.zeros(P.shape) if not len(rad) else np.concatenate(rad, axis=0).astype(float)
        self.seq = np.repeat(np.arange(self.N), self.lengths)
        self.cnt = np.ones(len(self.seq), dtype=np.int64)
        self.owner = np.arange(len(self.seq))  # original token -> current row
        # direction (as a tuple) -> (direction, sorted index of P·direction)
        self.projections: dict[tuple, tuple[np.ndarray, _SortedProjection]] = {}
        self.extent = None  # (largest radius, largest |coordinate|) over the rows, or None
        self.forms: dict = {}  # id of a ridge part -> its enclosure.gadget_form
        self.give_up = math.inf  # radius beyond which a row is given up (set to inf)
        self._by_sequence = None  # (segments(), weights()) until the next compaction
        self.heads = rank_one.HeadCache()
        # change stamps: every change of a row's point or radius, and every attention write
        # of a column, gets a new epoch (what rank_one.HeadCache reuses results by)
        self.epoch = 0
        self.row_epoch = np.zeros(len(self.seq), dtype=np.int64)
        self.col_epoch = np.zeros(self.P.shape[1], dtype=np.int64)

    def changed_everything(self):
        self.projections.clear()
        self.heads.clear()
        self.extent = None

    def touch(self, rows) -> None:
        """Stamp ``rows`` (indices or a mask) as changed in point or radius."""
        self.epoch += 1
        self.row_epoch[rows] = self.epoch

    def _give_up(self, lost) -> None:
        """Rows ``lost`` (a mask) can no longer be certified: their radius becomes inf."""
        if lost.any():
            self.rad[lost] = np.inf
            self.touch(lost)

    def changed_columns(self, cols: np.ndarray) -> None:
        """Only the columns ``cols`` of every row changed: sorted indices along directions
        that ignore them stay valid."""
        self.projections = {k: v for k, v in self.projections.items()
                            if not any(v[0][c] != 0 for c in cols.tolist())}
        self.epoch += 1
        self.col_epoch[cols] = self.epoch
        if self.rad is None:
            return
        lost = np.zeros(len(self.rad), dtype=bool)
        for c in cols.tolist():  # column views: no gathered copies
            lost |= self.rad[:, c] > self.give_up
        self._give_up(lost)
        if self.extent is not None:
            r, m = _extent(self.P, self.rad, cols)
            self.extent = (max(r, self.extent[0]), max(m, self.extent[1]))

    def reach(self, f) -> float:
        """A bound on |f·x − f·m| for every row m and exact point x within its radius,
        including the rounding of the float f·m (widens a ridge window's row search). Rows
        whose radius is not finite are left out: their sequences are undecided whatever
        happens, and FF layers act on each row alone."""
        if self.extent is None:
            self._give_up((self.rad > self.give_up).any(axis=1))
            self.extent = _extent(self.P, self.rad)
        r, m = self.extent
        af = float(np.abs(f).sum())
        return enclosure.up(af * r + enclosure.rounding(af * m, len(f)), len(f) + 2)

    def projection(self, f: np.ndarray) -> _SortedProjection:
        key = tuple(f.tolist())
        if key not in self.projections:
            t = self.P @ f
            self._lose_unsorted(np.arange(len(t)), t)
            self.projections[key] = (f, _SortedProjection(t))
        return self.projections[key][1]

    def _lose_unsorted(self, rows: np.ndarray, t: np.ndarray) -> None:
        """A row whose float f·x is not finite has no place in a sorted index, so no window
        would ever look at it: in a tracking pass its radius becomes inf."""
        if self.rad is not None:
            bad = ~np.isfinite(t)
            if bad.any():
                self.rad[rows[bad]] = np.inf
                self.touch(rows[bad])

    def moved(self, rows: np.ndarray) -> None:
        """Rows changed by a ridge FF: refresh their values in every sorted index."""
        for f, sp in self.projections.values():
            t = self.P[rows] @ f
            self._lose_unsorted(rows, t)
            sp.update(rows, t)
        self.grew(rows)

    def grew(self, rows: np.ndarray) -> None:
        """Rows whose value or radius changed: a radius beyond ``give_up`` becomes inf (such
        a row can no longer be certified, and leaving it in would widen every window's row
        search), and the extent behind :meth:`reach` takes in the rest."""
        self.touch(rows)
        if self.rad is None or not len(rows):
            return
        lost = (self.rad[rows] > self.give_up).any(axis=1)
        if lost.any():
            self.rad[rows[lost]] = np.inf
        if self.extent is not None:
            r, m = _extent(self.P[rows], self.rad[rows])
            self.extent = (max(r, self.extent[0]), max(m, self.extent[1]))

    def compact(self):
        """Merge equal points of the same sequence; rows end up grouped by sequence."""
        if self.ar.kind == "float":
            first, inv = _float_row_groups(
                self.seq, [self.P] if self.rad is None else [self.P, self.rad])
        else:
            first, inv = _object_row_groups(self.seq, self.P)
        self.cnt = np.bincount(inv, weights=self.cnt, minlength=len(first)).astype(np.int64)
        self.P, self.seq = _columns(self.P, first), self.seq[first]
        if self.rad is not None:
            self.rad = _columns(self.rad, first)
        self.owner = inv[self.owner]
        self._by_sequence = None
        self.row_epoch = np.zeros(len(first), dtype=np.int64)
        self.changed_everything()

    def _grouping(self):
        if self._by_sequence is None:
            first = np.concatenate([[True], self.seq[1:] != self.seq[:-1]])
            self._by_sequence = (rank_one.Segments(np.cumsum(first) - 1, np.flatnonzero(first)),
                                 self.ar.array(self.cnt))
        return self._by_sequence

    def segment_index(self) -> rank_one.Segments:
        """Each row's segment number and every segment's first row (rows are contiguous by
        sequence: inputs are concatenated in order and compaction keeps that order)."""
        return self._grouping()[0]

    def weights(self) -> np.ndarray:
        """The rows' multiplicities in the pass's arithmetic."""
        return self._grouping()[1]

    def segments(self) -> list[tuple[int, int]]:
        """Each sequence's rows as a range (start, end)."""
        starts = self.segment_index().starts
        return list(zip(starts.tolist(), [*starts[1:].tolist(), len(self.seq)], strict=True))

    def outputs(self) -> list[np.ndarray]:
        """Every original token's current point, per sequence, in the public representation
        (converted once per distinct row, then shared by its tokens)."""
        full = self.ar.public(self.P)[self.owner]
        return np.split(full, np.cumsum(self.lengths)[:-1])

    def radii(self) -> list[np.ndarray]:
        """Every original token's current radius, per sequence (a tracking pass only)."""
        return np.split(self.rad[self.owner], np.cumsum(self.lengths)[:-1])


def _columns(a: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The ``rows`` of ``a`` stored column by column (one allocation): attention layers read
    and write single coordinates of every row, which a row-major array spreads over all its
    memory."""
    if a.dtype == object:
        return a[rows]
    out = np.empty((len(rows), a.shape[1]), dtype=a.dtype, order="F")
    for c in range(a.shape[1]):
        np.take(a[:, c], rows, out=out[:, c])
    return out


def _extent(P: np.ndarray, rad: np.ndarray, cols: np.ndarray | None = None
            ) -> tuple[float, float]:
    """Largest radius and largest |coordinate| over the rows with finite values, in the
    columns ``cols`` (default all). Read column by column (views, no gathered copies) while
    every value is finite, which is the usual case."""
    tops = [float(a.max(initial=0.0)) for c in range(P.shape[1]) if cols is None or c in cols
            for a in (rad[:, c], np.abs(P[:, c]))]
    if all(math.isfinite(v) for v in tops):  # (a nan shows as nan)
        return max(tops[::2], default=0.0), max(tops[1::2], default=0.0)
    if cols is not None:
        P, rad = P[:, cols], rad[:, cols]
    ok = np.isfinite(rad).all(axis=1) & np.isfinite(P).all(axis=1)
    return float(rad[ok].max(initial=0.0)), float(np.abs(P[ok]).max(initial=0.0))


def _float_row_groups(seq: np.ndarray, arrays: list[np.ndarray]
                      ) -> tuple[np.ndarray, np.ndarray]:
    """Compaction groups of a float64 state (the columns of ``arrays`` side by side):
    ``inv[r]`` is the group of row r and ``first[g]`` a row of group g; groups are in
    sequence order. Rows are sorted by (sequence, a 64-bit hash of their bits) and a row joins
    the row before it when sequence and every bit agree (adding 0.0 turns −0.0 into 0.0; NaN
    rows merge only with bitwise equal ones). Two equal rows that a hash collision keeps
    apart stay two rows, which costs time only: rows carry their multiplicities. Column by
    column, so no copy of all rows is made (a sort of byte keys held three)."""
    cols = [a[:, c] for a in arrays for c in range(a.shape[1])]
    h = np.zeros(len(seq), dtype=np.uint64)
    for c, col in enumerate(cols):
        h ^= mix64((col + 0.0).view(np.uint64) + np.uint64(c + 1))
    order = np.lexsort((h, seq))
    same = (seq[order][1:] == seq[order][:-1]) & (h[order][1:] == h[order][:-1])
    for col in cols:
        bits = (col + 0.0).view(np.uint64)[order]
        same &= bits[1:] == bits[:-1]
    starts = np.concatenate([[True], ~same])
    inv = np.empty(len(seq), dtype=np.int64)
    inv[order] = np.cumsum(starts) - 1
    return order[starts], inv


def _float_row_keys(seq: np.ndarray, P: np.ndarray) -> np.ndarray:
    """One fixed-size byte string per row, equal exactly when (sequence, point) are: sorting
    these is twice as fast as ``np.unique(axis=0)``. Adding 0.0 turns −0.0 into 0.0, so the
    bytes compare like the numbers (NaN rows merge only with bitwise equal NaN rows)."""
    key = np.ascontiguousarray(np.column_stack([seq.astype(float), P + 0.0]))
    return key.view(np.dtype((np.void, key.shape[1] * key.itemsize))).ravel()


def _object_row_groups(seq: np.ndarray, P: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Compaction groups of an exact or mpmath state: ``inv[r]`` is the group of row r, groups
    numbered by first sight in sequence order (so rows stay contiguous by sequence), and
    ``first[g]`` is the row first seen in group g.

    Rows are grouped by (sequence, float image) with one sort of byte keys, and the grouping
    is kept when every row equals its group's first row exactly (float images are a function
    of the exact values, so different groups are different points). When two different points
    share a float image, the rows are keyed exactly instead (:func:`_row_keys`)."""
    order = np.argsort(seq, kind="stable")
    Pf = _float_image(P)
    label = None
    if Pf is not None:
        _, rep, label = np.unique(_float_row_keys(seq, Pf), return_index=True,
                                  return_inverse=True)
        label = label.reshape(-1)
        if not np.asarray(P == P[rep[label]], dtype=bool).all():
            label = None
    if label is None:
        keys = _row_keys(seq, P)
        index: dict = {}
        label = np.fromiter((index.setdefault(k, len(index)) for k in keys), dtype=np.int64,
                            count=len(keys))
    _, seen, group = np.unique(label[order], return_index=True, return_inverse=True)
    number = np.empty(len(seen), dtype=np.int64)
    number[np.argsort(seen)] = np.arange(len(seen))
    inv = np.empty(len(order), dtype=np.int64)
    inv[order] = number[group.reshape(-1)]
    return order[np.sort(seen)], inv


def _row_keys(seq: np.ndarray, P: np.ndarray) -> list:
    """A hashable key per row of an object array, equal exactly when (sequence, point) are.

    Hashing big rationals is the slow part of compaction, so a row whose (sequence, float
    image) no other row shares gets that image's number (an int) as its key; only rows that
    share a float image are keyed by their exact values (a tuple, never equal to an int).
    """
    Pf = _float_image(P)
    if Pf is None:
        return list(zip(seq.tolist(), *P.T.tolist(), strict=True))
    _, fid, count = np.unique(np.column_stack([seq, Pf]), axis=0, return_inverse=True,
                              return_counts=True)
    fid = fid.reshape(-1)
    keys: list = fid.tolist()
    for r in np.flatnonzero(count[fid] > 1).tolist():
        keys[r] = (int(seq[r]), *P[r].tolist())
    return keys


# ------------------------------------------------------------------------------ layers
DENSE_ROWS = 2 ** 16  # rows per slice of a dense FF in an enclosure pass
def _apply_ff(st: _State, ff: FF, ridges: list[tuple[Ridge, FF]] | None, stats: PassStats,
              scale: float):
    """Apply an FF: each ridge window only to the rows inside it (every window's change is
    computed from the layer's input, then the changes are added), anything else densely."""
    if ridges is not None:
        moves, spread = [], []
        for ridge, part in ridges:
            sp = st.projection(ridge.f)
            if st.rad is not None:
                change, terms, gap = _ridge_spread(st, sp, ridge, part)
                if gap is not None and stats.enabled:
                    stats._min("hat_clearance", gap / (scale * ridge.norm))
                rows = terms[0]
                spread.append(terms)
                moves.append((rows, change))
                continue
            rows, gap = sp.rows_in(ridge.lo, ridge.hi)
            if gap is not None and stats.enabled:
                stats._min("hat_clearance", safe_float(gap) / (scale * ridge.norm))
            if len(rows):
                X, part = st.P[rows], in_arithmetic(st.ar, part)
                moves.append((rows, relu(X @ part.U.T + part.b) @ part.W.T))
        if spread:
            st.rad = enclosure.ridge_radius(st.rad, spread)
            st.grew(np.concatenate([np.concatenate([s[0], s[3]]) for s in spread]))
        for rows, change in moves:
            st.P[rows] = st.P[rows] + change
            st.moved(rows)
        return
    if st.rad is not None:  # each row alone: slices written back in place stay small
        for s in range(0, len(st.P), DENSE_ROWS):
            rows = slice(s, s + DENSE_ROWS)
            st.P[rows], st.rad[rows] = enclosure.ff_dense(st.P[rows], st.rad[rows], ff.eta,
                                                          ff.U, ff.b, ff.W)
    elif st.ar.kind == "exact":
        st.P = _exact_dense_ff(st.P, in_arithmetic(st.ar, ff))
    else:
        ff = in_arithmetic(st.ar, ff)
        st.P = st.P * ff.eta + relu(st.P @ ff.U.T + ff.b) @ ff.W.T
    st.changed_everything()
    if ff.eta == 0:
        st.compact()


def _exact_dense_ff(P: np.ndarray, ff: FF) -> np.ndarray:
    """η·x + W·relu(U·x + b) on every row of an exact pass, with far fewer rational operations
    than the matrix products: each distinct row of U is dotted once and over its nonzero
    entries only (the first leader layer's units all read one row), each output coordinate
    sums only the units with a nonzero weight, and η·x is left out when η = 0."""
    dots: dict = {}
    H = np.empty((len(P), ff.U.shape[0]), dtype=object)
    for i, u in enumerate(ff.U):
        key = tuple(u.tolist())
        if key not in dots:
            dots[key] = sparse_dot(P, u)
        H[:, i] = relu(dots[key] + ff.b[i])
    out = np.empty_like(P)
    for k in range(P.shape[1]):
        move = sparse_dot(H, ff.W[k])
        out[:, k] = move if ff.eta == 0 else P[:, k] * ff.eta + move
    return out


def _ridge_spread(st: _State, sp: _SortedProjection, ridge: Ridge, part: FF):
    """For a tracking pass: the change of the rows inside the window by their float f·x,
    the radius terms of every row whose box may reach the window (also those within the
    rows' reach of its ends; see :func:`enclosure.ridge_radius`), and the distance from the
    window to the nearest row outside it (the hat clearance)."""
    w = float(enclosure.window_pad(st.reach(ridge.f), ridge.lo, ridge.hi))
    near, gap = sp.rows_in(enclosure.lower(ridge.lo, w), enclosure.upper(ridge.hi, w))
    t = sp.t[near]
    gaps = np.concatenate([[] if gap is None else [gap + w], ridge.lo - t[t <= ridge.lo],
                           t[t >= ridge.hi] - ridge.hi])
    gap = float(gaps.min()) if len(gaps) else None
    if id(part) not in st.forms:  # the job holds its parts for the whole pass
        st.forms[id(part)] = enclosure.gadget_form(part.U, part.b, part.W)
    form = st.forms[id(part)]
    X, r = st.P[near], st.rad[near]
    if form is not None and np.array_equal(form[0], ridge.f):  # lo, hi are along ridge.f
        f, sig, w_, om = form
        n = len(near)
        g = enclosure.gadget_rows(X, r, f, np.tile(sig, (n, 1)), np.tile(part.b, (n, 1)),
                                  np.tile(om, (n, 1)), np.tile(w_, (n, 1)),
                                  np.full(n, ridge.lo), np.full(n, ridge.hi))
        inside = g.inside
        return g.change[inside], (near[inside], g.whole[inside], g.alone[inside],
                                  near[~inside], g.alone[~inside]), gap
    inside = (t > ridge.lo) & (t < ridge.hi)
    rows, out = near[inside], near[~inside]
    change, whole, alone = enclosure.ff_change(X[inside], r[inside], part.U, part.b, part.W)
    zone = enclosure.zone_change(X[~inside], r[~inside], part.U, part.b, part.W, ridge.f,
                                 ridge.lo, ridge.hi)
    return change, (rows, whole, alone, out, zone), gap


def _apply_sa(st: _State, sa: SA, attention: str, tau, stats: PassStats):
    """ρ·x_i plus, for every head, V_h applied to the head's own average (docs/heads.md).
    Every head reads the layer's input. A head with V = p·qᵀ (β = 0) averages only the scalar
    x·q and changes only the columns where p ≠ 0, so sorted indices along other directions
    survive the layer.

    Equal points are merged only when ρ = 0 (each token replaced by averages, as in the
    collapse): with ρ ≠ 0 distinct points almost never meet, and an unmerged pair of equal
    rows only costs time, never changes a result (they carry their multiplicities)."""
    dots: dict = {}
    terms = [t for head in sa.heads
             if (t := _head_term(st, head, attention, tau, stats, dots)) is not None]
    _write_terms(st, sa.rho, terms)
    if sa.rho == 0:
        st.compact()


def _write_terms(st: _State, rho, terms: list[_Term]) -> None:
    """The rows become ρ·x plus the heads' terms, one column at a time and in place (a column
    of the column-major rows is one contiguous array, and no row-sized temporary is made).
    A tracking pass grows each radius by |ρ|·r, the terms' radii and the rounding of the
    product and the sums. With ρ = 1 the product is exact and only the written columns
    change."""
    k = len(terms) + 2
    written = sorted({c for t in terms for c in t.cols})
    cols = written if rho == 1 else list(range(st.P.shape[1]))
    for c in cols:
        parts = [t.column(c) for t in terms if c in t.cols]
        x = st.P[:, c]
        new = x if rho == 1 else x * rho
        if st.rad is not None:
            size = np.abs(new)
            r = st.rad[:, c]
            if rho != 1:
                r = abs(rho) * r + enclosure.rounding(size, 1)
            for v, vr in parts:
                size += np.abs(v)
                r += vr
            st.rad[:, c] = enclosure.up(r + enclosure.rounding(size, k), 4 * k)
        for v, _ in parts:
            new += v
        if rho != 1:
            x[:] = new
    if cols:
        st.changed_columns(np.asarray(cols))


@dataclass(frozen=True)
class _Term:
    """What one head adds to the rows, kept as the head's average so that the values are
    formed column by column: column c gains p_c·avg (β = 0: avg is the average of x·q), or
    β·avg_c + p_c·(q·avg) (avg is the average point). ``avg_rad``, ``s_rad``: radii of avg
    and q·avg in a tracking pass, else None."""

    V: ValueMatrix
    cols: frozenset
    avg: np.ndarray
    avg_rad: np.ndarray | None
    s: np.ndarray | None = None
    s_rad: np.ndarray | None = None

    def column(self, c: int) -> tuple[np.ndarray, np.ndarray | None]:
        """The term's values in column c and, in a tracking pass, their radii."""
        p, beta = self.V.p[c], self.V.beta
        if beta == 0:
            val = self.avg[:, 0] * p
            return val, None if self.avg_rad is None else self.avg_rad[:, 0] * float(abs(p))
        val = self.avg[:, c] * beta + self.s * p
        if self.avg_rad is None:
            return val, None
        return val, abs(beta) * self.avg_rad[:, c] + self.s_rad * abs(p)


def _head_term(st: _State, head, attention: str, tau, stats: PassStats, dots: dict
               ) -> _Term | None:
    """What one head adds (its average, computed from the layer's input); None when V = 0.
    ``dots`` holds the layer's products x·v already computed (heads often read the same
    vector)."""
    V = head.V
    if V.beta == 0:
        cols = frozenset(k for k, v in enumerate(V.p) if v != 0)
        if not cols:
            return None
        return _Term(V, cols, *_head_average(st, head.A, V.q, attention, tau, stats, dots))
    avg, avg_rad = _head_average(st, head.A, None, attention, tau, stats, dots)
    s_rad = None if avg_rad is None else enclosure.dot_radius(avg, avg_rad, V.q)
    return _Term(V, frozenset(range(st.P.shape[1])), avg, avg_rad, sparse_dot(avg, V.q),
                 s_rad)


def _dot(st: _State, v, dots: dict):
    """x·v for every row and, in a tracking pass, its radius (else None), computed once per
    layer input and vector."""
    key = tuple(v.tolist())
    if key not in dots:
        dots[key] = (sparse_dot(st.P, v),
                     None if st.rad is None else enclosure.dot_radius(st.P, st.rad, v))
    return dots[key]


def _head_average(st: _State, A, q, attention: str, tau, stats: PassStats, dots: dict):
    """Every row's attention average Σ_l π_il C_l of the carrier C (the column x·q per point,
    or the points themselves when q is None) under one head's scores ⟨A x_i, x_l⟩, and, in
    a tracking pass, the radius of that average (the hull of every average the enclosed
    scores allow)."""
    tracked = st.rad is not None
    if attention == "hardmax" and A.alpha == 0:
        res = st.heads.result(st, A.c, A.a, q, stats.enabled)
        if stats.enabled:
            stats.hardmax_ties += int(res.ties.sum())
            if np.isfinite(res.margin).any():
                stats._min("hardmax_margin", float(res.margin.min()))
        return res.avg, res.rad
    ar, P = st.ar, st.P
    qa, q_rad = _dot(st, A.c, dots)  # c·x_i
    ka, k_rad = _dot(st, A.a, dots)  # a·x_l
    if q is None:
        C, C_rad = P, st.rad
    else:
        C, C_rad = _dot(st, q, dots)
        C, C_rad = C[:, None], None if C_rad is None else C_rad[:, None]
    weights = st.weights()  # multiplicities, in the pass's arithmetic
    out = np.empty(C.shape, dtype=C.dtype)
    out_rad = np.empty(C.shape) if tracked else None
    if attention == "hardmax" and not ar.is_object:
        for rows in _batches(st.segment_index(), C.shape[1]):
            out[rows] = _float_hardmax_rows(P[rows], qa[rows], ka[rows], A.alpha,
                                            weights[rows], stats, C[rows])
            if tracked:
                out_rad[rows] = enclosure.head_radius(
                    P[rows], st.rad[rows], qa[rows], q_rad[rows], ka[rows], k_rad[rows],
                    A.alpha, C[rows], C_rad[rows], out[rows])
        return out, out_rad
    for s, e in st.segments():
        X, w, Cs = P[s:e], weights[s:e], C[s:e]
        if attention == "hardmax":
            out[s:e] = _hardmax_rows(X, qa[s:e], ka[s:e], A.alpha, w, stats, Cs)
            continue
        if ar.is_object:
            out[s:e] = _softmax_rows_mp(X, qa[s:e], ka[s:e], A.alpha, w, tau, ar, Cs)
            continue
        S = np.outer(qa[s:e], ka[s:e])
        if A.alpha != 0:
            S = S + (X @ X.T) * A.alpha
        Z = S - S.max(axis=1)[:, None]
        if tau != 1:
            Z = Z / tau
        M = ar.exp(Z) * w[None, :]
        out[s:e] = (M / M.sum(axis=1)[:, None]) @ Cs
    return out, out_rad


SAFE_EXPONENT = 250  # float pre-filters trust only magnitudes in [2^-250, 2^250] (see below)


def _trusted_floats(exact: np.ndarray) -> np.ndarray | None:
    """Floats of ``exact`` when every value rounds with *relative* error ≤ 2^-53: each nonzero
    value must land in [2^-250, 2^250]. None when some value is out of that range (it would
    round to a subnormal, to zero or to inf, and a relative bound would no longer hold)."""
    f = safe_floats(exact)
    mag = np.abs(f)
    nonzero = np.asarray(exact != 0, dtype=bool)
    if (nonzero & ((mag < 2.0 ** -SAFE_EXPONENT) | (mag > 2.0 ** SAFE_EXPONENT))).any():
        return None
    return f


def _float_scores(X, qa, ka, alpha):
    """The scores (c·x_i)(a·x_l) + α⟨x_i, x_l⟩ in float64 (overflow gives inf or nan)."""
    Xf, qf, kf = safe_floats(X), safe_floats(qa), safe_floats(ka)
    with np.errstate(all="ignore"):
        return np.outer(qf, kf) + (safe_float(alpha) * (Xf @ Xf.T) if alpha != 0 else 0.0)


def _softmax_rows_mp(X, qa, ka, alpha, w, tau, ar: Arithmetic, C=None) -> np.ndarray:
    """Softmax averages of the carrier C (default X) in high precision, dropping the weights
    that cannot matter.

    Everything is decided at the pass's precision (mpmath numbers, whose exponent range is
    unbounded): a key is dropped when its weight is below e^cut of the row's largest, with
    e^cut·Σw ≤ 2^-(prec+8). The dropped keys then move the row's average by at most
    e^cut·Σw·(largest distance between two points of the sequence), which is below the
    rounding of the pass itself (see docs/verification.md). For rank-one scores (α = 0) the
    kept keys are a run of the keys sorted by a·x, found by bisection, so sharp attention
    costs O(n log n) high-precision operations instead of O(n²).
    """
    n, C = len(X), X if C is None else C
    cut = -(mpmath.mp.prec + 8) * mpmath.ln2 - mpmath.log(sum(w))
    out = np.empty(C.shape, dtype=object)
    order = sorted(range(n), key=lambda l: ka[l]) if alpha == 0 else None
    ks = [ka[l] for l in order] if order is not None else None
    for i in range(n):
        if order is not None:
            idx = _rank_one_kept(qa[i], ks, order, cut * tau)
            sc = qa[i] * ka[idx]
        else:
            idx = np.arange(n)
            sc = qa[i] * ka + (X @ X[i]) * alpha
        z = (sc - max(sc)) / tau
        if order is None:
            keep = [v >= cut for v in z]
            idx, z = idx[keep], z[keep]
        wts = ar.exp(z) * w[idx]
        out[i] = (wts @ C[idx]) / sum(wts)
    return out


def _rank_one_kept(q, ks: list, order: list, gap) -> np.ndarray:
    """Keys l (indices) with q·(k_l − best) ≥ gap (gap = cut·τ ≤ 0), for keys ks sorted
    ascending: the best is the largest k when q > 0, the smallest when q < 0."""
    if q > 0:
        lo = bisect.bisect_left(ks, ks[-1] + gap / q)
        return np.asarray(order[lo:], dtype=int)
    if q < 0:
        hi = bisect.bisect_right(ks, ks[0] + gap / q)
        return np.asarray(order[:hi], dtype=int)
    return np.asarray(order, dtype=int)


def _rank_one_argmax(qa, ka) -> list[np.ndarray]:
    """Exact argmax sets of s_il = (c·x_i)(a·x_l), with no floats: the keys with the largest
    a·x when c·x_i > 0, the smallest when c·x_i < 0, every key when c·x_i = 0. O(n)."""
    kmax, kmin = max(ka), min(ka)
    top = np.flatnonzero([v == kmax for v in ka])
    bottom = np.flatnonzero([v == kmin for v in ka])
    every = np.arange(len(ka))
    return [top if q > 0 else bottom if q < 0 else every for q in qa]


def _exact_candidates(X, qa, ka, alpha) -> np.ndarray:
    """For each row, the keys that can be in its argmax set, from a float64 pre-filter that is
    provably safe, or every key where it is not.

    The filter is used only when X, c·x, a·x and α all round to floats with relative error
    ≤ 2^-53 (nonzero magnitudes in [2^-250, 2^250], so no product or sum of the score
    formula underflows or overflows). Then each float score is within
    B_il = 2(d+6)·2^-53·(|c·x_i||a·x_l| + |α|·Σ_j|x_ij||x_lj|) of the exact one (the
    conversions and d+5 operations, with a factor 2 of slack), and a key more than
    2·max_l B_il below the row's best float score cannot be an argmax.
    """
    n, d = X.shape
    fs = [_trusted_floats(v) for v in (X, qa, ka, np.array([alpha], dtype=object))]
    if any(f is None for f in fs):
        return np.ones((n, n), dtype=bool)
    Xf, qf, kf, (af,) = fs
    absX = np.abs(Xf)
    Sf = np.outer(qf, kf) + (af * (Xf @ Xf.T) if af != 0 else 0.0)
    bound = np.outer(np.abs(qf), np.abs(kf)) + abs(af) * (absX @ absX.T)
    bound *= 2 * (d + 6) * 2.0 ** -53
    return Sf >= (Sf.max(axis=1) - 2 * bound.max(axis=1))[:, None]


def _hardmax_hits(X, qa, ka, alpha) -> np.ndarray:
    """Exact argmax sets (exact or high-precision passes) as a boolean matrix, row i holding
    row i's set: rank one in O(n) exactly, else exact comparisons among the candidates of a
    safe float pre-filter. The candidates always hold the whole argmax set, so a row with a
    single candidate needs no exact score."""
    n = len(X)
    if alpha == 0:
        hit = np.zeros((n, n), dtype=bool)
        for i, idx in enumerate(_rank_one_argmax(qa, ka)):
            hit[i, idx] = True
        return hit
    hit = _exact_candidates(X, qa, ka, alpha)
    for i in np.flatnonzero(hit.sum(axis=1) > 1).tolist():
        idx = np.flatnonzero(hit[i])
        sc = qa[i] * ka[idx] + (X[idx] @ X[i]) * alpha
        best = max(sc)
        hit[i, idx] = [v == best for v in sc]
    return hit


def _hardmax_rows(X, qa, ka, alpha, w, stats: PassStats, C=None) -> np.ndarray:
    """Each row's average of the carrier C (default X; multiplicities w) over its exact
    argmax set of scores s_il = (c·x_i)(a·x_l) + α⟨x_i, x_l⟩ (exact and high-precision
    passes, see :func:`_hardmax_hits`): no float rounding can change these sets."""
    hit = _hardmax_hits(X, qa, ka, alpha)
    _record_hits(X, _float_scores(X, qa, ka, alpha), hit, stats)
    C = X if C is None else C
    out = np.empty(C.shape, dtype=C.dtype)
    one = hit.sum(axis=1) == 1
    out[one] = C[hit[one].argmax(axis=1)]  # the mean of one point (w·c/w) is the point itself
    for i in np.flatnonzero(~one).tolist():
        idx = np.flatnonzero(hit[i])
        ws = w[idx]
        out[i] = (ws @ C[idx]) / sum(ws)
    return out


BATCH = 2 * 10**6  # float64 scores per batch of sequences (× carrier columns)


def _batches(sg, k: int):
    """Row indices (B, n) of sequences with n rows each, B at a time so that a batch holds
    about BATCH scores × k carrier columns."""
    lengths = np.diff(np.append(sg.starts, len(sg.seg)))
    for n in np.unique(lengths).tolist():
        segs = np.flatnonzero(lengths == n)
        per = max(1, BATCH // (n * n * k))
        for i in range(0, len(segs), per):
            yield sg.starts[segs[i:i + per], None] + np.arange(n)


def _float_hardmax_rows(X, qa, ka, alpha, w, stats: PassStats, C) -> np.ndarray:
    """:func:`_hardmax_rows` for a float64 pass, decided on the float scores, for a batch of
    sequences of equal length at once (X: B × n × d, qa, ka, w: B × n, C: B × n × k)."""
    with np.errstate(all="ignore"):
        Sf = qa[..., :, None] * ka[..., None, :]
        if alpha != 0:
            Sf = Sf + alpha * (X @ X.swapaxes(-1, -2))
    hit = Sf == Sf.max(axis=-1, keepdims=True)
    _record_hits(X, Sf, hit, stats)
    M = hit * w[..., None, :]
    return (M / M.sum(axis=-1, keepdims=True)) @ C


def _record_hits(X, Sf, hit, stats: PassStats) -> None:
    """Ties (queries whose best keys hold two distinct points) and the smallest
    best-minus-second float score gap over each sequence's score scale, for one sequence or a
    batch (leading axes). A report only: float precision is enough, and sequences whose
    float scores are not finite are skipped."""
    if not stats.enabled:
        return
    for at in np.argwhere(hit.sum(axis=-1) > 1):  # queries with several best keys
        best = X[tuple(at[:-1])][hit[tuple(at)]]
        stats.hardmax_ties += int(bool(np.any(best != best[0])))
    if Sf.shape[-1] < 2:
        return
    with np.errstate(all="ignore"):
        scale = np.abs(Sf).max(axis=(-2, -1))
        ok = np.isfinite(Sf).all(axis=(-2, -1))
        scale = np.where(scale != 0, scale, 1.0)
        second = np.where(hit, -np.inf, Sf).max(axis=-1)
        gap = (Sf.max(axis=-1) - second) / scale[..., None]
    keep = ok[..., None] & np.isfinite(second)
    if keep.any():
        stats._min("hardmax_margin", float(gap[keep].min()))


# ------------------------------------------------------------------------------ public
def forward(model: Transformer, inputs: list[np.ndarray], arithmetic: str = "float",
            dps: int = 50, snapshots: set[int] | None = None, stats: PassStats | None = None,
            tau=None, progress: bool = False, workers: int | None = None):
    """Run the model on every input sequence; return the n_j×d outputs (length preserving).

    ``snapshots``: block indices (0 = the input, i = after block i) whose positions are also
    returned, as a dict, in a second return value. ``tau`` overrides the model's temperature.
    ``progress`` shows a progress bar over the blocks (over the chunks when parallel).
    ``workers``: processes for exact and mp passes (default: the CPUs this process may use).
    Sequences never interact, so a large pass is split into that many chunks of sequences run
    in a process pool; outputs, snapshots and ``stats`` equal those of a serial pass. Float
    passes and small inputs stay serial (see docs/verification.md).
    """
    if model.causal:  # ordered outputs under the causal mask (docs/causal.md)
        if snapshots is not None:
            raise ValueError("snapshots are not available for causal models")
        return forward_causal(model, inputs, arithmetic, dps, stats, tau, progress)
    ar = Arithmetic(arithmetic, dps)
    stats = PassStats() if stats is None else stats
    xs = [np.asarray(x) for x in inputs]
    with mpmath.workdps(dps):
        if model.positions is not None:  # added in the pass's arithmetic (exactly when exact)
            xs = with_positions(ar.array(model.positions), [ar.array(x) for x in xs])
        scale = max(1.0, max(_max_abs(x) for x in xs))
        job = _Job.of(model, ar, tau)
        bounds = _chunk_bounds(xs, model.n_blocks, ar, workers)
        if len(bounds) == 1:
            outs, snaps = job.run(xs, snapshots, stats, scale, progress)
        else:
            outs, snaps = _run_parallel(job, xs, bounds, snapshots, stats, scale, progress)
    return (outs, snaps) if snapshots is not None else outs


@dataclass
class _Job:
    """A model ready to run in one arithmetic: converted blocks, their ridge windows, τ."""

    ar: Arithmetic
    attention: str
    blocks: list
    ridges: list
    tau: object
    runs: dict  # first block -> runs.Run (float64 passes; docs/numerics.md)

    @classmethod
    def of(cls, model: Transformer, ar: Arithmetic, tau) -> _Job:
        params = model if ar.kind != "float" else (model.to_float() if model.exact else model)
        blocks = params.blocks  # converted to the pass's arithmetic where used (in_arithmetic)
        with _paused_gc():
            ridges = ridges_of([b.ff for b in model.blocks], [c.ff for c in blocks], ar)
            plan = runs.plan_runs(blocks, ridges) if ar.kind == "float" else {}
        tau = ar.scalar(tau if tau is not None else (model.tau if model.tau is not None else 1))
        return cls(ar, model.attention, blocks, ridges, tau, plan)

    def run(self, xs: list[np.ndarray], snapshots, stats: PassStats, scale: float,
            progress: bool) -> tuple[list, dict]:
        """The pass over ``xs``; ``scale`` (≥ 1, the largest input coordinate of the whole
        pass) normalises the ridge clearances so that chunks report like one pass."""
        st = _State(xs, self.ar)
        snaps = self.walk(st, snapshots, stats, scale, progress)
        return st.outputs(), snaps

    def walk(self, st: _State, snapshots, stats: PassStats, scale: float,
             progress: bool) -> dict:
        """Every block on the state ``st``; returns the snapshots asked for."""
        st.compact()
        snaps = {}
        if snapshots and 0 in snapshots:
            snaps[0] = st.outputs()
        bar = tqdm(total=len(self.blocks), desc=f"forward ({self.ar.kind})", unit="block",
                   disable=not progress, leave=False, delay=1)
        i = 0
        while i < len(self.blocks):
            run = self.runs.get(i)
            if run is not None and not any(run.start < k <= run.end for k in snapshots or ()) \
                    and runs.apply_run(st, run, stats, scale):
                bar.update(run.end - i)
                i = run.end
                continue
            blk = self.blocks[i]
            if blk.ff is not None:
                _apply_ff(st, blk.ff, self.ridges[i], stats, scale)
            if blk.sa is not None and not blk.sa.is_identity():
                _apply_sa(st, in_arithmetic(st.ar, blk.sa), self.attention, self.tau, stats)
            i += 1
            bar.update(1)
            if snapshots and i in snapshots:
                snaps[i] = st.outputs()
        bar.close()
        return snaps


def enclose(model: Transformer, inputs: list[np.ndarray], radii: list[np.ndarray] | None,
            stats: PassStats | None = None, progress: bool = False, give_up: float = math.inf):
    """The float64 pass of a float64 hardmax model with a radius on every coordinate: returns
    the float64 outputs and per token a bound on the distance of the *exact* evaluation of
    the stored numbers on the exact inputs from them, given the inputs' own radii
    (docs/numerics.md#enclosures); ``radii`` None: exact inputs (radius 0). Radii are inf
    where nothing is known. The outputs are a
    float64 evaluation in which gadget layers act as their affine pieces (a flat top adds its
    move exactly), so they can differ from :func:`forward`'s in the last bits. ``stats``
    records the pass's margins. A row whose radius exceeds ``give_up`` where a layer changes
    it gets radius inf (verify passes its tolerance limit: such a row could not be certified
    anyway); radii no layer touches are returned as they are."""
    if model.exact or model.attention != "hardmax" or model.causal or \
            model.positions is not None:
        raise ValueError("enclosures are made for float64 hardmax set-to-set models without "
                         "stored positions")
    stats = PassStats() if stats is None else stats
    xs = [np.asarray(x, dtype=float) for x in inputs]
    ar = Arithmetic("float")
    st = _State(xs, ar, [] if radii is None else [np.asarray(r, dtype=float) for r in radii])
    st.give_up = give_up
    with np.errstate(all="ignore"):  # overflow shows as inf or nan, and radii become inf
        _Job.of(model, ar, None).walk(st, None, stats, max(1.0, max(_max_abs(x) for x in xs)),
                                      progress)
    return st.outputs(), [np.where(np.isfinite(r), r, np.inf) for r in st.radii()]


# ------------------------------------------------------------------------------ parallel
PARALLEL_MIN_WORK = 10**6  # tokens × blocks below which a pool costs more than it saves


def default_workers() -> int:
    """The CPUs this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _chunk_bounds(xs: list[np.ndarray], n_blocks: int, ar: Arithmetic,
                  workers: int | None) -> list[tuple[int, int]]:
    """Contiguous ranges of sequences with about equal token counts, one per worker; a single
    range when the pass should stay serial (float, little work, one worker, or inside a
    daemonic process, which may not start children)."""
    workers = default_workers() if workers is None else workers
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    lengths = np.array([len(x) for x in xs])
    k = min(workers, len(xs))
    if (ar.kind == "float" or k < 2 or int(lengths.sum()) * n_blocks < PARALLEL_MIN_WORK
            or multiprocessing.current_process().daemon):
        return [(0, len(xs))]
    cuts = np.searchsorted(np.cumsum(lengths), lengths.sum() * np.arange(1, k) / k)
    edges = sorted({0, len(xs), *(int(c) + 1 for c in cuts)})
    return list(zip(edges[:-1], edges[1:], strict=True))


_WORKER: dict = {}  # the job and inputs of a pool worker, set once by its initializer


def _init_worker(job: _Job, xs: list[np.ndarray], snapshots, scale: float) -> None:
    _WORKER.update(job=job, xs=xs, snapshots=snapshots, scale=scale)


def _run_chunk(bounds: tuple[int, int]) -> tuple[list, dict, PassStats]:
    w, (s, e), stats = _WORKER, bounds, PassStats()
    with mpmath.workdps(w["job"].ar.dps):
        outs, snaps = w["job"].run(w["xs"][s:e], w["snapshots"], stats, w["scale"], False)
    return outs, snaps, stats


def _run_parallel(job: _Job, xs, bounds, snapshots, stats: PassStats, scale: float,
                  progress: bool) -> tuple[list, dict]:
    """Run the chunks in a process pool and join their results in sequence order. On Linux
    the workers are forked, so they inherit the prepared job instead of unpickling it."""
    ctx = multiprocessing.get_context("fork" if sys.platform.startswith("linux") else None)
    outs: list = []
    snaps: dict = {}
    with ProcessPoolExecutor(len(bounds), mp_context=ctx, initializer=_init_worker,
                             initargs=(job, xs, snapshots, scale)) as pool:
        results = tqdm(pool.map(_run_chunk, bounds), total=len(bounds), unit="chunk",
                       desc=f"forward ({job.ar.kind}, {len(bounds)} processes)",
                       disable=not progress, leave=False, delay=1)
        for chunk_outs, chunk_snaps, chunk_stats in results:
            outs += chunk_outs
            for i, v in chunk_snaps.items():
                snaps.setdefault(i, []).extend(v)
            stats.merge(chunk_stats)
    return outs, snaps


HAT_CHUNK = 4096  # layers stacked at once by the batch hat test (bounds its temporary memory)
FLOAT64 = np.dtype(np.float64)


def ridges_of(ffs: list, params: list, ar: Arithmetic) -> list:
    """Every layer of ``ffs`` (None for a block without FF) cut into ridge windows, each with
    its units taken from the same layer of ``params`` (the layer's numbers for the pass:
    float64 in a float64 pass; exact and mp passes convert a part when they apply it, see
    :func:`in_arithmetic`), and the window's direction and ends in the pass's arithmetic: a
    wide layer of k hats on one direction is k windows, so a token outside every window is never
    touched (docs/heads.md). None: apply the layer densely.

    Float64 hat layers (every unit reads one row f, the columns of each hat are ±w) are
    recognised in batch, all layers of one shape at once (:func:`_hat_windows`,
    docs/numerics.md#ridge-windows); every other layer goes through :func:`_ridge_cuts`."""
    out: list = [None] * len(ffs)
    shapes: dict = {}
    for i, ff in enumerate(ffs):
        if ff is not None and len(ff.b) and ff.U.dtype == ff.b.dtype == ff.W.dtype == FLOAT64:
            shapes.setdefault((ff.U.shape, ff.W.shape), []).append(i)
    with _paused_gc():
        for idx in shapes.values():
            for s in range(0, len(idx), HAT_CHUNK):
                chunk = idx[s:s + HAT_CHUNK]
                found = _hat_windows([ffs[i] for i in chunk], [params[i] for i in chunk], ar)
                for i, windows in zip(chunk, found, strict=True):
                    out[i] = windows
    return [out[i] if out[i] is not None or ff is None else _ridge_cuts(ff, params[i], ar)
            for i, ff in enumerate(ffs)]


@contextmanager
def _paused_gc():
    """No cyclic garbage collection inside: building the windows of a large model creates
    hundreds of thousands of small acyclic objects, and the collections they would trigger
    (each walking every live object of the model) cost a third of the preparation."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _hat_windows(ffs: list[FF], params: list[FF], ar: Arithmetic) -> list:
    """:func:`ridges_of` for float64 layers of one shape: per layer its hats, or None where the
    layer is not a residual layer of hats on one row f (:func:`_hat_cuts`). A hat's units are
    the pass's own layer when the hat is the whole layer in breakpoint order (every
    constructed width-4 layer), else views of the layer's units in that order: a large model's
    windows add no copy of its parameters."""
    U, b, W = (np.array([getattr(ff, k) for ff in ffs]) for k in "UbW")
    ok, order, opens, lo, hi = _hat_cuts(U, b, W, np.array([ff.eta == 1 for ff in ffs]))
    layers = np.flatnonzero(ok)
    row, start = np.nonzero(opens[layers])  # every hat: its layer (among ``layers``), 1st unit
    h = b.shape[1]
    end = np.full(len(start), h)  # a hat ends where the next one of its layer starts
    nxt = row[1:] == row[:-1]
    end[:-1][nxt] = start[1:][nxt]
    if ar.is_object:  # each distinct direction converted once (±0 convert alike)
        rows, which = np.unique(U[layers, 0], axis=0, return_inverse=True)
        fs = list(ar.array(rows)[which.reshape(-1)])
    else:
        fs = [ffs[layer].U[0] for layer in layers.tolist()]
    norms = np.linalg.norm(U[layers, 0], axis=1).tolist()
    in_order = (order == np.arange(h)).all(axis=1)
    units = {layer: params[layer] if in_order[layer] else _units_in(params[layer], order[layer])
             for layer in layers.tolist()}
    out: list = [None] * len(ffs)
    for layer in layers.tolist():
        out[layer] = []
    for m, layer, a, e, lo_, hi_ in zip(row.tolist(), layers[row].tolist(), start.tolist(),
                                        end.tolist(), ar.array(lo).tolist(),
                                        ar.array(hi).tolist(), strict=True):
        p = units[layer]
        part = p if e - a == h else FF(p.eta, p.U[a:e], p.b[a:e], p.W[:, a:e])
        out[layer].append((Ridge(fs[m], lo_, hi_, norms[m]), part))
    return out


def _units_in(ff: FF, order: np.ndarray) -> FF:
    """``ff`` with its hidden units in the order ``order`` (the same function)."""
    return FF(ff.eta, ff.U[order], ff.b[order], ff.W[:, order])


def _hat_cuts(U, b, W, eta):
    """The hats of float64 layers of one shape (U n×h×d, b n×h, W n×d×h, η = 1 where ``eta``):
    ok (n,), the units in breakpoint order (n×h), where a hat opens in that order (n×h), and
    every hat's window ends lo, hi (in layer and breakpoint order).

    A layer is ok when every unit reads its first row f (nonzero) and its units, sorted by −b
    (stable), form consecutive hats: columns ±w, signs summing to 0 and Σ ±b_i exactly 0
    (math.fsum is exact). Each unit's sign is taken relative to its predecessor's column (a
    column that is not ± its predecessor must open a hat, and the sign a hat starts with does
    not matter); every earlier hat sums to exactly 0, so a hat closes exactly where the
    layer's prefix sums of signs and of ±b are both 0. A hat's window is (−max b, −min b):
    floats, exact, no outward rounding needed."""
    n, h = b.shape
    ok = (eta.astype(bool) & U[:, 0].any(axis=1) & (U == U[:, :1]).all(axis=(1, 2))
          & np.isfinite(b).all(axis=1))
    order = np.argsort(-b, axis=1, kind="stable")
    bs = np.take_along_axis(b, order, axis=1)
    cols = np.take_along_axis(np.swapaxes(W, 1, 2), order[:, :, None], axis=1)  # n×h×d
    step = np.where((cols[:, 1:] == cols[:, :-1]).all(axis=2), 1,
                    np.where((cols[:, 1:] == -cols[:, :-1]).all(axis=2), -1, 0))
    sign = np.cumprod(np.concatenate([np.ones((n, 1), dtype=np.int64),
                                      np.where(step == 0, 1, step)], axis=1), axis=1)
    closes = (np.cumsum(sign, axis=1) == 0) & ok[:, None]
    terms = (sign * bs).tolist()
    for layer, k in np.argwhere(closes).tolist():
        closes[layer, k] = _sums_to_zero(terms[layer][:k + 1])
    ok &= closes[:, -1] & ~((step == 0) & ~closes[:, :-1]).any(axis=1)
    opens = np.concatenate([np.ones((n, 1), dtype=bool), closes[:, :-1]], axis=1)
    starts = np.flatnonzero(opens[ok])
    sorted_b = bs[ok].ravel()
    return (ok, order, opens, -np.maximum.reduceat(sorted_b, starts),
            -np.minimum.reduceat(sorted_b, starts))


def _sums_to_zero(terms: list) -> bool:
    """Is the exact sum of these floats 0? (math.fsum rounds correctly; a sum beyond float
    range is not 0.)"""
    try:
        return math.fsum(terms) == 0
    except OverflowError:
        return False


def _ridge_cuts(ff: FF, params: FF, ar: Arithmetic) -> list[tuple[Ridge, FF]] | None:
    """The ridge windows of one layer that is not a float64 layer of hats; see
    :func:`ridges_of`. A rational layer of hats is cut by :func:`_hat_groups` on an mpq copy
    (a linear test with comparisons a fifth of a Fraction's); anything else, and a rational
    layer that test does not cut, by the general test (:func:`ridge_groups`, quadratically
    many Fraction operations)."""
    q = ff.converted(_EXACT.scalar, _EXACT.array) if ff.U.dtype == object else None
    cuts = _hat_groups(q) if q is not None else None
    cuts = cuts if cuts is not None else ridge_groups(ff)
    if cuts is None:
        return None
    one_f = _one_direction(ff if q is None else q)
    out = []
    for idx in cuts:
        if one_f:  # every unit reads f with scale 1: the breakpoints are −b, exactly
            lo, hi = -ff.b[idx].max(), -ff.b[idx].min()
            r = Ridge(ff.U[0], *((float(lo), float(hi)) if ff.b.dtype == float else (lo, hi)))
        else:
            r = ridge_window(_sub_ff(ff, idx))
        lo, hi = ar.scalar(r.lo), ar.scalar(r.hi)
        if ar.kind == "float":  # rounded outward: the float window holds the exact one
            lo = lo if Fraction(lo) <= to_fraction(r.lo) else float(np.nextafter(lo, -np.inf))
            hi = hi if Fraction(hi) >= to_fraction(r.hi) else float(np.nextafter(hi, np.inf))
        out.append((Ridge(ar.array(r.f), lo, hi), _sub_ff(params, idx)))
    return out


def ridges_in(ff: FF, params: FF, ar: Arithmetic) -> list[tuple[Ridge, FF]] | None:
    """:func:`ridges_of` for one layer."""
    return ridges_of([ff], [params], ar)[0]


def _one_direction(ff: FF) -> bool:
    """A layer whose hidden units all read the same nonzero row f, compared exactly (float64
    and rational parameters alike)."""
    U = ff.U
    return bool((U[0] != 0).any()) and bool((U == U[0]).all())


def _hat_groups(ff: FF) -> list[list[int]] | None:
    """:func:`ridge_groups` for a rational residual layer (exact values, as mpq) whose units
    all read one row f and whose columns are ±w per hat: units in breakpoint order close a
    window when their signs sum to 0 and Σ ±b_i is exactly 0, the test :func:`_hat_cuts`
    makes on float64 layers. None when the layer is not of that form."""
    if ff.eta != 1 or not _one_direction(ff):
        return None
    b, W = ff.b, ff.W
    groups, cur, w, signs, terms = [], [], None, 0, []
    for i in np.argsort(-b, kind="stable").tolist():
        col = W[:, i]
        if not cur:
            w, sign = col, 1
        elif (col == w).all():
            sign = 1
        elif (col == -w).all():
            sign = -1
        else:
            return None
        cur.append(i)
        signs += sign
        terms.append(sign * b[i])
        if signs == 0 and sum(terms) == 0 and (w != 0).any():
            groups.append(cur)
            cur, terms = [], []
    return groups if not cur and groups else None


def ridge_groups(ff: FF) -> list[list[int]] | None:
    """The hidden units of ``ff`` split into consecutive groups (by breakpoint along their
    common direction) that are each a ridge window, or None when ``ff`` is not a ridge window
    at all. One group when the layer cannot be cut. Decided by :func:`ridge_window` on
    growing groups; float64 hat layers are cut faster by :func:`_hat_cuts`."""
    if ridge_window(ff) is None:
        return None
    U, b = ff.U, ff.b
    live = [i for i in range(U.shape[0]) if any(v != 0 for v in U[i])]
    f = U[live[0]]
    if not all(np.array_equal(U[i], f) for i in live) or len(live) < U.shape[0]:
        return [list(range(U.shape[0]))]
    order = sorted(live, key=(lambda i: -b[i]) if b.dtype == float else
                   (lambda i: -to_fraction(b[i])))
    groups, cur = [], []
    for i in order:
        cur.append(i)
        if ridge_window(_sub_ff(ff, cur)) is not None:
            groups.append(cur)
            cur = []
    return groups if not cur else [list(range(U.shape[0]))]


def _sub_ff(ff: FF, idx: list[int]) -> FF:
    return FF(ff.eta, ff.U[idx], ff.b[idx], ff.W[:, idx])


def in_arithmetic(ar: Arithmetic, layer):
    """A layer (block, FF, SA or ridge part) in the pass's arithmetic. Passes convert each layer
    when they apply it, and a ridge part only when some row is inside its window: an exact
    pass over a few sequences of a float64 model with 10^5 hat layers converts the few that
    reach its rows, not the millions of parameters of the others."""
    return layer if ar.kind == "float" else layer.converted(ar.scalar, ar.array)


def dense_forward(model: Transformer, inputs: list[np.ndarray], tau=None) -> list[np.ndarray]:
    """A plain float64 pass, written apart from :func:`forward` to check it independently:
    every token of every sequence, every layer dense (A and V as d×d matrices, full n×n
    scores), no multisets and no ridge windows. Sequences of equal length run as one batch.
    Overflow is not trapped: it shows as inf or nan in the outputs (see docs/verification.md).
    """
    params = model.to_float() if model.exact else model
    t = float(tau if tau is not None else (model.tau if model.tau is not None else 1))
    xs = [np.asarray(x, dtype=float) for x in inputs]
    outs: list = [None] * len(xs)
    for n in sorted({len(x) for x in xs}):
        js = [j for j, x in enumerate(xs) if len(x) == n]
        X = np.stack([xs[j] for j in js])  # (B, n, d)
        with np.errstate(all="ignore"):
            for blk in params.blocks:
                X = _dense_block(X, blk, model.attention, t)
        for j, y in zip(js, X, strict=True):
            outs[j] = y
    return outs


def _dense_block(X: np.ndarray, blk, attention: str, tau: float) -> np.ndarray:
    """One block x ↦ SA(FF(x)) on a (B, n, d) batch, densely, in float64."""
    if blk.ff is not None:
        ff = blk.ff
        X = ff.eta * X + np.maximum(X @ ff.U.T + ff.b, 0.0) @ ff.W.T
    if blk.sa is None or blk.sa.is_identity():
        return X
    out = blk.sa.rho * X
    for head in blk.sa.heads:
        S = (X @ head.A.dense().T) @ np.swapaxes(X, 1, 2)  # S[b, i, l] = <A x_i, x_l>
        if attention == "hardmax":
            M = (S == S.max(axis=2, keepdims=True)).astype(float)
        else:
            M = np.exp((S - S.max(axis=2, keepdims=True)) / tau)
        M = M / M.sum(axis=2, keepdims=True)
        out = out + (M @ X) @ head.V.dense().T
    return out


def distinct_rows(a: np.ndarray) -> np.ndarray:
    """The distinct rows of ``a`` in first-seen order (exact comparison)."""
    seen, keep = set(), []
    for i, row in enumerate(a):
        k = tuple(row.tolist())
        if k not in seen:
            seen.add(k)
            keep.append(i)
    return a[keep]


def predict(model: Transformer, X, arithmetic: str | None = None, dps: int = 50) -> np.ndarray:
    """The set of distinct output tokens for one input sequence X (n×d); for a causal model
    the ordered outputs, row i the prediction after x_1..x_i."""
    if arithmetic is None:
        arithmetic = "exact" if model.exact and model.attention == "hardmax" else "float"
    (out,) = forward(model, [np.asarray(X)], arithmetic, dps)
    return out if model.causal else distinct_rows(out)


# ------------------------------------------------------------------------------ causal passes
def with_positions(positions, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Row i of ``positions`` added to the token at position i (None: the inputs unchanged).
    A sequence longer than the rows is an error naming it (see docs/causal.md)."""
    if positions is None:
        return inputs
    out = []
    for j, x in enumerate(inputs):
        if len(x) > len(positions):
            raise ValueError(f"sequence {j} has {len(x)} tokens but the model stores "
                             f"{len(positions)} positions")
        out.append(np.asarray(x) + positions[: len(x)])
    return out


class _CausalState(_State):
    """Rows in input order, never merged: under a causal mask two equal points of a sequence
    see different prefixes, so they are not interchangeable as in a set pass."""

    def compact(self):
        self.changed_everything()


def forward_causal(model: Transformer, inputs: list[np.ndarray], arithmetic: str = "float",
                   dps: int = 50, stats: PassStats | None = None, tau=None,
                   progress: bool = False) -> list[np.ndarray]:
    """Run a causal model (token i attends to l ≤ i) on every sequence; positions are added
    first. The outputs are ordered: row i is the prediction after x_1..x_i (docs/causal.md)."""
    ar = Arithmetic(arithmetic, dps)
    stats = stats or PassStats()
    with mpmath.workdps(dps):
        params = model if ar.kind != "float" else (model.to_float() if model.exact else model)
        pos = None if model.positions is None else ar.array(model.positions)
        xs = with_positions(pos, [ar.array(np.asarray(x)) for x in inputs])
        blocks = params.blocks  # converted to the pass's arithmetic where used (in_arithmetic)
        ridges = ridges_of([b.ff for b in model.blocks], [c.ff for c in blocks], ar)
        tau = ar.scalar(tau if tau is not None else (model.tau if model.tau is not None else 1))
        st = _CausalState(xs, ar)
        scale = max(1.0, float(np.abs(safe_floats(st.P)).max()))
        bar = tqdm(blocks, desc=f"causal forward ({ar.kind})", unit="block",
                   disable=not progress, leave=False, delay=1)
        for blk, ridge in zip(bar, ridges, strict=True):
            if blk.ff is not None:
                _apply_ff(st, blk.ff, ridge, stats, scale)
            if blk.sa is not None and not blk.sa.is_identity():
                _apply_causal_sa(st, in_arithmetic(ar, blk.sa), model.attention, tau, stats)
        return st.outputs()


def _apply_causal_sa(st: _State, sa: SA, attention: str, tau, stats: PassStats) -> None:
    """ρ·x_i plus every head's V_h applied to its causal average (docs/heads.md)."""
    P = st.P
    new = P if sa.rho == 1 else P * sa.rho
    for head in sa.heads:
        new = _add_causal_head(st, P, new, head, attention, tau, stats)
    st.P = new
    st.changed_everything()


def _add_causal_head(st: _State, P, new, head, attention: str, tau, stats: PassStats):
    """``new`` plus V·(the head's causal averages of the rows P)."""
    A, V = head.A, head.V
    qa, ka = sparse_dot(P, A.c), sparse_dot(P, A.a)
    out = np.empty_like(P)
    for s, e in st.segments():
        if attention == "hardmax":
            out[s:e] = causal_hardmax_rows(P[s:e], qa[s:e], ka[s:e], A.alpha, stats)
        else:
            out[s:e] = causal_softmax_rows(P[s:e], qa[s:e], ka[s:e], A.alpha, tau, st.ar)
    if V.beta != 0:
        new = new + out * V.beta
    cols = [k for k, v in enumerate(V.p) if v != 0]
    if cols:  # only the columns that p·(q·y) changes, q·y over q's nonzero entries
        new = new.copy() if new is P else new
        new[:, cols] = new[:, cols] + np.outer(sparse_dot(out, V.q), V.p[cols])
    return new


def causal_hardmax_rows(X, qa, ka, alpha, stats: PassStats) -> np.ndarray:
    """Row i: the average of x_l over the argmax set of s_il (l ≤ i), decided exactly in the
    arithmetic of X. With α = 0 a :class:`CausalScan` does it in O(n); otherwise each row's
    scores are compared (:func:`causal_row`)."""
    out = np.empty_like(X)
    if alpha != 0:
        for i in range(len(X)):
            out[i] = causal_row(X, qa, ka, alpha, i, np.arange(i + 1), "hardmax", None, stats)
        return out
    scan = CausalScan(float(np.abs(safe_floats(qa)).max()) *
                      float(np.abs(safe_floats(ka)).max()))
    for i in range(len(X)):
        out[i] = scan.push(qa[i], ka[i], X[i], stats)
    return out


class CausalScan:
    """Causal hardmax with scores q_i·k_l (A = a·cᵀ, α = 0), one token at a time: the argmax
    set of row i is where k_l is the prefix maximum (q_i > 0), the prefix minimum (q_i < 0) or
    the whole prefix (q_i = 0), so running extremes suffice. ``scale`` normalises margins."""

    def __init__(self, scale: float = 1.0):
        self.hi, self.lo = _PrefixExtreme(1), _PrefixExtreme(-1)
        self.total, self.n, self.scale = None, 0, scale or 1.0

    def push(self, q, k, x, stats: PassStats) -> np.ndarray:
        """Append the token x (query q = c·x, key k = a·x) and return its attention output."""
        self.hi.add(k, x)
        self.lo.add(k, x)
        self.total = x if self.total is None else self.total + x
        self.n += 1
        ext = self.hi if q > 0 else self.lo if q < 0 else None
        if ext is None:
            stats.hardmax_ties += int(self.n > 1)
            return self.total / self.n
        stats.hardmax_ties += int(ext.mixed)
        if ext.second is not None:
            gap = abs(safe_float(q)) * abs(safe_float(ext.best) - safe_float(ext.second))
            stats._min("hardmax_margin", gap / self.scale)
        return ext.sum if ext.count == 1 else ext.sum / ext.count


class _PrefixExtreme:
    """Running maximum (sign 1) or minimum (sign −1) of keys, the sum and count of the points
    attaining it, whether they differ, and the runner-up key."""

    def __init__(self, sign: int):
        self.sign, self.best, self.second = sign, None, None
        self.sum, self.count, self.first, self.mixed = None, 0, None, False

    def _beats(self, k, other) -> bool:
        return other is None or (k > other if self.sign > 0 else k < other)

    def add(self, k, x) -> None:
        if self._beats(k, self.best):
            self.second, self.best = self.best, k
            self.sum, self.count, self.first, self.mixed = x, 1, x, False
        elif k == self.best:
            self.sum, self.count = self.sum + x, self.count + 1
            self.mixed = self.mixed or any(a != b for a, b in zip(x, self.first, strict=True))
        elif self._beats(k, self.second):
            self.second = k


def causal_row(X, qa, ka, alpha, i: int, idx: np.ndarray, attention: str, tau,
               stats: PassStats | None = None, ar: Arithmetic | None = None) -> np.ndarray:
    """The attention output of row i over the keys ``idx`` (⊆ 0..i): hardmax averages the
    argmax set (exact comparisons in X's arithmetic), softmax weights exp((s − max)/τ)."""
    sc = qa[i] * ka[idx]
    if alpha != 0:
        sc = sc + (X[idx] @ X[i]) * alpha
    best = max(sc)
    if attention == "hardmax":
        hit = idx[[v == best for v in sc]]
        if stats is not None:
            stats.hardmax_ties += int(any(any(a != b for a, b in zip(X[l], X[hit[0]], strict=True))
                                          for l in hit))
            rest = [v for v in sc if v != best]
            if rest:
                scale = safe_float(max(abs(v) for v in sc)) or 1.0
                stats._min("hardmax_margin", safe_float(best - max(rest)) / scale)
        return X[hit].sum(axis=0) / len(hit)
    z = (sc - best) / tau
    wts = ar.exp(z) if ar is not None else np.exp(z)
    return (wts @ X[idx]) / sum(wts)


def causal_softmax_rows(X, qa, ka, alpha, tau, ar: Arithmetic) -> np.ndarray:
    """Row i: Σ_{l ≤ i} softmax_l(s_il/τ)·x_l. High-precision passes drop, at the pass's own
    precision, the keys whose weights cannot matter, as :func:`_softmax_rows_mp` does."""
    n = len(X)
    if not ar.is_object:
        with np.errstate(invalid="ignore", over="ignore"):
            Sf = np.where(np.tri(n, dtype=bool), _float_scores(X, qa, ka, alpha), -np.inf)
            M = np.exp((Sf - Sf.max(axis=1)[:, None]) / float(tau))
            return (M / M.sum(axis=1)[:, None]) @ X
    out = np.empty_like(X)
    for i in range(n):
        idx = np.arange(i + 1)
        sc = qa[i] * ka[idx]
        if alpha != 0:
            sc = sc + (X[idx] @ X[i]) * alpha
        z = (sc - max(sc)) / tau
        cut = -(mpmath.mp.prec + 8) * mpmath.ln2 - mpmath.log(i + 1)
        keep = np.array([v >= cut for v in z], dtype=bool)
        wts = ar.exp(z[keep])
        out[i] = (wts @ X[idx[keep]]) / sum(wts)
    return out
