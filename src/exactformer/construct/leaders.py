"""Phase 2 of DESIGN §4: every token onto the positive u-axis, leaders out, then the collapse.

A non-residual FF maps each token to u' = g·x + g0 > 0 on the e1 axis, all u' distinct. In each
sequence the token with the largest u' is the P-leader and stays; m_j − 1 further tokens (the most
isolated ones, so hats can be wide) move by a hat each to rational points of a half circle in
u < 0. The last block's SA (A = V = I, ρ = 0, hardmax) then sends every token onto its leader.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
from tqdm import tqdm

from ..model import SA, Block, ScoreMatrix, ValueMatrix
from ..numbers import num, unit, zeros
from .gadgets import ff_from_units, hat_units, projection_unit
from .generic import ConstructionError, Draws, best_draw, relative_gap, separated


@dataclass
class Leaders:
    blocks: list[Block]
    points: list[np.ndarray]  # per sequence: its m_j leader points (P-leader first)
    chosen: list[list[int]]  # per sequence: token positions (in X_j) of the leaders
    uprime: list[list]  # per sequence: u' of each token after the projection


def circle_points(k: int, r0, exact: bool) -> list[tuple]:
    """k distinct rational points of the circle of radius r0 with first coordinate < 0."""
    pts = []
    for i in range(k):
        phi = -math.pi / 2 + math.pi * (i + 0.5) / k
        s = Fraction(math.tan(phi / 2)).limit_denominator(10 ** 6)
        den = 1 + s * s
        pts.append((num(-(1 - s * s) / den, exact) * r0, num(2 * s / den, exact) * r0))
    return pts


def choose_leaders(positions: list[np.ndarray], m: list[int], draws: Draws,
                   collapse_alpha=1, progress: bool = False) -> Leaders:
    """Leaders and collapse for tokens at ``positions`` (per sequence, n_j×d, after separation).

    The first leader hat shares the non-residual projection FF, which every implementation
    evaluates densely; it is placed at an *extreme* token (largest or smallest u'), oriented so
    that every other token lies where all its units are exactly zero, so float rounding of the
    cancelling ReLUs cannot disturb any other token. ``collapse_alpha`` scales the collapse's
    A = α·I (softmax models fold 1/τ into it).
    """
    exact = draws.exact
    d = positions[0].shape[1]
    e1 = unit(d, 0, exact)
    N = len(positions)
    flat_pos = np.concatenate(positions, axis=0)
    seq_of = np.repeat(np.arange(N), [len(p) for p in positions])
    movers = sum(k - 1 for k in m)

    def extreme(vals):
        """(index, orientation) of an extreme token that may become a circle leader."""
        top, bottom = int(np.argmax(vals)), int(np.argmin(vals))
        if m[seq_of[top]] >= 2:
            return top, 1
        if m[seq_of[bottom]] >= 2:
            return bottom, -1
        return None

    def score(g, need_extreme):
        vals = list(flat_pos @ g)
        if not separated(vals, exact) or (need_extreme and extreme(vals) is None):
            return None
        return relative_gap(vals)

    try:
        g = best_draw(lambda: draws.vector(d), lambda g: score(g, movers > 0), limit=64,
                      what="leader projection with an extreme circle leader")
    except ConstructionError:  # no draw puts a movable token at an end: any generic one
        g = best_draw(lambda: draws.vector(d), lambda g: score(g, False),
                      what="leader projection")
    raw = flat_pos @ g
    lo, hi = min(raw), max(raw)
    spread = (hi - lo) if hi != lo else num(1, exact)
    shift = draws.rational(1, 2, 1024)
    g, g0 = g / spread, shift - lo / spread  # u' = g·x + g0 ∈ [shift, shift + 1]
    flat_u = list(flat_pos @ g + g0)
    offsets = np.cumsum([0] + [len(p) for p in positions])
    uprime = [flat_u[offsets[j]:offsets[j + 1]] for j in range(N)]
    flat = sorted(flat_u)

    def isolation(v):
        i = bisect_left(flat, v)
        gaps = [flat[i] - flat[i - 1]] if i > 0 else []
        if i + 1 < len(flat):
            gaps.append(flat[i + 1] - flat[i])
        return min(gaps) if gaps else num(1, exact)

    first = extreme(flat_u) if movers else None
    forced = {}  # sequence -> token that must be a circle leader (the extreme one)
    if first is not None:
        j0 = int(seq_of[first[0]])
        forced[j0] = int(first[0] - offsets[j0])
    chosen, moves = [], []
    for j, r in enumerate(uprime):
        rest = [i for i in range(len(r)) if i != forced.get(j)]
        pl = max(rest, key=lambda i: r[i])  # the P-leader: largest u' that stays
        rest = sorted((i for i in rest if i != pl), key=lambda i: (isolation(r[i]), -i),
                      reverse=True)
        circ = ([forced[j]] if j in forced else []) + rest[: m[j] - 1 - (j in forced)]
        chosen.append([pl] + circ)
        moves += [(j, i) for i in circ]
    if first is not None:  # the extreme token moves first, inside the projection FF
        moves.insert(0, moves.pop(moves.index((j0, forced[j0]))))
    r0 = draws.rational(1, 2, 1024)
    circle = circle_points(len(moves), r0, exact)
    points = []
    for j in range(N):
        pts = zeros((m[j], d), exact)
        pts[0] = e1 * uprime[j][chosen[j][0]]
        points.append(pts)
    units_first = [projection_unit(g, g0, e1)]
    ffs = []
    for k, (j, i) in enumerate(tqdm(moves, desc="leader hats", unit="hat",
                                    disable=not progress, leave=False, delay=1)):
        c = uprime[j][i]
        delta = min(num(1, exact) / 2, isolation(c) / 2)
        q = zeros(d, exact)
        q[0], q[1] = circle[k]
        points[j][chosen[j].index(i)] = q
        if not ffs:
            sign = first[1] if first is not None else 1  # -1: mirrored, zero to the right
            units_first += hat_units(g * sign, g0 * sign, c * sign, delta, q - e1 * c,
                                     plateau=False)
            ffs.append(ff_from_units(units_first, num(0, exact), d, exact))
        else:
            ffs.append(ff_from_units(hat_units(e1, 0 * c, c, delta, q - e1 * c), num(1, exact),
                                     d, exact))
    if not ffs:
        ffs.append(ff_from_units(units_first, num(0, exact), d, exact))
    blocks = [Block(ff, None) for ff in ffs]
    one, zero = num(1, exact), num(0, exact)
    z = zeros(d, exact)
    blocks[-1].sa = SA(zero, ScoreMatrix(num(collapse_alpha, exact), z, z), ValueMatrix(one, z, z))
    return Leaders(blocks, points, chosen, uprime)
