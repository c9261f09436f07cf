"""Phases 0 and 1 of DESIGN §4: projection onto one coordinate, then separation rounds.

After phase 0 every token is (u, 0, …) with u = a·x + a0 ∈ [1, 2], distinct tokens having
distinct u. Each separation round lifts one test token above every u (a hat) and lets every
token add λ_r·(its sequence's max u) to its second coordinate (a rank-one hardmax SA). Afterwards
sequences that share a token have different second coordinates σ_j, so no point is shared.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

import numpy as np
from tqdm import tqdm

from ..model import SA, Block, ScoreMatrix, ValueMatrix
from ..numbers import num, unit, zeros
from .gadgets import ff_from_units, hat_units, projection_unit
from .generic import Draws, best_draw, relative_gap, separated

PAIR_SAMPLE = 2000  # unresolved pairs looked at when choosing a test token


@dataclass
class TokenTable:
    """Distinct input tokens (rows of ``points``) and, per sequence, the ids of its tokens."""

    points: np.ndarray
    seqs: list[list[int]]

    @classmethod
    def build(cls, inputs: list[np.ndarray]) -> TokenTable:
        ids: dict[tuple, int] = {}
        rows, seqs = [], []
        for x in inputs:
            s = []
            for row in x:
                k = tuple(row.tolist())
                if k not in ids:
                    ids[k] = len(rows)
                    rows.append(row)
                s.append(ids[k])
            seqs.append(s)
        return cls(np.array(rows, dtype=inputs[0].dtype), seqs)


@dataclass
class Separation:
    a: np.ndarray  # u = a·x + a0 for an original token x
    a0: object
    u: list  # u of every distinct token after the lifts
    sigma: list  # second coordinate of every token of sequence j
    tests: list[int | None] = field(default_factory=list)  # None: a round without a lift
    blocks: list[Block] = field(default_factory=list)
    lifts: list[dict] = field(default_factory=list)

    @property
    def R(self) -> int:
        return len(self.blocks)


def project(table: TokenTable, draws: Draws) -> tuple[np.ndarray, object, list]:
    """Phase 0: a direction with a·x distinct over distinct tokens, rescaled so u ∈ [1, 2]."""
    exact, d = draws.exact, table.points.shape[1]

    def score(a):
        vals = list(table.points @ a)
        return relative_gap(vals) if separated(vals, exact) else None

    a = best_draw(lambda: draws.vector(d), score, what="projection direction")
    t = table.points @ a
    lo, hi = min(t), max(t)
    spread = (hi - lo) if hi != lo else num(1, exact)
    a_s = a / spread
    a0 = 1 - lo / spread
    return a_s, a0, list(table.points @ a_s + a0)


def sharing_pairs(table: TokenTable) -> list[tuple[int, int]]:
    owners = defaultdict(list)
    for j, s in enumerate(table.seqs):
        for t in s:
            owners[t].append(j)
    pairs = set()
    for js in owners.values():
        for i in range(len(js)):
            for k in range(i + 1, len(js)):
                pairs.add((js[i], js[k]))
    return sorted(pairs)


def separate(table: TokenTable, draws: Draws, progress: bool = False) -> Separation:
    exact = draws.exact
    d = table.points.shape[1]
    a, a0, u = project(table, draws)
    N = len(table.seqs)
    pairs = sharing_pairs(table)
    sep = Separation(a, a0, u, [num(0, exact)] * N)
    if not pairs:
        return sep
    sets = [set(s) for s in table.seqs]
    owners = defaultdict(list)
    for j, s in enumerate(sets):
        for t in s:
            owners[t].append(j)
    cur = [max(u[t] for t in s) for s in table.seqs]
    history: list[list] = []
    unresolved = pairs
    e1, e2 = unit(d, 0, exact), unit(d, 1, exact)
    # A first round without a lift records every sequence's own maximum: it splits each pair
    # whose maxima differ and leaves the densely evaluated first layer without hat units.
    if any(cur[j] != cur[k] for j, k in unresolved):
        sep.blocks.append(Block(ff_from_units([projection_unit(a, a0, e1)], num(0, exact), d,
                                              exact), None))
        history.append(list(cur))
        sep.tests.append(None)
        unresolved = [(j, k) for j, k in unresolved if cur[j] == cur[k]]
    bar = tqdm(desc="separation rounds", unit="round", disable=not progress, leave=False, delay=1)
    while unresolved:
        bar.update()
        sample = unresolved if len(unresolved) <= PAIR_SAMPLE else \
            draws.rng.sample(unresolved, PAIR_SAMPLE)
        votes = Counter()
        for j, k in sample:
            votes.update(sets[j] ^ sets[k])
        p = min(votes, key=lambda t: (-votes[t], t))
        top = max(u) + 1
        c = u[p]
        others = [abs(v - c) for i, v in enumerate(u) if i != p]
        delta = min([num(1, exact) / 2] + [g / 2 for g in others])
        units = hat_units(e1, 0 * c, c, delta, e1 * (top - c))
        if not sep.blocks:  # the first round also projects (phase 0): read u = a·x + a0
            units = [projection_unit(a, a0, e1),
                     *hat_units(a, a0, c, delta, e1 * (top - c), plateau=False)]
        ff = ff_from_units(units, num(0 if not sep.blocks else 1, exact), d, exact)
        u[p] = top
        for j in owners[p]:
            cur[j] = top
        history.append(list(cur))
        sep.tests.append(p)
        sep.lifts.append({"round": len(history) - 1, "token": p, "from": str(c), "to": str(top),
                          "delta": str(delta)})
        sep.blocks.append(Block(ff, None))
        unresolved = [(j, k) for j, k in unresolved if cur[j] == cur[k]]
    bar.close()
    M = np.array(history, dtype=object if exact else float)  # R × N sequence maxima

    def score(lams):
        sig = list(np.asarray(lams) @ M)
        gaps = [abs(sig[j] - sig[k]) for j, k in pairs]
        scale = max(abs(float(s)) for s in sig) or 1.0
        if min(gaps) == 0 or (not exact and float(min(gaps)) < 256 * 2.2e-16 * scale):
            return None
        return float(min(gaps)) / scale

    top = max(u) + 1
    lams = best_draw(lambda: [draws.rational(1, 2, 1024) / top for _ in history], score,
                     what="separation multipliers")
    sep.sigma = list(np.asarray(lams) @ M)
    for blk, lam in zip(sep.blocks, lams, strict=True):
        blk.sa = SA(num(1, exact), ScoreMatrix(num(0, exact), e1, e1),
                    ValueMatrix(num(0, exact), e2 * lam, e1))
    for rec in sep.lifts:
        rec["lambda"] = str(lams[rec["round"]])
    return sep


def separated_positions(inputs: list[np.ndarray], table: TokenTable, sep: Separation,
                        exact: bool) -> list[np.ndarray]:
    """Where hardmax separation leaves every token: the input itself when R = 0, else
    (u, σ_j, 0, …) — in exact arithmetic, as the construction computed it."""
    if not sep.R:
        return inputs
    out = []
    for j, s in enumerate(table.seqs):
        p = zeros((len(s), table.points.shape[1]), exact)
        p[:, 0] = [sep.u[t] for t in s]
        p[:, 1] = sep.sigma[j]
        out.append(p)
    return out
