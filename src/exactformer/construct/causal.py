"""The causal (decoder) construction: an exact target at every position (docs/causal.md).

A *context* is (sequence j, position i); its output may depend on the ordered prefix only.

1. **Positions.** Generic small dyadic rows P_i are stored with the model and added to the token
   at position i, so every (token, position) is its own *point*: repeated tokens differ, and the
   set of points of a prefix fixes the ordered prefix.
2. **Separation (R_c blocks, none when no two contexts at one point have different targets).**
   A non-residual FF projects every point to u = a·z + a0 ∈ [1, 2]; round r lifts a test
   point above every u (a hat on u) and a causal rank-one attention (A = e1·e1ᵀ, so token i
   attends to the prefix maximum of u) adds λ_r·max_{l≤i} u_l to v = x[1]. A context's state is
   then (u, Σ_r λ_r·M_r): a function of its prefix. Contexts at one point with different
   targets are split by lifting a point of the symmetric difference of their prefixes (the one
   that splits most sampled pairs); generic λ make distinct signatures distinct states.
   With width 4k a round lifts up to k tests to rising heights, and with several heads some of
   them on free coordinates x[c + 1], each read by its own head (channels, docs/causal.md).
3. **Interpolation.** Hardmax: one residual hat per distinct state that has a target and is not
   on it (construct/interpolation.py). Softmax: the forward pass is simulated, a non-residual
   FF projects onto a line and one interval snap per state sends its whole blob to its target
   (construct/softmax.py). k hats or snaps share a layer.

L = R_c + ⌈moves/k⌉ (hardmax) or R_c + 1 + ⌈snaps/k⌉ (softmax).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np
from sortedcontainers import SortedList
from tqdm import tqdm

from ..data import CausalDataset
from ..evaluate import forward_causal, with_positions
from ..model import SA, Block, Head, ScoreMatrix, Transformer, ValueMatrix
from ..numbers import as_number_array, num, unit
from ..record import CausalConstruction, CausalLift, Span
from . import keyed_causal
from .causal_rounds import Contexts, Round, conflicted, contexts, plan_round, prefix_max, refine
from .gadgets import ff_from_units, hat_units, projection_unit
from .generic import (
    ConstructionError,
    Draws,
    best_draw,
    relative_gap,
    separated,
)
from .hardmax import check_heads, hats_per_layer
from .interpolation import LeaderOnTarget, half_room, interpolate
from .position_keys import build_keys, keyed_positions
from .separation import TokenTable, project
from .softmax import TargetInSnapWindow, at_temperature, parse_tau, project_and_snap

REDRAWS = 20  # fresh positions (and everything after) on a coincidence of generic choices
THETA_MIN = 2.0 ** -40


class _Redraw(ConstructionError):
    """A coincidence of the generic choices (a target on a state to move): draw again."""


@dataclass
class _Separation:
    blocks: list[Block] = field(default_factory=list)
    cls: list[np.ndarray] = field(default_factory=list)  # per sequence: class id per position
    lifts: list[CausalLift] = field(default_factory=list)


def compile_causal(dataset: CausalDataset, attention: str = "hardmax", exact: bool = True,
                   seed: int = 0, tau=None, progress: bool = False, width: int = 4,
                   heads: int = 1, keys: bool = False) -> Transformer:
    """A causal transformer whose output at every constrained position equals its target.
    ``width``/4 hats, snaps or separation tests share a layer; a separation round reads up to
    min(``heads``, d − 1) channels, one head each (docs/causal.md). Position keys wherever
    they apply; elsewhere ``keys`` builds the keyed causal model (construct/keyed_causal.py)."""
    if attention not in ("hardmax", "softmax"):
        raise ValueError(f"attention must be 'hardmax' or 'softmax', got {attention!r}")
    if attention == "hardmax" and tau is not None:
        raise ValueError("tau applies to softmax attention only")
    k = hats_per_layer(width)
    check_heads(heads)
    xs, ys = dataset.fractions() if exact else dataset.floats()
    found = keyed_positions(xs, ys, dataset.known)
    if found is not None and any(p is not None for p in found):
        model = _build_keyed(found, len(xs), dataset, attention, exact, width, tau)
        model.record.seed = seed
        return model
    if keys:
        model = keyed_causal.build(dataset, attention, exact, width, heads, seed, progress)
        return model if tau is None else at_temperature(model, tau)
    ctx = contexts(xs, ys, list(dataset.known), exact, dataset.d)
    ctx.per_layer, ctx.channels = k, max(1, min(heads, dataset.d - 1))  # x[0] is u, x[1] is v
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


def _build_keyed(found, N: int, dataset: CausalDataset, attention: str, exact: bool,
                 width: int, tau) -> Transformer:
    """Every constrained position looked up by its key, ``width`` units to a layer
    (construct/position_keys.py); no attention layer is needed, so the hardmax and the softmax
    model are the same layers."""
    P, blocks, (q, w, c) = build_keys(found, dataset.d, width, exact)
    moves = sum(p is not None for p in found)
    record = CausalConstruction(
        kind=f"causal-{attention}", seed=0, N=N, constrained=dataset.constrained,
        stored_positions=len(P), R=0, moves=moves,
        phases=[Span("interpolation", 0, len(blocks))],
        position_code={"coordinates": q, "weight": w, "scale": str(c)})
    return Transformer(d=dataset.d + q, attention=attention, blocks=blocks, exact=exact,
                       causal=True, positions=P, record=record,
                       tau=None if attention == "hardmax" else
                       num(1 if tau is None else parse_tau(tau), exact))


def _draw_positions(ctx: Contexts, draws: Draws) -> np.ndarray:
    """Generic dyadic rows of size about a quarter of the coordinate scale."""
    n = max(len(x) for x in ctx.xs)
    scale = max([1.0] + [float(abs(v)) for x in ctx.xs for v in x.flat])
    s = num(Fraction(2) ** (math.floor(math.log2(scale)) - 2), ctx.exact)
    P = np.empty((n, ctx.d), dtype=object if ctx.exact else float)
    for i in range(n):
        P[i] = draws.vector(ctx.d) * s
    return P


def _points(ctx: Contexts, zs: list[np.ndarray]) -> np.ndarray:
    return np.array([zs[j][i] for j, i in ctx.first], dtype=zs[0].dtype)


# ------------------------------------------------------------------------------ separation
def _separate(ctx: Contexts, points: np.ndarray, draws: Draws, score_scale,
              progress: bool) -> _Separation:
    """Rounds until no class holds two different targets; see the module docstring. The rounds
    are planned first (their tests, registers and prefix maxima), then the multipliers are
    drawn and each block is built whole."""
    a, a0, u = project(TokenTable.build([points]), draws)  # the points are distinct
    regs = {0: as_number_array(u, ctx.exact)}
    top = max(regs[0]) + 1
    rounds = [Round([], regs, {0: prefix_max(ctx, regs[0])}, [], 0)]
    cls = refine(ctx.pid, rounds[0].maxima[0])
    bar = tqdm(desc="causal separation rounds", unit="round", disable=not progress,
               leave=False, delay=1)
    while conflicts := conflicted(ctx, cls):
        if len(rounds) > sum(map(len, ctx.pid)):  # each round splits a class of contexts
            raise ConstructionError("causal separation did not finish in one round per context")
        bar.update()
        rounds.append(plan_round(ctx, cls, regs, conflicts, draws, top))
        regs = {**regs, **rounds[-1].regs}
        cls, top = rounds[-1].cls, top + len(rounds[-1].tests)
    bar.close()
    history = [m for r in rounds for m in r.maxima.values()]
    lams = _multipliers(ctx, cls, history, draws, top)
    blocks, lifts = _round_blocks(ctx, rounds, (a, a0), lams, score_scale)
    return _Separation(blocks, cls, lifts)


def _round_blocks(ctx: Contexts, rounds: list[Round], projection, lams, score_scale):
    """One block per round: the projection (first) or the round's lift hats, each on its
    point's half-gap window of u (pairwise disjoint, so they share a layer), and one causal
    rank-one head per channel read, adding λ·(the prefix max of the channel) to v = x[1].
    Channel 0 is u = x[0]; channel c ≥ 1 the free coordinate x[c + 1] (docs/causal.md)."""
    exact, d = ctx.exact, ctx.d
    e = [unit(d, i, exact) for i in range(d)]
    lam = iter(lams)
    regs = dict(rounds[0].regs)
    blocks, lifts = [], []
    for r, rnd in enumerate(rounds):
        u = regs[0]
        present = SortedList(u)
        units = [] if r else [projection_unit(*projection, e[0])]
        lam_of = {c: next(lam) for c in rnd.maxima}
        for c, p in rnd.tests:
            before, after = regs.get(c, u * 0)[p], rnd.regs[c][p]
            units += hat_units(e[0], 0 * u[p], u[p], half_room(present, u[p], num(1, exact)),
                               e[c + 1 if c else 0] * (after - before))
            lifts.append(CausalLift(r, *ctx.first[p], str(before), str(after), str(lam_of[c]),
                                    channel=c))
        heads = [Head(ScoreMatrix(num(0, exact), e[c + 1 if c else 0] * score_scale, e[0]),
                      ValueMatrix(num(0, exact), e[1] * lam_of[c], e[c + 1 if c else 0]))
                 for c in rnd.maxima]
        regs.update(rnd.regs)
        blocks.append(Block(ff_from_units(units, num(1 if r else 0, exact), d, exact),
                            SA(num(1, exact), heads=heads)))
    return blocks, lifts


def _multipliers(ctx: Contexts, cls, history, draws: Draws, top) -> list:
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


def _states(ctx: Contexts, P, blocks: list[Block], attention: str, tau, arithmetic: str):
    """Every context's point after the separation blocks (the positioned inputs if none)."""
    if not blocks:
        return with_positions(P, ctx.xs)
    model = Transformer(ctx.d, attention, blocks, tau=tau, exact=ctx.exact, causal=True,
                        positions=P)
    return forward_causal(model, ctx.xs, arithmetic)


def _targeted_classes(ctx: Contexts, cls) -> dict[int, tuple[tuple[int, int], np.ndarray]]:
    """Class id → (its first constrained context, its target), for classes with a target."""
    out: dict = {}
    for j, (c, k) in enumerate(zip(cls, ctx.known, strict=True)):
        for i in np.flatnonzero(k).tolist():
            out.setdefault(int(c[i]), ((j, i), ctx.ys[j][i]))
    return out


def _separation_phase(ctx: Contexts, draws: Draws, score_scale, progress: bool):
    P = _draw_positions(ctx, draws)
    zs = with_positions(P, ctx.xs)
    points = _points(ctx, zs)
    if len({tuple(z.tolist()) for z in points}) < len(points):
        raise _Redraw("positions made two points coincide")
    sep = _Separation(cls=ctx.pid) if not conflicted(ctx, ctx.pid) else \
        _separate(ctx, points, draws, score_scale, progress)
    return P, sep


# ------------------------------------------------------------------------------ hardmax
def _build_hardmax(ctx: Contexts, draws: Draws, progress: bool) -> Transformer:
    exact, d = ctx.exact, ctx.d
    P, sep = _separation_phase(ctx, draws, num(1, exact), progress)
    states = _states(ctx, P, sep.blocks, "hardmax", None, "exact" if exact else "float")
    items = [(states[j][i], y) for (j, i), y in _targeted_classes(ctx, sep.cls).values()]
    if exact:
        _check_classes(states, sep.cls)
    on = [tuple(s.tolist()) == tuple(y.tolist()) for s, y in items]
    moving = [x for x, o in zip(items, on, strict=True) if not o]
    fixed = [s for (s, _), o in zip(items, on, strict=True) if o]
    hats, h = _interpolate(ctx, moving, fixed, draws, progress)
    blocks = sep.blocks + hats
    R = len(sep.blocks)
    record = _record(ctx, "causal-hardmax", P, R, len(moving),
                     [Span("separation", 0, R), Span("interpolation", R, len(blocks))], sep)
    record.interpolation_direction = [str(v) for v in h]
    return Transformer(d=d, attention="hardmax", blocks=blocks, exact=exact, causal=True,
                       positions=P, record=record)


def _interpolate(ctx: Contexts, moving, fixed, draws: Draws, progress: bool):
    """The shared interpolation (construct/interpolation.py): one hat per (state, target) to
    move, ``ctx.per_layer`` to a layer; states already on their targets stay put."""
    if not moving:
        return [], unit(ctx.d, 0, ctx.exact)
    dtype = moving[0][0].dtype
    try:
        return interpolate([np.array([s for s, _ in moving], dtype=dtype)],
                           [np.array([y for _, y in moving], dtype=dtype)], draws, progress,
                           ctx.per_layer, np.array(fixed, dtype=dtype) if fixed else None)
    except LeaderOnTarget:
        raise _Redraw("a target coincides with a state still to move") from None


def _record(ctx: Contexts, kind: str, P, R: int, moves: int, phases: list[Span],
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


# ------------------------------------------------------------------------------ softmax
def _build_softmax(ctx: Contexts, draws: Draws, tau, progress: bool) -> Transformer:
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


def _softmax_at(ctx: Contexts, draws: Draws, theta: Fraction, fold: bool,
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
    proj, snaps, windows = _snaps(ctx, [np.array(blobs[k]) for k in classes],
                                  [classes[k][1] for k in classes], draws)
    blocks = sep.blocks + proj + snaps
    R = len(sep.blocks)
    record = _record(ctx, "causal-softmax", P, R, len(windows),
                     [Span("separation", 0, R), Span("projection", R, R + len(proj)),
                      Span("snap", R + len(proj), len(blocks))], sep)
    record.theta, record.folded = str(theta), fold
    record.snap_windows = [tuple(str(c) for c in w) for w in windows]
    return Transformer(d=d, attention="softmax", blocks=blocks, tau=tau, exact=exact,
                       causal=True, positions=P, record=record)


def _snaps(ctx: Contexts, blobs, targets, draws: Draws):
    """The shared projection and snaps (construct/softmax.py), ``ctx.per_layer`` snaps to a
    layer; nothing when no state has a target."""
    if not blobs:
        return [], [], []
    try:
        proj, snaps, windows = project_and_snap(blobs, targets, draws, ctx.per_layer)
    except TargetInSnapWindow as e:
        raise _Redraw(str(e)) from None
    except ConstructionError as e:
        raise _Overlap(str(e)) from None
    return [proj], snaps, windows
