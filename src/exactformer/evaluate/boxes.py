"""Rows kept in boxes across FF layers that each change few rows (docs/numerics.md#row-boxes).

A residual FF (η = 1, W finite) adds exactly 0 to a row whose units are all ≤ 0. Sorted by
the coordinates a stretch of layers reads and cut into boxes of GROUP rows, each box holding
the least and largest value of every coordinate over its rows (over their enclosures, in a
tracking pass), the rows let a bound per box on U·x + b rule most of them out, so that a layer
is evaluated on the few boxes where a unit may be > 0 and not on every row. The plain dense
pass (:mod:`.dense_stretch`) and the enclosures (:func:`.layers.dense_tracking`) keep them.
"""

from __future__ import annotations

import numpy as np

from .rounding import lower, upper

GROUP = 32  # rows that share one box of bounds
ABSORB = 128  # dirty rows that go into boxes of their own
BOX_LAYERS = 16  # layers left in a stretch from which new boxes pay in an enclosure pass
FEW = 16  # a layer that changed at most one row in FEW lets the next keep boxes


def few(changed: int, rows: int) -> bool:
    """Whether a layer that changed ``changed`` of ``rows`` rows changed few enough for boxes
    made after it to pay (a layer that writes most rows gains nothing from them)."""
    return FEW * changed <= rows


def stretch_weight(ffs) -> np.ndarray | None:
    """How much the FFs ``ffs`` (None for none) weigh each coordinate: Σ |U| over their units,
    what the boxes sort by; None when there is no FF."""
    parts = [np.abs(ff.U).sum(axis=0) for ff in ffs if ff is not None]
    return np.sum(parts, axis=0) if parts else None


class Boxes:
    """The finite rows X (with radii r, or None) in boxes of GROUP rows, cut from an order that
    sorts them by the columns the stretch reads (the one whose spread times its weights is
    largest first); each box's bounds: the least and the largest value of each column over the
    rows still in it (only of the columns the weight reads, given ``read_only``), the ends of
    x ± r rounded outward. A row changed becomes dirty: it leaves its box, whose bounds are
    recomputed, and is evaluated at every layer until ABSORB rows are dirty, which then go into
    new boxes of their own; past twice the boxes it began with, the boxes are rebuilt
    (:meth:`stale`). ``epoch``: for the owner's bookkeeping of changes."""

    def __init__(self, X: np.ndarray, weight: np.ndarray, r: np.ndarray | None = None,
                 epoch: int = 0, read_only: bool = False):
        spread = (X.max(axis=0) - X.min(axis=0)) * weight
        cols = np.flatnonzero(spread > 0)
        self.cols = cols[np.argsort(spread[cols], kind="stable")]  # lexsort: the last leads
        self.measured = np.flatnonzero(weight) if read_only else np.arange(X.shape[1])
        self.at = np.full(X.shape[1], -1)  # each column's row in lo and hi, −1: not measured
        self.at[self.measured] = np.arange(len(self.measured))
        self.box = np.empty(len(X), dtype=np.int64)  # each row's box, −1 while dirty
        self.members = np.zeros((0, GROUP), dtype=np.int64)  # −1: no row
        self.lo, self.hi = np.zeros((len(self.measured), 0)), np.zeros((len(self.measured), 0))
        self.peak = np.zeros(0)  # each box's largest |value|
        self.dirty = np.zeros(0, dtype=np.int64)
        self.row_peak = np.zeros(len(X))  # each dirty row's largest |value|
        self.finite = True
        self.slack = (4 * X.shape[1] + 8) * 2.0 ** -52  # ≥ both products' rounding, relative
        self.epoch = epoch
        self._box_up(X, r, np.arange(len(X)))
        self.limit = 2 * len(self.members) + 8

    def stale(self) -> bool:
        """Whether a value changed is not finite (every row must be: inf·0 = nan reaches
        every column in a plain pass) or so many boxes were added that a rebuild pays."""
        return not self.finite or len(self.members) > self.limit

    def bounds(self, reads: np.ndarray, U: np.ndarray, b: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray]:
        """Per box: a bound above every unit's U·x + b and one above every |U·x + b|, at every
        point of its bounds and as a float pass computes them at its rows (rounding of both
        included); inf where a column of ``reads`` is not measured."""
        at = self.at[reads]
        if (at < 0).any():
            top = np.full(self.lo.shape[1], np.inf)
            return top, top
        lo, hi = self.lo[at], self.hi[at]  # (column, box): reductions run over boxes
        up, down, b = np.maximum(U, 0.0), np.minimum(U, 0.0), b[:, None]
        above, below = up @ hi + down @ lo + b, up @ lo + down @ hi + b
        size = np.abs(U) @ np.maximum(np.abs(lo), np.abs(hi)) + np.abs(b)
        # products that underflow; none where every term is an exact 0 (a unit whose bias is
        # 0 reading only coordinates that are 0 on every row of the box: a snap's pair)
        read_live = (U != 0).astype(float) @ ((lo != 0) | (hi != 0)).astype(float)
        zero = (read_live == 0) & (b == 0)
        slack = np.where(zero, 0.0, size * self.slack + 2.0 ** -1000)
        return (above + slack).max(axis=0, initial=-np.inf), \
            (np.maximum(above, -below) + slack).max(axis=0, initial=-np.inf)

    def rows(self, boxes: np.ndarray, with_dirty: bool, reads=None) -> np.ndarray:
        """The rows in ``boxes``, and every dirty row if ``with_dirty``; given ``reads``,
        one row of each box whose rows agree on those columns (their pre-activations are
        equal, as is all a layer's peak needs of them)."""
        rows = self._in(boxes)
        if reads is not None:  # (columns that are measured: every one in the plain pass)
            at = self.at[reads]
            flat = (self.lo[at][:, boxes] == self.hi[at][:, boxes]).all(axis=0)
            rows[flat, 1:] = np.where(rows[flat, :1] >= 0, -1, rows[flat, 1:])
        rows = rows[rows >= 0]
        return np.concatenate([self.dirty, rows]) if with_dirty else rows

    def leave(self, X: np.ndarray, r: np.ndarray | None, rows: np.ndarray) -> None:
        """The rows ``rows`` of X (radii r) changed: they become dirty and leave their boxes."""
        size = np.abs(X[rows]) if r is None else np.abs(X[rows]) + r[rows]
        self.row_peak[rows] = size.max(axis=1, initial=0.0)
        self.finite = self.finite and bool(np.isfinite(self.row_peak[rows]).all())
        new = rows[self.box[rows] >= 0]
        if len(new):
            left = np.unique(self.box[new])
            self.box[new] = -1
            self.dirty = np.concatenate([self.dirty, new])
            self._measure(X, r, left)
        if len(self.dirty) >= ABSORB and self.finite:
            self._box_up(X, r, self.dirty)
            self.dirty = self.dirty[:0]

    def top(self) -> float:
        """The largest |value| of the rows: over the boxes and the dirty rows."""
        dirty = self.row_peak[self.dirty].max(initial=0.0)  # (nan stays nan)
        return float(np.max([self.peak.max(initial=0.0), dirty]))

    def _box_up(self, X: np.ndarray, r: np.ndarray | None, rows: np.ndarray) -> None:
        """New boxes for ``rows``, sorted by the columns."""
        if len(self.cols):
            rows = rows[np.lexsort(X[np.ix_(rows, self.cols)].T)]
        first, n = len(self.members), -(-len(rows) // GROUP)
        cut = np.full(n * GROUP, -1)
        cut[:len(rows)] = rows
        self.members = np.concatenate([self.members, cut.reshape(n, GROUP)])
        self.box[rows] = first + np.arange(len(rows)) // GROUP
        self.lo, self.hi = (np.concatenate([a, np.zeros((len(a), n))], axis=1)
                            for a in (self.lo, self.hi))
        self.peak = np.concatenate([self.peak, np.zeros(n)])
        self._measure(X, r, np.arange(first, first + n))

    def _in(self, boxes: np.ndarray) -> np.ndarray:
        """The rows in ``boxes``, (box, GROUP), −1 where none."""
        rows = self.members[boxes]
        return np.where(self.box[rows] == boxes[:, None], rows, -1)

    def _measure(self, X: np.ndarray, r: np.ndarray | None, boxes: np.ndarray) -> None:
        """The bounds of ``boxes`` over their rows (0 for a box with none)."""
        rows = self._in(boxes)
        gone = (rows < 0)[..., None]
        at = (rows[..., None], self.measured)
        V = X[at]
        low, high = (V, V) if r is None else (lower(V, r[at]), upper(V, r[at]))
        lo = np.where(gone, np.inf, low).min(axis=1)
        hi = np.where(gone, -np.inf, high).max(axis=1)
        empty = ~np.isfinite(lo[:, :1])  # (every row gone; the rows in boxes are finite)
        lo, hi = np.where(empty, 0.0, lo), np.where(empty, 0.0, hi)
        self.lo[:, boxes], self.hi[:, boxes] = lo.T, hi.T
        self.peak[boxes] = np.maximum(np.abs(lo), np.abs(hi)).max(axis=1, initial=0.0)
