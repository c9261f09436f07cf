"""Leaders and the collapse: every sequence becomes exactly its m_j leader points.

A non-residual FF maps each token to u' = g·x + g0 > 0 on the e1 axis, all u' distinct. In each
sequence the token with the largest u' is the P-leader and stays; m_j − 1 further tokens (the most
isolated ones, so hats can be wide) move by a hat each to rational points of a half circle in
u < 0, k hats to a layer of width 4k on disjoint windows of the u axis (docs/heads.md), the
first alone with the projection. The last block's attention (A = α·I, V = I, ρ = 0, hardmax)
then sends every token onto its leader. See docs/hardmax.md#leaders-and-the-collapse.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
from tqdm import tqdm

from ..model import SA, Block, ScoreMatrix, ValueMatrix
from ..numbers import num, unit, zeros
from .gadgets import Unit, ff_from_units, hat_units, projection_unit
from .generic import ConstructionError, Draws, best_draw, check_sloped_hat, generic_score


@dataclass
class Leaders:
    """The finished leader blocks (the last one ends with the collapse) and what they did."""

    blocks: list[Block]
    points: list[np.ndarray]  # per sequence: its m_j leader points (P-leader first)
    chosen: list[list[int]]  # per sequence: token positions (in X_j) of the leaders


@dataclass
class _Axis:
    """Every token on the positive e1 axis: u' = g·x + g0, sequences one after another (sequence
    j's tokens are u[start[j]:start[j+1]]), and the extreme token that may carry the first hat
    inside the projection layer (None: no circle leader)."""

    g: np.ndarray
    g0: object
    u: np.ndarray
    start: np.ndarray
    first: tuple[int, int, int] | None  # (sequence, position, orientation ±1)


def circle_points(k: int, r0, exact: bool) -> list[tuple]:
    """k distinct rational points r0·(−(1−s²)/(1+s²), 2s/(1+s²)) of the circle of radius r0,
    first coordinate < 0, with s = tan(φ/2) rounded to a multiple of 2^-30 (distinct s give
    distinct points; checked)."""
    one = 2 ** 60  # s = K/2^30: the point is r0·(−(2^60 − K²), 2^31·K)/(2^60 + K²)
    ks = [round(math.tan((-math.pi / 2 + math.pi * (i + 0.5) / k) / 2) * 2 ** 30)
          for i in range(k)]
    if len(set(ks)) != k:
        raise ConstructionError(f"{k} circle leaders are too many for distinct circle points")
    def ratio(a: int, b: int):  # float64: int / int is correctly rounded, as float(Fraction)
        return Fraction(a, b) if exact else a / b

    return [(ratio(K * K - one, one + K * K) * r0, ratio(2 ** 31 * K, one + K * K) * r0)
            for K in ks]


def choose_leaders(positions: list[np.ndarray], m: list[int], draws: Draws,
                   collapse_alpha=1, progress: bool = False, per_layer: int = 1) -> Leaders:
    """Leaders and collapse for tokens at ``positions`` (per sequence, n_j×d, after separation).

    ``collapse_alpha`` scales the collapse's A = α·I (softmax models fold 1/τ into it);
    ``per_layer`` hats share an FF layer after the first.
    """
    exact = draws.exact
    d = positions[0].shape[1]
    axis = _axis(positions, m, draws)
    by_u = np.argsort(axis.u)  # the u' are pairwise distinct (generic)
    iso = _isolations(axis.u, by_u)
    chosen, moves = _pick(axis, by_u, iso, m)
    circle = circle_points(len(moves), draws.rational(1, 2, 1024), exact)
    e1 = unit(d, 0, exact)
    points = [zeros((k, d), exact) for k in m]
    for j in range(len(m)):
        points[j][0] = e1 * axis.u[axis.start[j] + chosen[j][0]]
    hats, us, isos = [], axis.u.tolist(), iso.tolist()  # scalars, faster one at a time
    for k, (j, i) in enumerate(tqdm(moves, desc="leader hats", unit="hat",
                                    disable=not progress, leave=False, delay=1)):
        q = zeros(d, exact)
        q[0], q[1] = circle[k]
        points[j][chosen[j].index(i)] = q
        at = axis.start[j] + i
        hats.append(_leader_hat(axis, e1, isos[at], us[at], q, positions[j][i], first=k == 0,
                                exact=exact))
    ffs = [ff_from_units(hats[0], num(0, exact), d, exact)] if hats else []
    ffs += [ff_from_units([u for units in hats[s:s + per_layer] for u in units], num(1, exact),
                          d, exact) for s in range(1, len(hats), per_layer)]
    if not ffs:
        ffs.append(ff_from_units([projection_unit(axis.g, axis.g0, e1)], num(0, exact), d,
                                 exact))
    z = zeros(d, exact)
    collapse = SA(num(0, exact), ScoreMatrix(num(collapse_alpha, exact), z, z),
                  ValueMatrix(num(1, exact), z, z))
    blocks = [Block(ff, None) for ff in ffs[:-1]] + [Block(ffs[-1], collapse)]
    return Leaders(blocks, points, chosen)


def _axis(positions, m, draws: Draws) -> _Axis:
    """A generic g with every u' distinct, preferring one whose extreme token (largest u', else
    smallest) belongs to a sequence with m_j ≥ 2, so the first hat can sit there."""
    exact = draws.exact
    d = positions[0].shape[1]
    flat_pos = np.concatenate(positions, axis=0)
    seq_of = np.repeat(np.arange(len(positions)), [len(p) for p in positions])
    movers = sum(k - 1 for k in m) > 0

    def extreme(vals):
        for idx, sign in ((int(np.argmax(vals)), 1), (int(np.argmin(vals)), -1)):
            if m[seq_of[idx]] >= 2:
                return idx, sign
        return None

    def score(g, need_extreme):
        vals = np.asarray(flat_pos @ g)
        s = generic_score(vals, exact)
        return None if s is None or (need_extreme and extreme(vals) is None) else s

    try:
        g = best_draw(lambda: draws.vector(d), lambda g: score(g, movers), limit=64,
                      what="leader projection with an extreme circle leader")
    except ConstructionError:  # no draw puts a movable token at an end: any generic one
        g = best_draw(lambda: draws.vector(d), lambda g: score(g, False),
                      what="leader projection")
    raw = flat_pos @ g
    lo, hi = raw.min(), raw.max()
    spread = (hi - lo) if hi != lo else num(1, exact)
    g, g0 = g / spread, draws.rational(1, 2, 1024) - lo / spread  # u' ∈ [shift, shift + 1]
    flat_u = flat_pos @ g + g0
    start = np.cumsum([0] + [len(p) for p in positions])
    ext = extreme(flat_u) if movers else None
    first = None
    if ext is not None:
        j0 = int(seq_of[ext[0]])
        first = (j0, int(ext[0] - start[j0]), ext[1])
    return _Axis(g, g0, flat_u, start, first)


def _pick(axis: _Axis, by_u: np.ndarray, iso: np.ndarray, m: list[int]
          ) -> tuple[list[list[int]], list[tuple[int, int]]]:
    """Per sequence the P-leader (largest u' that stays) and m_j − 1 circle leaders (the extreme
    token where it must be one, then the most isolated: largest ``iso``, ties to the earlier
    position); the moves, extreme token first. ``by_u``: the tokens in increasing u'."""
    n, N = len(axis.u), len(m)
    seq_of = np.repeat(np.arange(N), np.diff(axis.start))
    free = np.ones(n, dtype=bool)  # neither forced onto the circle nor the P-leader
    need = np.asarray(m, dtype=np.int64) - 1
    if axis.first:
        free[axis.start[axis.first[0]] + axis.first[1]] = False
        need[axis.first[0]] -= 1
    rank = np.empty(n, dtype=np.int64)
    rank[by_u] = np.arange(n)
    leader = by_u[np.maximum.reduceat(np.where(free, rank, -1), axis.start[:-1])]
    free[leader] = False
    by_iso = np.argsort(-iso, kind="stable")  # most isolated first, ties in token order
    iso_rank = np.empty(n, dtype=np.int64)
    iso_rank[by_iso] = np.arange(n)
    order = np.argsort(seq_of * n + iso_rank)  # by sequence, then as in by_iso (keys distinct)
    order = order[free[order]]
    s = seq_of[order]
    taken = order[np.arange(len(order)) - np.searchsorted(s, s) < need[s]]
    circles = np.split(taken - axis.start[seq_of[taken]],
                       np.cumsum(np.bincount(seq_of[taken], minlength=N))[:-1])
    forced = {axis.first[0]: [axis.first[1]]} if axis.first else {}
    chosen, moves = [], []
    for j in range(N):
        circ = forced.get(j, []) + circles[j].tolist()
        chosen.append([int(leader[j] - axis.start[j])] + circ)
        moves += [(j, i) for i in circ]
    if axis.first:
        moves.insert(0, moves.pop(moves.index(axis.first[:2])))
    return chosen, moves


def _isolations(u: np.ndarray, order: np.ndarray) -> np.ndarray:
    """For every token, the distance from its u' to the nearest other u' (1 if alone);
    ``order`` sorts u."""
    s = u[order]
    near = np.empty(len(u), dtype=u.dtype)
    if len(u) == 1:
        near[0] = 1
    else:
        gaps = s[1:] - s[:-1]
        near[0], near[-1] = gaps[0], gaps[-1]
        near[1:-1] = np.minimum(gaps[:-1], gaps[1:])
    out = np.empty_like(near)
    out[order] = near
    return out


def _leader_hat(axis: _Axis, e1, iso, c, q, x, first: bool, exact: bool) -> list[Unit]:
    """The units moving the token at u' = c (position x, ``iso`` from the nearest other u') to
    the circle point q. The first one shares the non-residual projection layer, which every
    evaluator computes densely: it sits at the extreme token and is mirrored when that is the
    smallest, so every other token lies where all its units are exactly zero
    (docs/numerics.md#the-extreme-token-rule); it has no plateau, so float64 builds check that
    rounding cannot misplace it."""
    delta = min(num(1, exact) / 2, iso / 2)
    if not first:
        return hat_units(e1, 0 * c, c, delta, q - e1 * c)
    sign = axis.first[2] if axis.first else 1
    check_sloped_hat(axis.g, x, axis.g0, delta, exact)
    return [projection_unit(axis.g, axis.g0, e1),
            *hat_units(axis.g * sign, axis.g0 * sign, c * sign, delta, q - e1 * c,
                       plateau=False)]
