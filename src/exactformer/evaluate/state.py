"""The rows a pass carries: points per sequence, merged into multisets, with sorted indices.

A set pass keeps each sequence as a *multiset* of points (rows with counts): two tokens of one
sequence at the same point stay together forever, because FF acts per token and SA depends only
on the token and the multiset of its sequence. Equal points are merged after every attention
layer that replaces the tokens (:mod:`.compaction`), so after the collapse a sequence costs m_j
rows, not n_j. :class:`RowState` implements :class:`.rows.Rows`, the protocol that the layer
runs and the rank-one attention heads work against (docs/numerics.md).
"""

from __future__ import annotations

import math

import numpy as np

from . import enclosure
from .arithmetic import Arithmetic, float_image, stable_argsort
from .compaction import distinct_within, float_row_groups, object_row_groups
from .rank_one import HeadCache
from .rows import Segments


class SortedProjection:
    """Rows' values t = P·f kept in a sorted index; moved rows wait in a dirty set (checked
    one by one by every query) until there are enough of them to be merged back in.

    Float values are sorted only when a second query comes (or :meth:`refresh` asks): most
    directions of a pass are read by one layer only (a separation test, say), and one
    linear scan of t is far cheaper than sorting it (docs/numerics.md#ridge-windows)."""

    def __init__(self, t: np.ndarray):
        self.t = t
        self.order = None
        self.scanned = False  # one query answered by a linear scan
        if t.dtype == object:
            self._sort()

    def _sort(self):
        self.order = stable_argsort(self.t)
        self._sorted()

    def _sorted(self):
        self.sorted_t = self.t[self.order]
        self.dirty = np.zeros(0, dtype=np.int64)
        self.is_dirty = np.zeros(len(self.t), dtype=bool)

    def _rebuild(self):
        """Fold the moved rows in: the others keep their sorted order, the moved ones are
        sorted alone and merged in (linear in the rows, not a sort of them all)."""
        moved = self.dirty[stable_argsort(self.t[self.dirty])]
        keep = self.order[~self.is_dirty[self.order]]
        self.order = np.insert(keep, np.searchsorted(self.t[keep], self.t[moved]), moved)
        self._sorted()

    def rows_in(self, lo, hi) -> tuple[np.ndarray, object]:
        """Rows with lo < t < hi, and the smallest distance from a row outside to [lo, hi]."""
        if self.order is None:
            if not self.scanned:
                self.scanned = True
                with np.errstate(invalid="ignore"):
                    inside = (self.t > lo) & (self.t < hi)
                gaps = _gaps(self.t[~inside], lo, hi)
                return np.flatnonzero(inside), (gaps[0] if gaps else None)
            self._sort()
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
        if j < len(self.order) and self.sorted_t[j] == self.sorted_t[j]:  # nan (sorted last)
            gaps.append(self.sorted_t[j] - hi)  # is no distance
        if len(self.dirty):
            td = self.t[self.dirty]
            inside = (td > lo).astype(bool) & (td < hi).astype(bool)
            rows.append(self.dirty[inside])
            gaps += _gaps(td[~inside], lo, hi)
        return np.concatenate(rows).astype(int), (min(gaps) if gaps else None)

    def refresh(self) -> None:
        """Sort, or fold the moved rows back into the sorted order (a rebuild) if there are
        any."""
        if self.order is None:
            self._sort()
        elif len(self.dirty):
            self._rebuild()

    def update(self, rows: np.ndarray, t_new: np.ndarray) -> None:
        self.t[rows] = t_new
        if self.order is None:  # not sorted yet: nothing else to keep
            return
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


class RowState:
    """Rows of points per sequence (equal points merged at compactions), contiguous by
    sequence. A float64 pass may carry ``rad``: per coordinate, a bound on the distance of the
    exact evaluation from the float one (docs/numerics.md#enclosures)."""

    def __init__(self, inputs: list[np.ndarray], ar: Arithmetic, rad: list | None = None):
        self.ar = ar
        self.N = len(inputs)
        self.lengths = [x.shape[0] for x in inputs]
        P = np.concatenate(inputs, axis=0)
        self.P = P if P.dtype == float and not ar.is_object else ar.array(P)
        self.rad = None if rad is None else \
            np.zeros(P.shape) if not len(rad) else np.concatenate(rad, axis=0).astype(float)
        self.seq = np.repeat(np.arange(self.N), self.lengths)
        self.cnt = np.ones(len(self.seq), dtype=np.int64)
        self.owner = np.arange(len(self.seq))  # original token -> current row
        # direction (as a tuple) -> (direction, sorted index of P·direction)
        self.projections: dict[tuple, tuple[np.ndarray, SortedProjection]] = {}
        self.extent = None  # (largest radius, largest |coordinate|) over the rows, or None
        self.forms: dict = {}  # id of a ridge part -> its enclosure.gadget_form
        self.give_up = math.inf  # radius beyond which a row is given up (set to inf)
        self._by_sequence = None  # (segments(), weights()) until the next compaction
        self.heads = HeadCache()
        self.keys: dict = {}  # key coordinates -> the rows' keys (evaluate/keys.py)
        self.bounds: dict = {}  # a gate's columns -> the rows' classes (evaluate/gates.py)
        self.boxes = None  # rows in boxes across FF layers that change few (evaluate/boxes.py)
        self.few_changed = False  # whether the last dense FF of a tracking pass changed few
        # change stamps: every change of a row's point or radius, and every attention write
        # of a column, gets a new epoch (what rank_one.HeadCache reuses results by)
        self.epoch = 0
        self.row_epoch = np.zeros(len(self.seq), dtype=np.int64)
        self.col_epoch = np.zeros(self.P.shape[1], dtype=np.int64)

    def changed_everything(self):
        self.projections.clear()
        self.heads.clear()
        self.keys.clear()
        self.bounds.clear()
        self.boxes, self.few_changed = None, False
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
        self.keys = {k: v for k, v in self.keys.items() if not set(k) & set(cols.tolist())}
        self.bounds = {k: v for k, v in self.bounds.items() if not set(k) & set(cols.tolist())}
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
        including the rounding of the float f·m (widens a ridge window's row search), for
        every row whose values and radii are finite where f reads. Entries that are not
        finite are left out of the bound: a row with one where f reads has an f·x that is
        not finite (and is given up) or a box unbounded along f, which its sequence cannot
        be decided with."""
        if self.extent is None:
            self._give_up((self.rad > self.give_up).any(axis=1))
            self.extent = _extent(self.P, self.rad)
        r, m = self.extent
        af = float(np.abs(f).sum())
        return enclosure.up(af * r + enclosure.rounding(af * m, len(f)), len(f) + 2)

    def projection(self, f: np.ndarray) -> SortedProjection:
        key = tuple(f.tolist())
        if key not in self.projections:
            t = self.P @ f
            self._lose_unsorted(np.arange(len(t)), t)
            self.projections[key] = (f, SortedProjection(t))
        return self.projections[key][1]

    def _lose_unsorted(self, rows: np.ndarray, t: np.ndarray) -> None:
        """A row whose float f·x is not finite has no place in a sorted index, so no window
        would ever look at it: in a tracking pass its radius becomes inf."""
        if self.rad is not None:
            bad = ~np.isfinite(t)
            if bad.any():
                self.rad[rows[bad]] = np.inf
                self.touch(rows[bad])

    def moved(self, rows: np.ndarray, cols: np.ndarray | None = None) -> None:
        """Rows changed by an FF: refresh their values in every sorted index (``cols``: the
        only columns that changed, None: any; an index along a direction that reads none of
        them keeps its values)."""
        for f, sp in self.projections.values():
            if cols is not None and not f[cols].any():
                continue
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
        """Merge equal points of the same sequence; rows end up grouped by sequence. When
        the first coordinate already tells every two rows of a sequence apart (the usual
        case after a projection), nothing merges and the rows stay as they are, stored
        column by column."""
        col = self.P[:, 0] if not self.ar.is_object else float_image(self.P[:, 0])
        if col is not None and distinct_within(self.seq, col):
            if not self.ar.is_object:
                self.P = np.asfortranarray(self.P)
                self.rad = None if self.rad is None else np.asfortranarray(self.rad)
            return
        if not self.ar.is_object:
            first, inv = float_row_groups(
                self.seq, [self.P] if self.rad is None else [self.P, self.rad])
        else:
            first, inv = object_row_groups(self.seq, self.P)
        self.cnt = np.bincount(inv, weights=self.cnt, minlength=len(first)).astype(np.int64)
        self.P, self.seq = _columns(self.P, first), self.seq[first]
        if self.rad is not None:
            self.rad = _columns(self.rad, first)
        self.owner = inv[self.owner]
        self._by_sequence = None
        self.row_epoch = np.zeros(len(first), dtype=np.int64)
        self.changed_everything()

    def pool(self) -> None:
        """Merge equal rows of *every* sequence, not only of one: before the first attention
        layer a row's value depends on its own token alone, so shared tokens (a vocabulary
        drawn on by many sequences) are computed once (docs/numerics.md#pooled-rows).
        :meth:`unpool` gives each sequence its rows back before attention mixes them."""
        self.seq = np.zeros(len(self.seq), dtype=np.int64)
        self.compact()

    def unpool(self) -> None:
        """Every original token's row again, in its own sequence (then merged per sequence)."""
        self.P, self.seq = _columns(self.P, self.owner), np.repeat(np.arange(self.N),
                                                                   self.lengths)
        if self.rad is not None:
            self.rad = _columns(self.rad, self.owner)
        self.cnt = np.ones(len(self.seq), dtype=np.int64)
        self.owner = np.arange(len(self.seq))
        self._by_sequence = None
        self.row_epoch = np.zeros(len(self.seq), dtype=np.int64)
        self.changed_everything()
        self.compact()

    def _grouping(self):
        if self._by_sequence is None:
            first = np.concatenate([[True], self.seq[1:] != self.seq[:-1]])
            self._by_sequence = (Segments(np.cumsum(first) - 1, np.flatnonzero(first)),
                                 self.ar.array(self.cnt))
        return self._by_sequence

    def segment_index(self) -> Segments:
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


class CausalState(RowState):
    """Rows in input order, never merged by attention layers: under a causal mask two equal
    points of a sequence see different prefixes, so they are not interchangeable as in a set
    pass. Before the first attention layer they are (:meth:`pool`)."""

    def compact(self):
        self.changed_everything()

    def pool(self) -> None:
        """Merge equal rows of every sequence, as a set pass does: before the first attention
        layer a row's value depends on its own point alone (token plus position), whatever its
        prefix (docs/numerics.md#pooled-rows). :meth:`unpool` puts every token back in its
        place before attention reads the order."""
        self.seq = np.zeros(len(self.seq), dtype=np.int64)
        RowState.compact(self)


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


def _largest_abs(col: np.ndarray) -> float:
    """max |v| over a column (0 when empty, nan when it holds one), with no |col| copy."""
    return float(np.maximum(col.max(initial=0.0), -col.min(initial=0.0))) + 0.0


SMALL_EXTENT = 1 << 12  # entries of P read at once by _extent (the rows an FF moved)


def _extent(P: np.ndarray, rad: np.ndarray, cols: np.ndarray | None = None
            ) -> tuple[float, float]:
    """Largest radius and largest |coordinate| over the entries whose value and radius are
    finite, in the columns ``cols`` (default all): a row's other entries stay bounded when one
    of its radii overflows. A large P is read column by column (views, no gathered copies)
    while every value is finite, which is the usual case."""
    if P.size > SMALL_EXTENT:
        tops = [v for c in range(P.shape[1]) if cols is None or c in cols
                for v in (float(rad[:, c].max(initial=0.0)), _largest_abs(P[:, c]))]
        if all(math.isfinite(v) for v in tops):  # (a nan shows as nan)
            return max(tops[::2], default=0.0), max(tops[1::2], default=0.0)
    if cols is not None:
        P, rad = P[:, cols], rad[:, cols]
    ok = np.isfinite(rad) & np.isfinite(P)
    return float(rad[ok].max(initial=0.0)), float(np.abs(P[ok]).max(initial=0.0))
