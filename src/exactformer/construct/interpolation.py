"""Interpolation: one residual hat per leader carries it onto its target.

A generic direction h separates every leader from every other leader and from every target, so
each hat (centred at h·leader) can be as wide as half the distance to the nearest point that
must stay put: the leaders not yet moved and the targets already placed.
See docs/hardmax.md#interpolation.
"""

from __future__ import annotations

from bisect import bisect_left, insort

import numpy as np
from tqdm import tqdm

from ..model import Block
from ..numbers import num
from .gadgets import ff_from_units, hat_units
from .generic import ConstructionError, Draws, best_draw, generic_score


class LeaderOnTarget(ConstructionError):
    """A target coincides with a leader point: the leader geometry must be redrawn."""


def interpolate(leaders: list[np.ndarray], targets: list[np.ndarray], draws: Draws,
                progress: bool = False) -> tuple[list[Block], np.ndarray]:
    """Hats moving leader i of sequence j onto target i of sequence j, in sequence order."""
    exact = draws.exact
    d = targets[0].shape[1]
    L = np.concatenate(leaders, axis=0)
    Y = np.concatenate(targets, axis=0)
    lead_keys = {tuple(r.tolist()) for r in L}
    if any(tuple(r.tolist()) in lead_keys for r in Y):
        raise LeaderOnTarget("a target coincides with a leader point")
    ykeys = {tuple(r.tolist()): r for r in Y}
    Yu = np.array(list(ykeys.values()), dtype=Y.dtype)

    h = best_draw(lambda: draws.vector(d),
                  lambda h: generic_score(np.concatenate([L @ h, Yu @ h]), exact),
                  what="interpolation direction")
    lv, yv = list(L @ h), list(Y @ h)
    present = sorted(lv)
    every = sorted(lv + list(Yu @ h))
    cap = (every[-1] - every[0]) if len(every) > 1 else num(1, exact)
    blocks = []
    moves = zip(lv, yv, L, strict=True)
    for c, y, leader in tqdm(moves, total=len(lv), desc="interpolation hats", unit="hat",
                             disable=not progress, leave=False, delay=1):
        present.pop(bisect_left(present, c))
        i = bisect_left(present, c)
        near = [abs(present[k] - c) for k in (i - 1, i) if 0 <= k < len(present)]
        delta = min([cap] + near) / 2
        ff = ff_from_units(hat_units(h, 0 * c, c, delta, Y[len(blocks)] - leader),
                           num(1, exact), d, exact)
        blocks.append(Block(ff, None))
        j = bisect_left(present, y)
        if j == len(present) or present[j] != y:
            insort(present, y)
    return blocks, h
