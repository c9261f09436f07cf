"""Attention-free stretches of the plain dense float64 pass (:mod:`.dense`): each layer on
the distinct rows, and a residual FF only on the rows its bounds leave in doubt
(docs/numerics.md#runtime-ranges)."""

from __future__ import annotations

import numpy as np

GROUP = 32  # rows that share one box of bounds
ABSORB = 128  # dirty rows that go into boxes of their own


def stretch(X: np.ndarray, blocks, i: int, j: int, peak_of) -> np.ndarray:
    """Blocks i..j−1, none of which mixes tokens, on the rows X (each row alone);
    ``peak_of(k)`` records block k's peaks. A residual FF (η = 1, W finite) on finite rows
    after a layer that wrote few rows goes by :func:`_bounded_ff` on :class:`_Boxes` kept
    across the layers; any other layer, or one whose bounds or values are not finite, on
    every row and column (:func:`_plain_ff`): a layer that writes most rows gains nothing
    from boxes."""
    X = np.array(X, dtype=float)  # rows contiguous: layers gather rows
    weight = sum((np.abs(b.ff.U).sum(axis=0) for b in blocks[i:j] if b.ff is not None),
                 np.zeros(X.shape[1]))
    boxes, written = None, len(X)
    for k in range(i, j):
        peak, ff = peak_of(k), blocks[k].ff
        if ff is not None and len(X):
            residual = ff.eta == 1 and np.isfinite(ff.W).all()  # (relu 0 · inf = nan)
            if boxes is None and residual and 16 * written <= len(X) and np.isfinite(X).all():
                boxes = _Boxes(X, weight)
            written = _bounded_ff(X, boxes, ff, peak) if boxes is not None and residual else None
            if written is None:
                X, written, boxes = *_plain_ff(X, ff, peak), None
            elif boxes.stale():
                boxes = None
        if len(X):
            top = np.abs(X).max() if boxes is None else boxes.top()
            if ff is not None:
                peak.note("FF output", top)
            peak.note("state", top)
    return X


def _plain_ff(X: np.ndarray, ff, peak) -> tuple[np.ndarray, int]:
    """η·x + W·relu(U·x + b) on every row and column of X, as the plain pass computes it;
    and the number of rows where a unit is > 0."""
    Z = peak("FF pre-activation", X @ ff.U.T + ff.b)
    X = ff.eta * X + np.maximum(Z, 0.0) @ ff.W.T
    return X, int(np.asfortranarray(Z > 0).any(axis=1).sum())


def _bounded_ff(X: np.ndarray, boxes: _Boxes, ff, peak) -> int | None:
    """A residual FF on the finite rows X, in place; the number of rows written, or None
    (X untouched) where it cannot go so. A row whose units are all ≤ 0 gains exactly 0, so
    the layer is evaluated only on the dirty rows, the boxes whose bound lets a unit be > 0
    and those whose bound on |U·x + b| reaches the largest one evaluated: its
    pre-activations' peak is then the plain pass's, and it writes only the rows where a
    unit is > 0 (:meth:`_Boxes.write`). With a peak limit only the boxes whose bound passes
    it are evaluated for the peak; the others' bound is recorded in their place."""
    reads = np.flatnonzero(ff.U.any(axis=0))
    U = ff.U[:, reads]
    high, size = boxes.bounds(reads, U, ff.b)
    if not (np.isfinite(high).all() and np.isfinite(size).all()):
        return None
    first = high > 0
    first[np.argmax(size)] = True
    rows = boxes.rows(np.flatnonzero(first), with_dirty=True)
    Z = np.asfortranarray(X[np.ix_(rows, reads)] @ U.T + ff.b)  # (row reductions: fast)
    top = np.abs(Z).max(initial=0.0)
    more = (size >= top) & ~first
    if peak.limit is not None:  # boxes whose bound is within the limit: that bound will do
        top = max(top, size[more & (size <= peak.limit)].max(initial=0.0))
        more &= size > peak.limit
    more = np.flatnonzero(more)
    if len(more):
        extra = boxes.rows(more, with_dirty=False, reads=reads)
        rows = np.concatenate([rows, extra])
        Z = np.asfortranarray(np.concatenate([Z, X[np.ix_(extra, reads)] @ U.T + ff.b]))
    if not np.isfinite(Z).all():
        return None
    if Z.size:
        peak.note("FF pre-activation", max(np.abs(Z).max(), top))
    active = (Z > 0).any(axis=1)
    on = rows[active]
    if len(on):
        writes = np.flatnonzero(ff.W.any(axis=1))
        boxes.write(X, on, writes, np.maximum(Z[active], 0.0) @ ff.W[writes].T)
    return len(on)


class _Boxes:
    """The finite rows X in boxes of GROUP rows, cut from an order that sorts them by the
    columns the stretch reads (the one whose spread times its weights is largest first);
    each box's bounds: the least and the largest value of each column over the rows still
    in it. A row written becomes dirty: it leaves its box, whose bounds are recomputed, and
    is evaluated at every layer until ABSORB rows are dirty, which then go into new boxes
    of their own; past twice the boxes it began with, the boxes are rebuilt (:meth:`stale`)."""

    def __init__(self, X: np.ndarray, weight: np.ndarray):
        spread = (X.max(axis=0) - X.min(axis=0)) * weight
        cols = np.flatnonzero(spread > 0)
        self.cols = cols[np.argsort(spread[cols], kind="stable")]  # lexsort: the last leads
        self.box = np.empty(len(X), dtype=np.int64)  # each row's box, −1 while dirty
        self.members = np.zeros((0, GROUP), dtype=np.int64)  # −1: no row
        self.lo, self.hi = np.zeros((X.shape[1], 0)), np.zeros((X.shape[1], 0))
        self.peak = np.zeros(0)  # each box's largest |value|
        self.dirty = np.zeros(0, dtype=np.int64)
        self.row_peak = np.zeros(len(X))  # each dirty row's largest |value|
        self.finite = True
        self.slack = (4 * X.shape[1] + 8) * 2.0 ** -52  # ≥ both products' rounding, relative
        self._box_up(X, np.arange(len(X)))
        self.limit = 2 * len(self.members) + 8

    def stale(self) -> bool:
        """Whether a value written is not finite (every row must be: inf·0 = nan reaches
        every column in the plain pass) or so many boxes were added that a rebuild pays."""
        return not self.finite or len(self.members) > self.limit

    def bounds(self, reads: np.ndarray, U: np.ndarray, b: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray]:
        """Per box: a bound above every unit's U·x + b and one above every |U·x + b|, over
        its rows, as the plain pass computes them (rounding of both included)."""
        lo, hi = self.lo[reads], self.hi[reads]  # (column, box): reductions run over boxes
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
        if reads is not None:
            flat = (self.lo[reads][:, boxes] == self.hi[reads][:, boxes]).all(axis=0)
            rows[flat, 1:] = np.where(rows[flat, :1] >= 0, -1, rows[flat, 1:])
        rows = rows[rows >= 0]
        return np.concatenate([self.dirty, rows]) if with_dirty else rows

    def write(self, X: np.ndarray, on: np.ndarray, writes: np.ndarray, add: np.ndarray) -> None:
        """X[on, writes] += add; the rows ``on`` become dirty and leave their boxes."""
        X[np.ix_(on, writes)] += add
        self.row_peak[on] = np.abs(X[on]).max(axis=1, initial=0.0)
        self.finite = self.finite and bool(np.isfinite(self.row_peak[on]).all())
        new = on[self.box[on] >= 0]
        if len(new):
            left = np.unique(self.box[new])
            self.box[new] = -1
            self.dirty = np.concatenate([self.dirty, new])
            self._measure(X, left)
        if len(self.dirty) >= ABSORB and self.finite:
            self._box_up(X, self.dirty)
            self.dirty = self.dirty[:0]

    def top(self) -> float:
        """The largest |value| of the rows: over the boxes and the dirty rows."""
        dirty = self.row_peak[self.dirty].max(initial=0.0)  # (nan stays nan)
        return float(np.max([self.peak.max(initial=0.0), dirty]))

    def _box_up(self, X: np.ndarray, rows: np.ndarray) -> None:
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
        self._measure(X, np.arange(first, first + n))

    def _in(self, boxes: np.ndarray) -> np.ndarray:
        """The rows in ``boxes``, (box, GROUP), −1 where none."""
        rows = self.members[boxes]
        return np.where(self.box[rows] == boxes[:, None], rows, -1)

    def _measure(self, X: np.ndarray, boxes: np.ndarray) -> None:
        """The bounds of ``boxes`` over their rows (0 for a box with none)."""
        rows = self._in(boxes)
        gone = (rows < 0)[..., None]
        V = X[rows]
        lo, hi = np.where(gone, np.inf, V).min(axis=1), np.where(gone, -np.inf, V).max(axis=1)
        empty = ~np.isfinite(lo[:, :1])  # (every row gone; the rows in boxes are finite)
        lo, hi = np.where(empty, 0.0, lo), np.where(empty, 0.0, hi)
        self.lo[:, boxes], self.hi[:, boxes] = lo.T, hi.T
        self.peak[boxes] = np.maximum(np.abs(lo), np.abs(hi)).max(axis=1, initial=0.0)
