"""Consecutive FF layers that compose into one (docs/numerics.md#composed-layers).

Residual FF layers F_k(x) = x + W_k·relu(U_k·x + b_k) with no attention between them, each
reading none of the coordinates the ones before it write, compose exactly into the one layer
that holds their units side by side: F_2(F_1(x)) = x + W_1·relu(U_1·x + b_1) +
W_2·relu(U_2·(x + W_1·a) + b_2), and U_2·W_1 = 0. A tracking pass (docs/numerics.md#enclosures)
bounds the exact evaluation of the stored numbers, which that is, so it may take them as one
layer: one enclosure where there were several, each of whose fixed cost is most of what a
keyed move costs (a snapped softmax model's two layers of pairs, each reading its own snaps).
A plain float pass keeps the layers: their roundings are the model's.
"""

from __future__ import annotations

import numpy as np

from ..model import FF

COMPOSED_UNITS = 16  # units of a composed layer at most: the enclosures of wide ones cost more


def composed_layers(blocks: list, plain: list[bool]) -> dict[int, tuple[int, FF]]:
    """first block -> (end, the composed FF) for every maximal stretch [first, end) of two or
    more blocks whose FF is residual (η = 1), finite and ``plain`` (taken by no other fast
    path), with no attention, each reading no coordinate an earlier one of the stretch
    writes, :data:`COMPOSED_UNITS` units in all at most; ``blocks`` in float64."""
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
            out[i] = (j, FF(1.0, np.vstack([ff.U for ff in ffs]),
                            np.concatenate([ff.b for ff in ffs]), np.hstack([ff.W for ff in ffs])))
        i = max(j, i + 1)
    return out


def _fits(blk, plain: bool) -> bool:
    ff = blk.ff
    return plain and ff is not None and (blk.sa is None or blk.sa.is_identity()) and \
        ff.eta == 1 and ff.width > 0 and ff.U.dtype == ff.b.dtype == ff.W.dtype == float and \
        bool(np.isfinite(ff.U).all() and np.isfinite(ff.b).all() and np.isfinite(ff.W).all())
