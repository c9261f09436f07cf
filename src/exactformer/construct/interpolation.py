"""Interpolation: one residual hat per leader carries it onto its target.

A generic direction h separates every leader from every other leader and from every target, so
each hat (centred at h·leader) can be as wide as half the distance to the nearest point that
must stay put: the leaders not yet moved and the targets already placed. A layer of width 4k
holds k hats: they read the same input, and half-distance windows around distinct present
points are pairwise disjoint. See docs/hardmax.md#interpolation and docs/heads.md.
"""

from __future__ import annotations

import numpy as np
from sortedcontainers import SortedList
from tqdm import tqdm

from ..model import Block
from ..numbers import num
from .gadgets import ff_from_units, hat_units
from .generic import ConstructionError, Draws, best_draw, generic_score


class LeaderOnTarget(ConstructionError):
    """A target coincides with a leader point: the leader geometry must be redrawn."""


def interpolate(leaders: list[np.ndarray], targets: list[np.ndarray], draws: Draws,
                progress: bool = False, per_layer: int = 1,
                fixed: np.ndarray | None = None) -> tuple[list[Block], np.ndarray]:
    """Hats moving leader i of sequence j onto target i of sequence j, in sequence order,
    ``per_layer`` hats to an FF layer. ``fixed``: points already on their targets (causal
    states, docs/causal.md), which no hat may touch; targets may land on them."""
    exact = draws.exact
    d = targets[0].shape[1]
    L = np.concatenate(leaders, axis=0)
    Y = np.concatenate(targets, axis=0)
    lead_keys = {tuple(r.tolist()) for r in L}
    if any(tuple(r.tolist()) in lead_keys for r in Y):
        raise LeaderOnTarget("a target coincides with a leader point")
    ykeys = {tuple(r.tolist()): r for r in Y}
    if fixed is not None:
        ykeys.update((tuple(r.tolist()), r) for r in fixed)
    Yu = np.array(list(ykeys.values()), dtype=Y.dtype)

    h = best_draw(lambda: draws.vector(d),
                  lambda h: generic_score(np.concatenate([L @ h, Yu @ h]), exact),
                  what="interpolation direction")
    lv, yv = list(L @ h), list(Y @ h)
    present = SortedList(lv + ([] if fixed is None else list(fixed @ h)))
    every = sorted(lv + list(Yu @ h))
    cap = (every[-1] - every[0]) if len(every) > 1 else num(1, exact)
    blocks = []
    starts = range(0, len(lv), per_layer)
    for s in tqdm(starts, total=len(starts), desc="interpolation layers", unit="layer",
                  disable=not progress, leave=False, delay=1):
        layer = range(s, min(s + per_layer, len(lv)))
        units = [u for i in layer for u in hat_units(
            h, 0 * lv[i], lv[i], half_room(present, lv[i], cap), Y[i] - L[i])]
        blocks.append(Block(ff_from_units(units, num(1, exact), d, exact), None))
        for i in layer:
            present.remove(lv[i])
        for i in layer:
            if yv[i] not in present:
                present.add(yv[i])
    return blocks, h


def half_room(present: SortedList, c, cap):
    """Half the distance from c (one of the values ``present``) to its nearest other value,
    at most cap/2: the half-width of a hat at c that touches no other present value."""
    i = present.bisect_left(c)
    near = [abs(present[k] - c) for k in (i - 1, i + 1) if 0 <= k < len(present)]
    return min([cap] + near) / 2
