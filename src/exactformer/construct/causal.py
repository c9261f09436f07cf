"""The causal (decoder) construction: an exact target at every position (docs/causal.md).

A *context* is (sequence j, position i); its output may depend on the ordered prefix only.

1. **Positions.** Generic small dyadic rows P_i are stored with the model and added to the token
   at position i, so every (token, position) is its own *point*: repeated tokens differ, and the
   set of points of a prefix fixes the ordered prefix.
2. **Separation (R_c blocks, none when no two contexts at one point have different targets).**
   A non-residual FF projects every point to u = a·z + a0 ∈ [1, 2]; round r lifts one test
   point above every u (a hat on u) and a causal rank-one attention (A = e1·e1ᵀ, so token i
   attends to the prefix maximum of u) adds λ_r·max_{l≤i} u_l to v = x[1]. A context's state is
   then (u, Σ_r λ_r·M_r): a function of its prefix. Contexts at one point with different
   targets are split by lifting a point of the symmetric difference of their prefixes (the one
   that splits most sampled pairs); generic λ make distinct signatures distinct states.
3. **Interpolation.** Hardmax: one residual hat per distinct state that has a target and is not
   on it, along a generic direction h (windows avoid the states still to move and the targets
   already placed). Softmax: the forward pass is simulated, a non-residual FF projects onto a
   line and one interval snap per state sends its whole blob to its target.

L = R_c + moves (hardmax) or R_c + 1 + snaps (softmax).
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from fractions import Fraction
from itertools import accumulate

import numpy as np
from tqdm import tqdm

from ..causal_data import CausalDataset
from ..evaluate import forward_causal, with_positions
from ..model import SA, Block, ScoreMatrix, Transformer, ValueMatrix
from ..numbers import as_number_array, num, unit
from ..record import CausalConstruction, CausalLift, Span
from .gadgets import ff_from_units, hat_units, projection_unit, snap_units
from .generic import (
    ConstructionError,
    Draws,
    best_draw,
    generic_score,
    relative_gap,
    separated,
)
from .softmax import parse_tau

REDRAWS = 20  # fresh positions (and everything after) on a coincidence of generic choices
PAIR_SAMPLE = 200  # conflicting pairs looked at when choosing a test point
THETA_MIN = 2.0 ** -40
MIN_RELATIVE_GAP = 1e-9


class _Redraw(ConstructionError):
    """A coincidence of the generic choices (a target on a state to move): draw again."""


@dataclass
class _Contexts:
    """The data in the construction's arithmetic, with a point id per context."""

    xs: list[np.ndarray]
    ys: list[np.ndarray]
    known: list[np.ndarray]
    pid: list[np.ndarray]  # per sequence: the point (token, position) of each position
    first: list[tuple[int, int]]  # per point: a context where it occurs
    exact: bool
    d: int


@dataclass
class _Separation:
    blocks: list[Block] = field(default_factory=list)
    cls: list[np.ndarray] = field(default_factory=list)  # per sequence: class id per position
    lifts: list[CausalLift] = field(default_factory=list)


def compile_causal(dataset: CausalDataset, attention: str = "hardmax", exact: bool = True,
                   seed: int = 0, tau=None, progress: bool = False) -> Transformer:
    """A causal transformer whose output at every constrained position equals its target."""
    if attention not in ("hardmax", "softmax"):
        raise ValueError(f"attention must be 'hardmax' or 'softmax', got {attention!r}")
    if attention == "hardmax" and tau is not None:
        raise ValueError("tau applies to softmax attention only")
    xs, ys = dataset.fractions() if exact else dataset.floats()
    ctx = _contexts(xs, ys, list(dataset.known), exact, dataset.d)
    draws = Draws(seed, exact)
    for _ in range(REDRAWS):
        try:
            if attention == "hardmax":
                model = _build_hardmax(ctx, draws, progress)
            else:
                model = _build_softmax(ctx, draws, tau, progress)
            break
        except _Redraw as e:
            last = e
    else:
        raise ConstructionError(f"every one of {REDRAWS} draws of the positions met a "
                                f"coincidence (the last: {last})")
    model.record.seed = seed
    return model


def _contexts(xs, ys, known, exact: bool, d: int) -> _Contexts:
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
    return _Contexts(xs, ys, known, pid, first, exact, d)


def _draw_positions(ctx: _Contexts, draws: Draws) -> np.ndarray:
    """Generic dyadic rows of size about a quarter of the coordinate scale."""
    n = max(len(x) for x in ctx.xs)
    scale = max([1.0] + [float(abs(v)) for x in ctx.xs for v in x.flat])
    s = num(Fraction(2) ** (math.floor(math.log2(scale)) - 2), ctx.exact)
    P = np.empty((n, ctx.d), dtype=object if ctx.exact else float)
    for i in range(n):
        P[i] = draws.vector(ctx.d) * s
    return P


def _points(ctx: _Contexts, zs: list[np.ndarray]) -> np.ndarray:
    return np.array([zs[j][i] for j, i in ctx.first], dtype=zs[0].dtype)


# ------------------------------------------------------------------------------ separation
def _conflicted(ctx: _Contexts, cls: list[np.ndarray]) -> list[list[list[tuple[int, int]]]]:
    """Per class with two or more different targets: its contexts grouped by target."""
    groups: dict[int, dict[tuple, list]] = defaultdict(dict)
    for j, (c, k) in enumerate(zip(cls, ctx.known, strict=True)):
        for i in np.flatnonzero(k).tolist():
            groups[int(c[i])].setdefault(tuple(ctx.ys[j][i].tolist()), []).append((j, i))
    return [list(g.values()) for g in groups.values() if len(g) > 1]


def _project(points: np.ndarray, draws: Draws):
    """A direction a with a·z distinct over the points, scaled so that u = a·z + a0 ∈ [1, 2]."""
    exact = draws.exact

    a = best_draw(lambda: draws.vector(points.shape[1]),
                  lambda a: generic_score(points @ a, exact), what="projection direction")
    t = points @ a
    lo, hi = min(t), max(t)
    spread = (hi - lo) if hi != lo else num(1, exact)
    return a / spread, 1 - lo / spread


def _prefix_max(ctx: _Contexts, u: np.ndarray) -> list[list]:
    return [list(accumulate(u[p].tolist(), max)) for p in ctx.pid]


def _refine(cls: list[np.ndarray], M: list[list]) -> list[np.ndarray]:
    ids: dict[tuple, int] = {}
    return [np.array([ids.setdefault((int(c), m), len(ids)) for c, m in zip(cj, mj, strict=True)],
                     dtype=np.int64) for cj, mj in zip(cls, M, strict=True)]


def _choose_test(ctx: _Contexts, conflicts, draws: Draws) -> int:
    """The point in the most symmetric differences of sampled conflicting pairs' prefixes
    (every such point is still unlifted: a lifted one would have split the pair)."""
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
    return min(votes, key=lambda t: (-votes[t], t))


def _separate(ctx: _Contexts, points: np.ndarray, draws: Draws, score_scale,
              progress: bool) -> _Separation:
    """Rounds until no class holds two different targets; see the module docstring. The rounds
    are planned first (their FFs and the prefix maxima), then the multipliers are drawn and each
    block is built whole."""
    exact, d = ctx.exact, ctx.d
    e1, e2 = unit(d, 0, exact), unit(d, 1, exact)
    a, a0 = _project(points, draws)
    u = as_number_array(points @ a + a0, exact)
    ffs = [ff_from_units([projection_unit(a, a0, e1)], num(0, exact), d, exact)]
    history = [_prefix_max(ctx, u)]
    cls = _refine(ctx.pid, history[0])
    lifted = []  # (round, sequence, position, from, to) of each lift
    bar = tqdm(desc="causal separation rounds", unit="round", disable=not progress,
               leave=False, delay=1)
    while conflicts := _conflicted(ctx, cls):
        if len(ffs) > len(u):  # each round splits a class of contexts
            raise ConstructionError("causal separation did not finish in one round per context")
        bar.update()
        p = _choose_test(ctx, conflicts, draws)
        top, c = max(u) + 1, u[p]
        gaps = np.abs(np.delete(u, p) - c)
        delta = min([num(1, exact) / 2, *([gaps.min() / 2] if len(gaps) else [])])
        ffs.append(ff_from_units(hat_units(e1, 0 * c, c, delta, e1 * (top - c)), num(1, exact),
                                 d, exact))
        lifted.append((len(history), *ctx.first[p], str(c), str(top)))
        u[p] = top
        history.append(_prefix_max(ctx, u))
        cls = _refine(cls, history[-1])
    bar.close()
    lams = _multipliers(ctx, cls, history, draws, max(u) + 1)
    blocks = [Block(ff, SA(num(1, exact), ScoreMatrix(num(0, exact), e1 * score_scale, e1),
                           ValueMatrix(num(0, exact), e2 * lam, e1)))
              for ff, lam in zip(ffs, lams, strict=True)]
    return _Separation(blocks, cls, [CausalLift(*x, str(lams[x[0]])) for x in lifted])


def _multipliers(ctx: _Contexts, cls, history, draws: Draws, top) -> list:
    """λ_r such that distinct signatures (M_0..M_R) at one point give distinct v = Σ λ_r M_r
    (exactly, or apart by more than float64 rounding), the widest of a few draws."""
    sig: dict[int, tuple[int, tuple]] = {}
    for j, cj in enumerate(cls):
        for i, c in enumerate(cj.tolist()):
            if c not in sig:
                sig[c] = (int(ctx.pid[j][i]), tuple(h[j][i] for h in history))
    by_point = defaultdict(list)
    for p, s in sig.values():
        by_point[p].append(s)
    groups = [np.array(g, dtype=object if ctx.exact else float) for g in by_point.values()
              if len(g) > 1]

    def score(lams):
        worst = 1.0
        for g in groups:
            v = list(g @ np.asarray(lams))
            if not separated(v, ctx.exact):
                return None
            worst = min(worst, relative_gap(v) * float(max(v) - min(v)) /
                        max(abs(float(x)) for x in v))
        return worst

    return best_draw(lambda: [draws.rational(1, 2, 1024) / top for _ in history], score,
                     what="separation multipliers")


def _states(ctx: _Contexts, P, blocks: list[Block], attention: str, tau, arithmetic: str):
    """Every context's point after the separation blocks (the positioned inputs if none)."""
    if not blocks:
        return with_positions(P, ctx.xs)
    model = Transformer(ctx.d, attention, blocks, tau=tau, exact=ctx.exact, causal=True,
                        positions=P)
    return forward_causal(model, ctx.xs, arithmetic)


def _targeted_classes(ctx: _Contexts, cls) -> dict[int, tuple[tuple[int, int], np.ndarray]]:
    """Class id → (its first constrained context, its target), for classes with a target."""
    out: dict = {}
    for j, (c, k) in enumerate(zip(cls, ctx.known, strict=True)):
        for i in np.flatnonzero(k).tolist():
            out.setdefault(int(c[i]), ((j, i), ctx.ys[j][i]))
    return out


def _separation_phase(ctx: _Contexts, draws: Draws, score_scale, progress: bool):
    P = _draw_positions(ctx, draws)
    zs = with_positions(P, ctx.xs)
    points = _points(ctx, zs)
    if len({tuple(z.tolist()) for z in points}) < len(points):
        raise _Redraw("positions made two points coincide")
    sep = _Separation(cls=ctx.pid) if not _conflicted(ctx, ctx.pid) else \
        _separate(ctx, points, draws, score_scale, progress)
    return P, sep


# ------------------------------------------------------------------------------ hardmax
def _build_hardmax(ctx: _Contexts, draws: Draws, progress: bool) -> Transformer:
    exact, d = ctx.exact, ctx.d
    P, sep = _separation_phase(ctx, draws, num(1, exact), progress)
    states = _states(ctx, P, sep.blocks, "hardmax", None, "exact" if exact else "float")
    items = [(states[j][i], y) for (j, i), y in _targeted_classes(ctx, sep.cls).values()]
    if exact:
        _check_classes(states, sep.cls)
    hats, h = _hats(items, d, draws, progress)
    blocks = sep.blocks + hats
    R = len(sep.blocks)
    record = _record(ctx, "causal-hardmax", P, R, len(hats),
                     [Span("separation", 0, R), Span("interpolation", R, len(blocks))], sep)
    record.interpolation_direction = [str(v) for v in h]
    return Transformer(d=d, attention="hardmax", blocks=blocks, exact=exact, causal=True,
                       positions=P, record=record)


def _record(ctx: _Contexts, kind: str, P, R: int, moves: int, phases: list[Span],
            sep: _Separation) -> CausalConstruction:
    """The construction record (the seed is filled in by :func:`compile_causal`)."""
    return CausalConstruction(kind=kind, seed=0, N=len(ctx.xs),
                              constrained=int(sum(k.sum() for k in ctx.known)),
                              stored_positions=len(P), R=R, moves=moves, phases=phases,
                              lifts=sep.lifts)


def _check_classes(states, cls) -> None:
    """Contexts of one class share their state (exact arithmetic); anything else is a bug."""
    seen: dict[int, tuple] = {}
    for s, c in zip(states, cls, strict=True):
        for row, k in zip(s, c.tolist(), strict=True):
            if seen.setdefault(k, tuple(row.tolist())) != tuple(row.tolist()):
                raise ConstructionError("internal error: contexts of one separation class "
                                        "reached different states")


def _hats(items: list[tuple[np.ndarray, np.ndarray]], d: int, draws: Draws, progress: bool):
    """One residual hat per (state, target) with state ≠ target, read along a generic h."""
    exact = draws.exact
    moving = [(s, y) for s, y in items if tuple(s.tolist()) != tuple(y.tolist())]
    fixed = [s for s, y in items if tuple(s.tolist()) == tuple(y.tolist())]
    to_move = {tuple(s.tolist()) for s, _ in moving}
    if any(tuple(y.tolist()) in to_move for _, y in moving):
        raise _Redraw("a target coincides with a state still to move")
    if not moving:
        return [], unit(d, 0, exact)
    distinct = {tuple(v.tolist()): v for v in [s for s, _ in moving] + [y for _, y in items]}
    V = np.array(list(distinct.values()), dtype=moving[0][0].dtype)

    h = best_draw(lambda: draws.vector(d), lambda h: generic_score(V @ h, exact),
                  what="interpolation direction")
    every = sorted(V @ h)
    cap = every[-1] - every[0]
    present = sorted([s @ h for s, _ in moving] + [s @ h for s in fixed])
    blocks = []
    for s, y in tqdm(moving, desc="causal hats", unit="hat", disable=not progress, leave=False,
                     delay=1):
        c = s @ h
        present.pop(bisect_left(present, c))
        k = bisect_left(present, c)
        near = [abs(present[m] - c) for m in (k - 1, k) if 0 <= m < len(present)]
        delta = min([cap] + near) / 2
        blocks.append(Block(ff_from_units(hat_units(h, 0 * c, c, delta, y - s), num(1, exact),
                                          d, exact), None))
        t = y @ h
        k = bisect_left(present, t)
        if k == len(present) or present[k] != t:
            insort(present, t)
    return blocks, h


# ------------------------------------------------------------------------------ softmax
def _build_softmax(ctx: _Contexts, draws: Draws, tau, progress: bool) -> Transformer:
    """Separation with softmax attention at temperature θ (folded into A when ``tau`` is
    None: the largest θ = 2^-k that keeps every state's blob apart), then project and snap."""
    exact = ctx.exact
    if tau is not None:
        return _softmax_at(ctx, draws, parse_tau(tau), fold=False, progress=progress)
    theta = Fraction(1)
    while theta >= THETA_MIN:
        try:
            return _softmax_at(ctx, draws, theta, fold=True, progress=progress)
        except _Overlap:
            theta /= 2
    raise ConstructionError(f"no temperature down to 2^-40 keeps the states apart ({exact=})")


class _Overlap(ConstructionError):
    """Blobs of different states overlap on every line tried at this temperature."""


def _softmax_at(ctx: _Contexts, draws: Draws, theta: Fraction, fold: bool,
                progress: bool) -> Transformer:
    exact, d = ctx.exact, ctx.d
    scale = num(1 / theta, exact) if fold else num(1, exact)
    tau = num(1, exact) if fold else num(theta, exact)
    P, sep = _separation_phase(ctx, draws, scale, progress)
    states = _states(ctx, P, sep.blocks, "softmax", tau, "float")
    classes = _targeted_classes(ctx, sep.cls)
    blobs: dict[int, list] = defaultdict(list)
    for s, c in zip(states, sep.cls, strict=True):
        for row, k in zip(s, c.tolist(), strict=True):
            if k in classes:
                blobs[k].append(row)
    order = list(classes)
    groups = [np.array(blobs[k]) for k in order]
    targets = [classes[k][1] for k in order]
    proj, snaps, windows = _project_and_snap(groups, targets, draws, d, exact)
    blocks = sep.blocks + [proj] + snaps
    R = len(sep.blocks)
    record = _record(ctx, "causal-softmax", P, R, len(snaps),
                     [Span("separation", 0, R), Span("projection", R, R + 1),
                      Span("snap", R + 1, len(blocks))], sep)
    record.theta, record.folded = str(theta), fold
    record.snap_windows = [tuple(str(c) for c in w) for w in windows]
    return Transformer(d=d, attention="softmax", blocks=blocks, tau=tau, exact=exact,
                       causal=True, positions=P, record=record)


def _project_and_snap(groups, targets, draws: Draws, d: int, exact: bool):
    """A non-residual projection onto a line t·e along a generic f, then one interval snap per
    group (read along f' with f'·e = 1) whose flat part covers the group's blob."""
    def intervals(f):
        f = np.asarray(f, dtype=float)
        return [(float((g @ f).min()), float((g @ f).max())) for g in groups]

    def score(f):
        iv = sorted(intervals(f))
        if not iv:
            return 1.0
        spread = max(abs(iv[0][0]), abs(iv[-1][1]), 1.0)
        for a, b in zip(iv, iv[1:], strict=False):
            if b[0] - a[1] <= max(a[1] - a[0], b[1] - b[0], MIN_RELATIVE_GAP * spread):
                return None
        return min([b[0] - a[1] for a, b in zip(iv, iv[1:], strict=False)], default=1.0) / spread

    try:
        f = best_draw(lambda: draws.vector(d), score, what="projection line")
    except ConstructionError as e:
        raise _Overlap(str(e)) from None
    iv = intervals(f)
    lowest = min([a for a, _ in iv], default=0.0)
    shift = num(1 - Fraction(math.floor(lowest * 1024), 1024), exact)
    e = draws.vector(d)
    proj = Block(ff_from_units([projection_unit(f, shift, e)], num(0, exact), d, exact), None)
    windows = _windows([(a + float(shift), b + float(shift)) for a, b in iv])
    ee = e @ e
    for _ in range(64):
        r = draws.vector(d)
        fp = e / ee + (r - e * ((r @ e) / ee))
        if _targets_clear(targets, windows, fp):
            break
    else:
        raise _Redraw("a placed target keeps falling into a later snap window")
    snaps = []
    for win, y in zip(windows, targets, strict=True):
        c1, c2, c3, c4 = (num(c, exact) for c in win)
        units = snap_units(fp, num(0, exact), e, c1, c2, c3, c4, as_number_array(y, exact))
        snaps.append(Block(ff_from_units(units, num(1, exact), d, exact), None))
    return proj, snaps, windows


def _windows(line: list[tuple[float, float]]) -> list[tuple[Fraction, ...]]:
    """Dyadic (c1, c2, c3, c4) per interval: the flat part reaches q = gap/8 beyond the blob
    and each ramp another q, so windows of neighbouring intervals stay disjoint."""
    order = sorted(range(len(line)), key=lambda k: line[k])
    gap = [math.inf] * len(line)
    for a, b in zip(order, order[1:], strict=False):
        g = line[b][0] - line[a][1]
        gap[a], gap[b] = min(gap[a], g), min(gap[b], g)
    out = []
    for k, (lo, hi) in enumerate(line):
        q = (gap[k] if math.isfinite(gap[k]) else 1.0) / 8
        step = Fraction(2) ** math.floor(math.log2(q / 64))
        ramp = math.floor(Fraction(q) / step) * step
        c2 = math.floor(Fraction(lo - q) / step) * step
        c3 = math.ceil(Fraction(hi + q) / step) * step
        out.append((c2 - ramp, c2, c3, c3 + ramp))
    return out


def _targets_clear(targets, windows, fp) -> bool:
    """No target placed by a snap comes within a ramp's width of a later snap's window."""
    t = [float(np.asarray(y, dtype=float) @ np.asarray(fp, dtype=float)) for y in targets]
    for k, (c1, c2, _, c4) in enumerate(windows):
        pad = float(c2 - c1)
        if any(float(c1) - pad < t[i] < float(c4) + pad for i in range(k)):
            return False
    return True

