"""The softmax construction of DESIGN §5, and the temperature threshold τ*.

Same phases as hardmax, every attention softmax. Softmax never collapses tokens exactly, so the
constructor simulates the forward pass (float64) to know where every token is, centres its hats
there, and ends with a non-residual projection onto a line x = t·e followed by one interval snap
per leader group: the snap is flat on an interval around the group's blob and sends all of it to
the target, so on the data the output equals the targets exactly in real arithmetic.

Temperature: the geometry (every seeded choice) is fixed; the construction at temperature θ is
valid when, after the collapse, the groups' intervals on the line are disjoint with room to
spare: each gap wider than the blobs beside it (and than float64 can blur). τ* is the largest θ
found valid by a search. With the default τ = 1 the model is built at
θ = a power of two ≤ τ*/2 and 1/θ is folded into the attention matrices (A/θ at τ = 1 is the
same layer as A at τ = θ); an explicit τ is used as it is and must be below τ*.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from fractions import Fraction

import numpy as np
from tqdm import tqdm

from ..data import Dataset
from ..evaluate import forward
from ..model import Block, ScoreMatrix, Transformer
from ..numbers import as_number_array, num
from .gadgets import ff_from_units, projection_unit, snap_units
from .generic import ConstructionError, Draws, best_draw
from .interpolation import LeaderOnTarget
from .leaders import choose_leaders
from .separation import TokenTable, separate

THETA_MIN = 2.0 ** -40  # below this the search gives up
THETA_MAX = 2.0 ** 10  # valid up to here counts as "any temperature works"
BISECTIONS = 8  # τ* to about 0.5 % (the bracket starts at a factor 4)
TARGET_TRIES = 64
MIN_RELATIVE_GAP = 1e-9  # groups closer than this (relative) are not certifiable in float64


class TemperatureError(ValueError):
    """The requested temperature is too large for the data; the message gives τ*."""


class _Invalid(Exception):
    """The construction at this temperature fails (groups overlap, or no generic choice)."""


@dataclass
class _Geometry:
    """What the search needs: the data in the construction's arithmetic and floats."""

    table: TokenTable
    inputs: list[np.ndarray]
    inputs_f: list[np.ndarray]
    targets: list[np.ndarray]
    m: list[int]
    d: int
    exact: bool
    seed: int


def compile_softmax(dataset: Dataset, exact: bool = True, seed: int = 0, tau=None,
                    progress: bool = False) -> Transformer:
    inputs, targets = dataset.fractions() if exact else dataset.floats()
    geo = _Geometry(TokenTable.build(inputs), inputs, dataset.floats()[0], targets,
                    dataset.target_lengths, dataset.d, exact, seed)
    tau_star = find_tau_star(geo, progress)
    if tau is None:  # the largest power of two ≤ τ*/2 that is valid (validity need not be
        # monotone in θ: the search's τ* is the largest valid value it met)
        theta = 1.0 if math.isinf(tau_star) else 2.0 ** math.floor(math.log2(tau_star / 2))
        while True:
            try:
                model = _build(geo, Fraction(theta), fold=True)
                break
            except _Invalid:
                theta /= 2
                if theta < THETA_MIN:
                    raise ConstructionError("no power-of-two temperature below tau* gives a "
                                            "valid softmax construction") from None
    else:
        theta = Fraction(str(tau)) if not isinstance(tau, Fraction) else tau
        if theta <= 0:
            raise ValueError(f"tau must be positive, got {tau}")
        if theta >= tau_star:
            raise TemperatureError(
                f"tau = {float(theta):.6g} is too large for these data: the largest workable "
                f"temperature is tau* = {tau_star:.6g}; use a smaller tau, or omit it for "
                "tau = 1 with rescaled attention")
        try:
            model = _build(geo, theta, fold=False)
        except _Invalid as e:
            raise TemperatureError(f"tau = {float(theta):.6g}: {e} (tau* = {tau_star:.6g})") \
                from None
    model.meta["tau_star"] = tau_star if math.isfinite(tau_star) else "inf"
    return model


def find_tau_star(geo: _Geometry, progress: bool = False) -> float:
    """Largest temperature found valid (bisection in log scale); inf if valid up to 2^10."""
    bar = tqdm(desc="tau* search", unit="build", disable=not progress, leave=False, delay=1)

    def _valid(theta: float) -> bool:
        bar.update()
        try:
            _build(geo, Fraction(theta), fold=False)
            return True
        except _Invalid:
            return False

    with bar:
        return _search(_valid)


def _search(valid) -> float:
    lo = 1.0 / 64
    while not valid(lo):
        lo /= 16
        if lo < THETA_MIN:
            raise ConstructionError("no temperature down to 2^-40 gives a valid softmax "
                                    "construction for these data")
    hi = lo * 4
    while valid(hi):
        lo, hi = hi, hi * 4
        if hi > THETA_MAX:
            return math.inf
    for _ in range(BISECTIONS):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if valid(mid) else (lo, mid)
    return lo


def _build(geo: _Geometry, theta: Fraction, fold: bool) -> Transformer:
    """The construction at temperature θ; ``fold`` puts 1/θ into A and sets τ = 1."""
    exact, d = geo.exact, geo.d
    draws = Draws(geo.seed, exact)
    scale = num(1 / theta, exact) if fold else num(1, exact)
    tau = num(1, exact) if fold else num(theta, exact)
    try:
        sep = separate(geo.table, draws)
    except ConstructionError as e:
        raise _Invalid(str(e)) from None
    for b in sep.blocks:
        b.sa = replace(b.sa, A=ScoreMatrix(b.sa.A.alpha, b.sa.A.a * scale, b.sa.A.c))
    blocks = list(sep.blocks)
    positions = _separated_positions(geo, sep, blocks, tau)
    for _ in range(TARGET_TRIES):
        try:
            lead = choose_leaders(positions, geo.m, draws, collapse_alpha=scale)
            tail = _project_and_snap(geo, blocks + lead.blocks, lead.chosen, tau, draws)
            break
        except LeaderOnTarget:
            continue
        except ConstructionError as e:
            raise _Invalid(str(e)) from None
    else:
        raise _Invalid("targets keep falling into snap windows")
    proj_block, snaps, windows = tail
    allb = blocks + lead.blocks + [proj_block] + snaps
    R, nl = sep.R, len(lead.blocks)
    meta = {
        "construction": "softmax", "seed": geo.seed, "N": len(geo.m), "sum_m": sum(geo.m),
        "R": R, "theta": str(theta), "folded": fold,
        "phases": {"separation": [0, R], "leaders": [R, R + nl],
                   "projection": [R + nl, R + nl + 1], "snap": [R + nl + 1, len(allb)]},
        "lifts": sep.lifts, "leaders": lead.chosen, "snap_windows": windows,
    }
    return Transformer(d=d, attention="softmax", blocks=allb, tau=tau, exact=exact, meta=meta)


def _separated_positions(geo, sep, blocks, tau) -> list[np.ndarray]:
    """Token positions after the separation rounds (simulated in float64 for R > 0)."""
    if not sep.R:
        return geo.inputs
    model = Transformer(geo.d, "softmax", blocks, tau=tau, exact=geo.exact)
    outs = forward(model, geo.inputs_f, "float")
    return [as_number_array(o, geo.exact) for o in outs]


def _project_and_snap(geo, blocks, chosen, tau, draws):
    """Simulate to the collapse, project onto a generic line, and snap each group."""
    exact, d = geo.exact, geo.d
    model = Transformer(d, "softmax", blocks, tau=tau, exact=exact)
    outs = forward(model, geo.inputs_f, "float")
    groups = []  # (sequence, slot, positions of its tokens)
    for j, (o, ch) in enumerate(zip(outs, chosen, strict=True)):
        owner = np.zeros(len(o), dtype=int)  # every non-leader joins the P-leader (slot 0)
        for slot, i in enumerate(ch):
            owner[i] = slot
        groups += [(j, slot, o[owner == slot]) for slot in range(len(ch))]

    def intervals(f):
        f = np.asarray(f, dtype=float)
        return [(float((g[2] @ f).min()), float((g[2] @ f).max())) for g in groups]

    def score(f):
        """Valid when consecutive groups are farther apart than the wider of the two blobs
        (and than float64 can blur); the score is the smallest gap over the spread."""
        iv = sorted(intervals(f))
        scale = max(abs(iv[0][0]), abs(iv[-1][1]), 1.0)
        for a, b in zip(iv, iv[1:], strict=False):
            gap = b[0] - a[1]
            if gap <= max(a[1] - a[0], b[1] - b[0], MIN_RELATIVE_GAP * scale):
                return None
        spread = iv[-1][1] - iv[0][0] or 1.0
        gaps = [b[0] - a[1] for a, b in zip(iv, iv[1:], strict=False)]
        return min(gaps) / spread if gaps else 1.0

    f = best_draw(lambda: draws.vector(d), score, what="projection line (groups overlap)")
    iv = intervals(f)
    lowest = min(a for a, _ in iv)
    shift = num(Fraction(1) - _rational_below(lowest), exact)
    e = draws.vector(d)
    proj = ff_from_units([projection_unit(f, shift, e)], num(0, exact), d, exact)
    line = [(a + float(shift), b + float(shift)) for a, b in iv]  # t on the line, t ≥ 1
    windows = _windows(line)
    ee = e @ e
    for _ in range(TARGET_TRIES):  # reading direction f' = e/|e|² + w with w ⊥ e
        r = draws.vector(d)
        fp = e / ee + (r - e * ((r @ e) / ee))
        if _targets_clear(geo, groups, windows, fp):
            break
    else:
        raise LeaderOnTarget("a placed target keeps falling into a later snap window")
    snaps = []
    for (j, slot, _), win in zip(groups, windows, strict=True):
        c1, c2, c3, c4 = (num(c, exact) for c in win)
        y = geo.targets[j][slot]
        units = snap_units(fp, num(0, exact), e, c1, c2, c3, c4, y)
        snaps.append(Block(ff_from_units(units, num(1, exact), d, exact), None))
    records = [{"sequence": j, "slot": slot, "window": [str(c) for c in win]}
               for (j, slot, _), win in zip(groups, windows, strict=True)]
    return Block(proj, None), snaps, records


def _windows(line: list[tuple]) -> list[tuple]:
    """Rational (c1, c2, c3, c4) per group on a dyadic grid: the flat part [c2, c3] reaches a
    distance q = gap/8 beyond the blob, the ramps another q, so windows stay disjoint."""
    out = []
    for k, (a, b) in enumerate(line):
        gap = min([a2 - b if a2 > b else a - b2 for i, (a2, b2) in enumerate(line) if i != k],
                  default=1.0)
        q = gap / 8
        step = 2.0 ** math.floor(math.log2(q / 64))
        ramp = _grid(q, step, down=True)
        c2, c3 = _grid(a - q, step, down=True), _grid(b + q, step, down=False)
        out.append((c2 - ramp, c2, c3, c3 + ramp))
    return out


def _grid(v: float, step: float, down: bool) -> Fraction:
    k = math.floor(v / step) if down else math.ceil(v / step)
    return Fraction(k) * Fraction(step)


def _rational_below(v: float) -> Fraction:
    return Fraction(math.floor(v * 1024), 1024)


def _targets_clear(geo, groups, windows, fp) -> bool:
    """No target placed by a snap comes within a ramp's width of a later snap's window."""
    t = [float(geo.targets[j][slot] @ fp) for j, slot, _ in groups]
    for k, (c1, c2, _, c4) in enumerate(windows):
        pad = float(c2 - c1)
        if any(float(c1) - pad < t[i] < float(c4) + pad for i in range(k)):
            return False
    return True
