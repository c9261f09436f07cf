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

from ..model import SA, Block, LowRank
from ..numbers import num, unit, zeros
from .gadgets import ff_from_units, hat_units, projection_unit
from .generic import Draws, best_draw, relative_gap, separated
from .separation import Separation


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


def choose_leaders(coords: list[list[tuple]], sep: Separation, m: list[int], draws: Draws,
                   collapse_alpha=1, progress: bool = False) -> Leaders:
    """coords[j][i] = (u, v) of token i of sequence j after separation (v = 0 when R = 0).

    ``collapse_alpha`` scales the collapse's A = α·I (softmax models fold 1/τ into it).
    """
    exact = draws.exact
    d = sep.a.shape[0]
    e1 = unit(d, 0, exact)
    N = len(coords)
    raw = [[u for u, _ in r] for r in coords]
    if sep.R:  # tokens are (u, v): a generic slope γ makes u + γv distinct over all tokens
        flat_u = [u for r in coords for u, _ in r]
        flat_v = [v for r in coords for _, v in r]
        umax = max(flat_u)
        vmax = max(abs(v) for v in flat_v) or num(1, exact)

        def score(g):
            vals = [a + g * b for a, b in zip(flat_u, flat_v, strict=True)]
            return relative_gap(vals) if separated(vals, exact) else None

        gamma = best_draw(lambda: draws.rational(1, 4, 1024) * umax / vmax, score,
                          what="leader slope")
        raw = [[u + gamma * v for u, v in r] for r in coords]
    flat = sorted(v for r in raw for v in r)
    lo, hi = flat[0], flat[-1]
    spread = (hi - lo) if hi != lo else num(1, exact)
    shift = draws.rational(1, 2, 1024)
    uprime = [[(v - lo) / spread + shift for v in r] for r in raw]
    flat = sorted(v for r in uprime for v in r)

    def isolation(v):
        i = bisect_left(flat, v)
        gaps = [flat[i] - flat[i - 1]] if i > 0 else []
        if i + 1 < len(flat):
            gaps.append(flat[i + 1] - flat[i])
        return min(gaps) if gaps else num(1, exact)

    # the map x -> u' as (g, g0): reads a·x + a0 when there was no separation, else u + γv
    if sep.R:
        g = (e1 + unit(d, 1, exact) * gamma) / spread
        g0 = shift - lo / spread
    else:
        g = sep.a / spread
        g0 = (sep.a0 - lo) / spread + shift

    chosen, moves = [], []
    for j, r in enumerate(uprime):
        order = sorted(range(len(r)), key=lambda i: r[i], reverse=True)
        pl = order[0]
        rest = sorted(order[1:], key=lambda i: (isolation(r[i]), -i), reverse=True)
        circ = rest[: m[j] - 1]
        chosen.append([pl] + circ)
        moves += [(j, i) for i in circ]
    r0 = draws.rational(1, 2, 1024)
    circle = circle_points(len(moves), r0, exact)
    points = []
    for j in range(N):
        pts = zeros((m[j], d), exact)
        pts[0] = e1 * uprime[j][chosen[j][0]]
        points.append(pts)
    k = 0
    units_first = [projection_unit(g, g0, e1)]
    ffs = []
    for j, i in tqdm(moves, desc="leader hats", unit="hat", disable=not progress, leave=False):
        c = uprime[j][i]
        delta = min(num(1, exact) / 2, isolation(c) / 2)
        q = zeros(d, exact)
        q[0], q[1] = circle[k]
        slot = chosen[j].index(i)
        points[j][slot] = q
        k += 1
        if not ffs:
            units_first += hat_units(g, g0, c, delta, q - e1 * c, plateau=False)
            ffs.append(ff_from_units(units_first, num(0, exact), d, exact))
        else:
            ffs.append(ff_from_units(hat_units(e1, 0 * c, c, delta, q - e1 * c), num(1, exact),
                                     d, exact))
    if not ffs:
        ffs.append(ff_from_units(units_first, num(0, exact), d, exact))
    blocks = [Block(ff, None) for ff in ffs]
    one, zero = num(1, exact), num(0, exact)
    blocks[-1].sa = SA(zero, LowRank(num(collapse_alpha, exact), zeros(d, exact), zeros(d, exact)),
                       LowRank(one, zeros(d, exact), zeros(d, exact)))
    return Leaders(blocks, points, chosen, uprime)
