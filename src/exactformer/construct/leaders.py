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
from bisect import bisect_left
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
    """Every token on the positive e1 axis: u' = g·x + g0, per sequence, and the extreme token
    that may carry the first hat inside the projection layer (None: no circle leader)."""

    g: np.ndarray
    g0: object
    uprime: list[list]
    first: tuple[int, int, int] | None  # (sequence, position, orientation ±1)


def circle_points(k: int, r0, exact: bool) -> list[tuple]:
    """k distinct rational points r0·(−(1−s²)/(1+s²), 2s/(1+s²)) of the circle of radius r0,
    first coordinate < 0, with s = tan(φ/2) rounded to a multiple of 2^-30 (distinct s give
    distinct points; checked)."""
    ss = [Fraction(round(math.tan((-math.pi / 2 + math.pi * (i + 0.5) / k) / 2) * 2 ** 30),
                   2 ** 30) for i in range(k)]
    if len(set(ss)) != k:
        raise ConstructionError(f"{k} circle leaders are too many for distinct circle points")
    pts = []
    for s in ss:
        den = 1 + s * s
        pts.append((num(-(1 - s * s) / den, exact) * r0, num(2 * s / den, exact) * r0))
    return pts


def choose_leaders(positions: list[np.ndarray], m: list[int], draws: Draws,
                   collapse_alpha=1, progress: bool = False, per_layer: int = 1) -> Leaders:
    """Leaders and collapse for tokens at ``positions`` (per sequence, n_j×d, after separation).

    ``collapse_alpha`` scales the collapse's A = α·I (softmax models fold 1/τ into it);
    ``per_layer`` hats share an FF layer after the first.
    """
    exact = draws.exact
    d = positions[0].shape[1]
    axis = _axis(positions, m, draws)
    chosen, moves = _pick(axis, m)
    circle = circle_points(len(moves), draws.rational(1, 2, 1024), exact)
    e1 = unit(d, 0, exact)
    points = [zeros((k, d), exact) for k in m]
    for j in range(len(m)):
        points[j][0] = e1 * axis.uprime[j][chosen[j][0]]
    flat = sorted(v for r in axis.uprime for v in r)
    hats = []
    for k, (j, i) in enumerate(tqdm(moves, desc="leader hats", unit="hat",
                                    disable=not progress, leave=False, delay=1)):
        q = zeros(d, exact)
        q[0], q[1] = circle[k]
        points[j][chosen[j].index(i)] = q
        hats.append(_leader_hat(axis, flat, axis.uprime[j][i], q, positions[j][i],
                                first=k == 0, exact=exact))
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
    lo, hi = min(raw), max(raw)
    spread = (hi - lo) if hi != lo else num(1, exact)
    g, g0 = g / spread, draws.rational(1, 2, 1024) - lo / spread  # u' ∈ [shift, shift + 1]
    flat_u = list(flat_pos @ g + g0)
    offsets = np.cumsum([0] + [len(p) for p in positions])
    uprime = [flat_u[offsets[j]:offsets[j + 1]] for j in range(len(positions))]
    ext = extreme(flat_u) if movers else None
    first = None
    if ext is not None:
        j0 = int(seq_of[ext[0]])
        first = (j0, int(ext[0] - offsets[j0]), ext[1])
    return _Axis(g, g0, uprime, first)


def _pick(axis: _Axis, m: list[int]) -> tuple[list[list[int]], list[tuple[int, int]]]:
    """Per sequence the P-leader (largest u' that stays) and m_j − 1 circle leaders (the extreme
    token where it must be one, then the most isolated); the moves, extreme token first."""
    iso = _isolations(axis.uprime)
    forced = {axis.first[0]: axis.first[1]} if axis.first else {}
    chosen, moves = [], []
    for j, (r, gaps) in enumerate(zip(axis.uprime, iso, strict=True)):
        rest = [i for i in range(len(r)) if i != forced.get(j)]
        pl = max(rest, key=lambda i: r[i])
        need = m[j] - 1 - (j in forced)
        rest = sorted((i for i in rest if i != pl), key=lambda i: (gaps[i], -i),
                      reverse=True)[:need] if need > 0 else []
        circ = ([forced[j]] if j in forced else []) + rest
        chosen.append([pl] + circ)
        moves += [(j, i) for i in circ]
    if axis.first:
        moves.insert(0, moves.pop(moves.index(axis.first[:2])))
    return chosen, moves


def _isolations(uprime: list[list]) -> list[np.ndarray]:
    """For every token, the distance from its u' to the nearest other u' (1 if alone)."""
    flat = np.asarray([v for r in uprime for v in r])
    order = np.argsort(flat, kind="stable")
    s = flat[order]
    gaps = s[1:] - s[:-1]
    near = np.empty(len(flat), dtype=flat.dtype)
    near[:] = [min([g for g in pair if g is not None], default=1) for pair in
               zip([None, *gaps.tolist()], [*gaps.tolist(), None], strict=True)]
    out = np.empty_like(near)
    out[order] = near
    return np.split(out, np.cumsum([len(r) for r in uprime])[:-1])


def _isolation(flat: list, v):
    """Distance from v (one of the sorted values ``flat``) to its nearest other value."""
    i = bisect_left(flat, v)
    gaps = [flat[k] - flat[k - 1] for k in (i, i + 1) if 0 < k < len(flat)]
    return min(gaps) if gaps else 1


def _leader_hat(axis: _Axis, flat: list, c, q, x, first: bool, exact: bool) -> list[Unit]:
    """The units moving the token at u' = c (position x) to the circle point q. The first one
    shares the non-residual projection layer, which every evaluator computes densely: it sits
    at the extreme token and is mirrored when that is the smallest, so every other token lies
    where all its units are exactly zero (docs/numerics.md#the-extreme-token-rule); it has no
    plateau, so float64 builds check that rounding cannot misplace it."""
    d = len(axis.g)
    e1 = unit(d, 0, exact)
    delta = min(num(1, exact) / 2, _isolation(flat, c) / 2)
    if not first:
        return hat_units(e1, 0 * c, c, delta, q - e1 * c)
    sign = axis.first[2] if axis.first else 1
    check_sloped_hat(axis.g, x, axis.g0, delta, exact)
    return [projection_unit(axis.g, axis.g0, e1),
            *hat_units(axis.g * sign, axis.g0 * sign, c * sign, delta, q - e1 * c,
                       plateau=False)]
