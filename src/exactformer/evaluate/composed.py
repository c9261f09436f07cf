"""Consecutive FF layers that compose into one (docs/numerics.md#composed-layers).

Residual FF layers F_k(x) = x + W_k·relu(U_k·x + b_k) with no attention between them, each
reading none of the coordinates the ones before it write, compose exactly into the one layer
F that holds their units side by side: F_2(F_1(x)) = x + W_1·relu(U_1·x + b_1) +
W_2·relu(U_2·(x + W_1·a) + b_2), and U_2·W_1 = 0. A tracking pass (docs/numerics.md#enclosures)
bounds the exact evaluation of the stored numbers, which that is, so it may take them as one
layer: one enclosure where there were several, each of whose fixed cost is most of what a
keyed move costs (a snapped softmax model's two layers of pairs, each reading its own snaps).
It does so on the rows where no coordinate is written by units of two layers that may both be
on, where each output sums the terms of one layer and exact zeros (the float64 sum the layers
in order compute), and takes the other rows through the layers in order, so that the float64
outputs stay those of the model's own layers. A plain float pass keeps the layers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..model import FF
from . import enclosure
from .layers import ff_rows
from .window_pairs import finite_residual

COMPOSED_UNITS = 16  # units of a composed layer at most: the enclosures of wide ones cost more


@dataclass
class Composed:
    """Blocks [start, end) as one FF (every layer's units side by side, each unit's layer in
    ``layer``), and the layers themselves, with what each writes (layers × coordinates)."""

    start: int
    end: int
    ff: FF
    layer: np.ndarray
    layers: list[FF]

    def __post_init__(self):
        self.writes = np.array([ff.W.any(axis=1) for ff in self.layers], dtype=float)

    def apply(self, st) -> None:
        """The layers on the tracking pass ``st``: F on the rows where no two layers that may
        be on write a common coordinate, the layers in order on the others; rows whose read
        coordinates are all exact zeros are left as they are (every bias is ≤ 0: each unit
        is off there)."""
        ff = self.ff
        rows = enclosure.stirred(st.P, st.rad, ff.U, ff.b)
        if not len(rows):
            return
        read = (st.P[rows] != 0) | (st.rad[rows] != 0)
        mixed = self._clash(enclosure.flagged_reads(read, ff.U) > 0)
        if mixed.any():  # (a unit reading only exact zeros is off: the others decide)
            at = np.flatnonzero(mixed)
            mixed[at] = self._clash(enclosure.maybe_on(st.P[rows[at]], st.rad[rows[at]],
                                                       ff.U, ff.b))
        if not mixed.all():
            ff_rows(st, ff, rows[~mixed])
        for layer in self.layers if mixed.any() else ():
            ff_rows(st, layer, rows[mixed])

    def _clash(self, on: np.ndarray) -> np.ndarray:
        """Rows where units of two layers that write a common coordinate are both ``on``
        (rows × units): only there may F's float64 sum differ from the layers'."""
        per = np.stack([on[:, self.layer == k].any(axis=1)
                        for k in range(len(self.layers))], axis=1)
        return (per.astype(float) @ self.writes > 1).any(axis=1)


def composed_layers(blocks: list, plain: list[bool]) -> dict[int, Composed]:
    """first block -> :class:`Composed` for every maximal stretch [first, end) of two or more
    blocks whose FF is residual (η = 1), finite, with biases ≤ 0 and ``plain`` (taken by no
    other fast path), with no attention, each reading no coordinate an earlier one of the
    stretch writes, :data:`COMPOSED_UNITS` units in all at most; ``blocks`` in float64."""
    fits = [_fits(blk, p) for blk, p in zip(blocks, plain, strict=True)]
    out, i = {}, 0
    while i < len(blocks):
        j, units = i, 0
        written = np.zeros(blocks[i].ff.U.shape[1] if fits[i] else 0, dtype=bool)
        while j < len(blocks) and fits[j] and units + len(blocks[j].ff.b) <= COMPOSED_UNITS \
                and not (blocks[j].ff.U.any(axis=0) & written).any():
            written |= blocks[j].ff.W.any(axis=1)
            units += len(blocks[j].ff.b)
            j += 1
        if j - i >= 2:
            ffs = [b.ff for b in blocks[i:j]]
            ff = FF(1.0, np.vstack([f.U for f in ffs]), np.concatenate([f.b for f in ffs]),
                    np.hstack([f.W for f in ffs]))
            layer = np.repeat(np.arange(len(ffs)), [len(f.b) for f in ffs])
            out[i] = Composed(i, j, ff, layer, ffs)
        i = max(j, i + 1)
    return out


def _fits(blk, plain: bool) -> bool:
    return plain and (blk.sa is None or blk.sa.is_identity()) and \
        finite_residual(blk.ff) and blk.ff.width > 0 and bool((blk.ff.b <= 0).all())
