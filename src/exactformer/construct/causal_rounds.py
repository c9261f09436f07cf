"""Causal contexts and the greedy planner of separation rounds (docs/causal.md).

A *context* is (sequence j, position i) and a *point* a (position, token): contexts at one
point see different prefixes only through attention. A round's tests are points; a context's
outcome in a register is the prefix maximum of the register's values, and the classes of
contexts are refined by the outcomes until no class holds two different targets. The hat
construction (construct/causal.py) and the keyed one (construct/keyed_causal.py) share it.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from itertools import accumulate

import numpy as np

from .generic import Draws

PAIR_SAMPLE = 200  # conflicting pairs looked at when choosing a test point


@dataclass
class Contexts:
    """The data in the construction's arithmetic, with a point id per context."""

    xs: list[np.ndarray]
    ys: list[np.ndarray]
    known: list[np.ndarray]
    pid: list[np.ndarray]  # per sequence: the point (token, position) of each position
    first: list[tuple[int, int]]  # per point: a context where it occurs
    exact: bool
    d: int
    per_layer: int = 1  # hats, snaps and separation tests per layer (width/4)
    channels: int = 1  # separation registers, one head each (docs/causal.md)


def contexts(xs, ys, known, exact: bool, d: int) -> Contexts:
    ids: dict[tuple, int] = {}
    pid, first = [], []
    for j, x in enumerate(xs):
        row = np.empty(len(x), dtype=np.int64)
        for i, tok in enumerate(x):
            key = (i, tuple(tok.tolist()))
            if key not in ids:
                ids[key] = len(first)
                first.append((j, i))
            row[i] = ids[key]
        pid.append(row)
    return Contexts(xs, ys, known, pid, first, exact, d)


def conflicted(ctx: Contexts, cls: list[np.ndarray]) -> list[list[list[tuple[int, int]]]]:
    """Per class with two or more different targets: its contexts grouped by target."""
    groups: dict[int, dict[tuple, list]] = defaultdict(dict)
    for j, (c, k) in enumerate(zip(cls, ctx.known, strict=True)):
        for i in np.flatnonzero(k).tolist():
            groups[int(c[i])].setdefault(tuple(ctx.ys[j][i].tolist()), []).append((j, i))
    return [list(g.values()) for g in groups.values() if len(g) > 1]


def conflict_weight(conflicts) -> int:
    """The number of pairs of contexts in one class with different targets: 0 iff no class
    conflicts, and it drops whenever a refinement splits such a pair."""
    return sum(sum(map(len, g)) ** 2 - sum(len(x) ** 2 for x in g) for g in conflicts) // 2


def prefix_max(ctx: Contexts, u: np.ndarray) -> list[list]:
    return [list(accumulate(u[p].tolist(), max)) for p in ctx.pid]


def refine(cls: list[np.ndarray], M: list[list]) -> list[np.ndarray]:
    ids: dict[tuple, int] = {}
    return [np.array([ids.setdefault((int(c), m), len(ids)) for c, m in zip(cj, mj, strict=True)],
                     dtype=np.int64) for cj, mj in zip(cls, M, strict=True)]


def choose_test(ctx: Contexts, conflicts, draws: Draws, skip=frozenset()) -> int | None:
    """The point, not in ``skip``, in the most symmetric differences of sampled conflicting
    pairs' prefixes (None when there is none)."""
    pairs = [(g[0], h[0]) for groups in conflicts
             for a, g in enumerate(groups) for h in groups[a + 1:]]
    if len(pairs) > PAIR_SAMPLE:
        pairs = draws.rng.sample(pairs, PAIR_SAMPLE)
    votes: Counter = Counter()
    for (j, i), (k, _) in pairs:
        a, b = ctx.pid[j][: i + 1], ctx.pid[k][: i + 1]
        diff = np.flatnonzero(a != b)
        votes.update(a[diff].tolist())
        votes.update(b[diff].tolist())
    return min((t for t in votes if t not in skip), key=lambda t: (-votes[t], t), default=None)


@dataclass
class Round:
    """A planned round: its tests (channel, point) in lift order, the registers after it and
    the prefix maxima of the channels it reads (0 first), and the classes after it."""

    tests: list[tuple[int, int]]
    regs: dict[int, np.ndarray]
    maxima: dict[int, list[list]]
    cls: list[np.ndarray]
    weight: int


def outcome(ctx: Contexts, cls, regs: dict, tests, top) -> Round:
    """Lift the i-th test to height top + i in its channel; every context's outcome per
    channel read is the prefix maximum of that channel's register (docs/causal.md)."""
    new = {c: regs[c] if c in regs else regs[0] * 0 for c in {0} | {c for c, _ in tests}}
    for i, (c, p) in enumerate(tests):
        new[c] = new[c].copy()
        new[c][p] = top + i
    maxima = {c: prefix_max(ctx, new[c]) for c in sorted(new)}
    refined = cls
    for m in maxima.values():
        refined = refine(refined, m)
    return Round(tests, new, maxima, refined, conflict_weight(conflicted(ctx, refined)))


def plan_round(ctx: Contexts, cls, regs: dict, conflicts, draws: Draws, top) -> Round:
    """A round's tests: the greedy test in channel 0 (it splits a conflicting pair, since it
    goes above every register), then up to ``ctx.per_layer`` − 1 more, each the greedy test on
    the classes so far, in the channel (one used, or a fresh one up to ``ctx.channels``) whose
    true outcome lowers the conflict weight most; a test that lowers nothing ends the round."""
    best = outcome(ctx, cls, regs, [(0, choose_test(ctx, conflicts, draws))], top)
    while len(best.tests) < ctx.per_layer and best.weight:
        q = choose_test(ctx, conflicted(ctx, best.cls), draws,
                         skip={p for _, p in best.tests})
        if q is None:
            break
        used = sorted({c for c, _ in best.tests} | {c for c in regs if c})
        fresh = [max(used) + 1] if max(used) + 1 < ctx.channels else []
        trial = min((outcome(ctx, cls, regs, best.tests + [(c, q)], top)
                     for c in used + fresh), key=lambda r: r.weight)
        if trial.weight >= best.weight:
            break
        best = trial
    return best

