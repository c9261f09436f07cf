"""Runs of FF layers enclosed in stages (docs/numerics.md#staged-runs).

A keyed softmax model's moves are thousands of residual FF layers, each changing a few rows
(a snap, then the pair that reads it, docs/keyed.md#softmax), and each layer's enclosure
costs about a millisecond whatever it moves. A tracking pass takes a run of them at once.
The run's *merged* layer holds every layer's units side by side. A row whose box leaves every
merged unit certainly off is left as it is by the first layer, so the second sees it
unchanged, and so on: only the other rows are looked at. Each of those goes through the
layers in order, in *stages*: at a stage it takes the first layer at or after its place with
a unit that may be on at its box (the layers between are certainly off there and add an
exact 0, radius included) and moves past it. One enclosure serves every row of a stage, each
row through its own layer's units alone, the others held off (``off`` of
:func:`.enclosure.ff_dense_into`), so that each row's box holds what the layers in order
compute. Layers may read what earlier ones write.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..model import FF, side_by_side
from . import enclosure
from .boxes import few
from .layers import current_boxes
from .window_pairs import finite_residual

RUN_UNITS = 256  # units of the merged layer at most: 64 layers of width 4, 4 of width 64
# (heavy sharing, softmax: fewer runs cost less until the merged layer's products dominate)
LIVE_SHARE = 0.5  # the share of the rows up to which a run is staged


@dataclass
class StagedRun:
    """Blocks [start, end) as one merged FF (every layer's units side by side, each unit's
    layer in ``layer``), and ``weight``, the stretch's weights that boxes sort by."""

    start: int
    end: int
    ff: FF
    layer: np.ndarray
    weight: np.ndarray | None

    def __post_init__(self):
        self.reads = np.flatnonzero(self.ff.U.any(axis=0))  # (maybe_on's bound reads these)

    def apply(self, st) -> bool:
        """The run on the tracking pass ``st``; False (``st`` untouched) where most rows
        may change (a layer writing every row), which the layers one by one take for less.
        A row that is not finite (or stops being so) goes through its layers one by one: in
        the merged layer's products inf·0 would reach the units of layers that do not read
        it."""
        ff, n, reads = self.ff, int(self.layer[-1]) + 1, self.reads
        rows = self._near(st)
        X, r = st.P[rows], st.rad[rows]
        on = enclosure.maybe_on(X[:, reads], r[:, reads], ff.U[:, reads], ff.b)
        live = on.any(axis=1)
        if live.sum() > LIVE_SHARE * len(st.P):
            return False
        rows, X, r, on = rows[live], X[live], r[live], on[live]
        place = np.zeros(len(rows), dtype=np.int64)  # each row's next layer in the run
        todo, changed, everything = np.arange(len(rows)), np.zeros(len(rows), dtype=bool), False
        while len(todo):
            layer = np.where(on & (self.layer >= place[todo, None]), self.layer, n).min(axis=1)
            go = (layer < n) & np.isfinite(X[todo]).all(axis=1) & np.isfinite(r[todo]).all(axis=1)
            todo, layer = todo[go], layer[go]
            if not len(todo):
                break
            Xs, rs = X[todo], r[todo]
            live = enclosure.ff_dense_into(Xs, rs, 1.0, ff.U, ff.b, ff.W,
                                           off=self.layer != layer[:, None])
            X[todo], r[todo] = Xs, rs
            everything |= live is None
            changed[todo if live is None else todo[live]] = True
            place[todo] = layer + 1
            on = enclosure.maybe_on(Xs[:, reads], rs[:, reads], ff.U[:, reads], ff.b)
        everything |= self._wild_in_order(X, r, place, changed)
        moved = rows[changed]
        st.P[moved], st.rad[moved] = X[changed], r[changed]
        st.moved(moved, None if everything else np.flatnonzero(ff.W.any(axis=1)))
        st.few_changed = few(len(moved), len(st.P))
        return True

    def _wild_in_order(self, X, r, place, changed) -> bool:
        """The rows of X ± r that are not finite, through the layers from their place on, one
        by one (in place; ``changed`` marked); whether a layer may have changed any column."""
        everything = False
        wild = ~(np.isfinite(X).all(axis=1) & np.isfinite(r).all(axis=1))
        for k in range(int(self.layer[-1]) + 1):
            at = np.flatnonzero(wild & (place <= k))
            if not len(at):
                continue
            units = self.layer == k
            Xs, rs = X[at], r[at]
            live = enclosure.ff_dense_into(Xs, rs, 1.0, self.ff.U[units], self.ff.b[units],
                                           self.ff.W[:, units])
            X[at], r[at] = Xs, rs
            everything |= live is None
            changed[at if live is None else at[live]] = True
        return everything

    def _near(self, st) -> np.ndarray:
        """Rows where some merged unit may be on, or a superset: not those whose read
        coordinates are exact zeros (:func:`.enclosure.stirred`), nor, where the pass keeps
        boxes, the rows of boxes whose bound rules every unit out (:mod:`.boxes`)."""
        ff = self.ff
        rows = enclosure.stirred(st.P, st.rad, ff.U, ff.b)
        if few(len(rows), len(st.P)):
            return rows
        boxes = current_boxes(st, ff, self.weight)
        if boxes is None:
            return rows
        high, _ = boxes.bounds(self.reads, ff.U[:, self.reads], ff.b)
        if not np.isfinite(high).all():
            return rows
        return boxes.rows(np.flatnonzero(high > 0), with_dirty=True)


def staged_runs(blocks: list, plain: list[bool], weights: list,
                gated: list[bool]) -> dict[int, StagedRun]:
    """first block -> :class:`StagedRun` for every maximal stretch [first, end) of two or more
    blocks whose FF is residual (η = 1), finite, with biases ≤ 0 and ``plain`` (taken by no
    other fast path), with no attention, :data:`RUN_UNITS` units in all at most, not all of
    them ``gated`` (layers their gates take one by one for less: wide moves, which no gated
    run takes either); ``blocks`` in float64, ``weights`` per block as
    :func:`.jobs._stretch_weights` gives them."""
    fits = [_fits(blk, p) for blk, p in zip(blocks, plain, strict=True)]
    out, i = {}, 0
    while i < len(blocks):
        j, units = i, 0
        while j < len(blocks) and fits[j] and units + len(blocks[j].ff.b) <= RUN_UNITS:
            units += len(blocks[j].ff.b)
            j += 1
        if j - i >= 2 and not all(gated[i:j]):
            out[i] = StagedRun(i, j, *side_by_side([b.ff for b in blocks[i:j]]), weights[i])
        i = max(j, i + 1)
    return out


def _fits(blk, plain: bool) -> bool:
    return plain and (blk.sa is None or blk.sa.is_identity()) and \
        finite_residual(blk.ff) and blk.ff.width > 0 and bool((blk.ff.b <= 0).all())
