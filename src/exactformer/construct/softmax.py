"""The softmax construction and the temperature threshold τ*.

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
See docs/softmax.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from fractions import Fraction

import numpy as np
from tqdm import tqdm

from ..data import Dataset
from ..evaluate import forward
from ..model import Block, Transformer
from ..numbers import as_number_array, num, safe_float
from ..record import Construction, SnapWindow, Span
from . import keyed, keyed_softmax
from .gadgets import ff_from_units, power_of_two_below, projection_unit, snap_units
from .generic import ConstructionError, Draws, best_draw
from .leaders import choose_leaders
from .separation import TokenTable, separate

THETA_MIN = 2.0 ** -40  # below this the search gives up
THETA_MAX = 2.0 ** 10  # valid up to here counts as "any temperature works"
BISECTIONS = 8  # τ* to about 0.5 % (the bracket starts at a factor 4)
TARGET_TRIES = 64  # reading directions / leader geometries tried against window collisions
REDRAWS = 16  # seeds tried for an explicit temperature below τ*
MIN_RELATIVE_GAP = Fraction(1, 10 ** 9)  # groups closer (relative) are not safe in float64


class TemperatureError(ValueError):
    """The requested temperature is too large for the data; the message gives τ*."""


class TargetInSnapWindow(ConstructionError):
    """A target already placed keeps falling inside a later snap's window: redraw."""


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
    digits: int | None  # simulation precision: None for float64, else mpmath digits
    per_layer: int = 1  # hats, snaps and separation tests per layer (width/4, docs/heads.md)
    heads: int = 1  # separation channels (docs/heads.md)


def parse_tau(tau) -> Fraction:
    """A positive, finite temperature as a Fraction, refused before any search otherwise."""
    try:
        theta = tau if isinstance(tau, Fraction) else Fraction(str(tau))
    except (ValueError, ZeroDivisionError):
        raise ValueError(f"tau must be a positive number, got {tau!r}") from None
    if theta <= 0:
        raise ValueError(f"tau must be positive, got {tau}")
    return theta


def compile_softmax(dataset: Dataset, exact: bool = True, seed: int = 0, tau=None,
                    progress: bool = False, width: int = 4, heads: int = 1) -> Transformer:
    """Construct the softmax transformer (τ = 1 with 1/θ folded into A, or the given τ).
    ``width``/4 hats, snaps or separation tests share a layer, on up to ``heads`` separation
    channels (docs/heads.md)."""
    theta = None if tau is None else parse_tau(tau)
    inputs, targets = dataset.fractions() if exact else dataset.floats()
    geo = _Geometry(TokenTable.build(inputs), inputs, dataset.floats()[0], targets,
                    dataset.target_lengths, dataset.d, exact, seed,
                    simulation_digits(inputs) if exact else None, width // 4, heads)
    tau_star = find_tau_star(geo, progress)
    model = _at_default_tau(geo, tau_star) if theta is None else \
        _at_given_tau(geo, theta, tau_star)
    model.record.tau_star = tau_star
    return model


def compile_keyed_softmax(dataset: Dataset, exact: bool = True, seed: int = 0, tau=None,
                          progress: bool = False, width: int = 4, heads: int = 1
                          ) -> Transformer:
    """The keyed softmax model (docs/keyed.md#softmax): no simulation, exact in real
    arithmetic and within float32's rounding in a plain dense float32 pass; up to ``heads``
    separation rounds share an attention layer (docs/keyed.md#heads). Built at τ = 1, then
    at ``tau`` by :func:`at_temperature`."""
    inputs, targets = dataset.fractions() if exact else dataset.floats()
    built = keyed_softmax.build(inputs, targets, dataset.target_lengths, exact, width, heads,
                                seed, progress)
    model = keyed.model_of(built, dataset.N, dataset.total_m, seed, exact, "softmax")
    return model if tau is None else at_temperature(model, tau)


def at_temperature(model: Transformer, tau) -> Transformer:
    """A softmax model built at τ = 1 run at temperature ``tau``: every score matrix's α and a
    multiplied by τ, so every score over τ is the one it had (exact in rational parameters;
    one rounding of each entry in float64 ones). ValueError where that leaves a nonzero
    entry outside float64's normal range."""
    theta = parse_tau(tau)
    factor = theta if model.exact else float(theta)
    for block in model.blocks:
        for head in block.sa.heads if block.sa is not None else []:
            head.A = replace(head.A, alpha=head.A.alpha * factor, a=head.A.a * factor)
            _check_scaled(head.A, tau)
    model.tau = factor
    return model


def _check_scaled(A, tau) -> None:
    """The entries of a score matrix scaled by τ stay in float64's normal range."""
    for v in [A.alpha, *A.a]:
        if v != 0 and not 2.0 ** -1022 <= abs(safe_float(v)) < 2.0 ** 1023:
            raise ValueError(f"tau = {tau} takes a score entry out of float64's normal range "
                             f"({safe_float(v):.3g}); choose a tau nearer 1")


def _at_default_tau(geo: _Geometry, tau_star: float) -> Transformer:
    """The largest power of two ≤ τ*/2 that is valid, folded into A (validity need not be
    monotone in θ: the search's τ* is the largest valid value it met)."""
    theta = 1.0 if math.isinf(tau_star) else 2.0 ** math.floor(math.log2(tau_star / 2))
    while theta >= THETA_MIN:
        try:
            return _build(geo, Fraction(theta), fold=True)
        except _Invalid:
            theta /= 2
    raise ConstructionError("no power-of-two temperature below tau* gives a valid softmax "
                            "construction")


def _at_given_tau(geo: _Geometry, theta: Fraction, tau_star: float) -> Transformer:
    if theta >= tau_star:
        raise TemperatureError(
            f"tau = {float(theta):.6g} is too large for these data: the largest workable "
            f"temperature is tau* = {tau_star:.6g}; use a smaller tau, or omit it for "
            "tau = 1 with rescaled attention")
    for k in range(REDRAWS):  # below τ* a valid geometry exists; the seeded one may miss it
        try:
            return _build(replace(geo, seed=geo.seed + k), theta, fold=False)
        except _Invalid as e:
            reason = e
    raise TemperatureError(f"tau = {float(theta):.6g}: {reason} in {REDRAWS} geometries "
                           f"(tau* = {tau_star:.6g})")


def simulation_digits(inputs: list[np.ndarray]) -> int | None:
    """None (float64 is enough) unless the tokens' relative spacing along a generic direction is
    below 1e-6; then enough decimal digits to resolve it with 20 to spare."""
    table = TokenTable.build(inputs)
    vals = sorted(table.points @ Draws(0, True).vector(table.points.shape[1]))
    scale = max(abs(vals[0]), abs(vals[-1]))
    gaps = [b - a for a, b in zip(vals, vals[1:], strict=False)]
    if not gaps or scale == 0:
        return None
    rel = min(gaps) / scale
    if rel == 0:  # a coincidence along this direction: judge by the nearest distinct pair
        rel = min([g for g in gaps if g], default=scale) / scale
    return None if rel > Fraction(1, 10 ** 6) else 20 + math.ceil(-math.log10(rel))


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
    exact = geo.exact
    draws = Draws(geo.seed, exact)
    scale = num(1 / theta, exact) if fold else num(1, exact)
    tau = num(1, exact) if fold else num(theta, exact)
    try:
        sep = separate(geo.table, draws, score_scale=scale, per_round=geo.per_layer,
                       heads=geo.heads)
    except ConstructionError as e:
        raise _Invalid(str(e)) from None
    positions = _separated_positions(geo, sep.blocks, tau)
    for _ in range(TARGET_TRIES):
        try:
            lead = choose_leaders(positions, geo.m, draws, collapse_alpha=scale,
                                  per_layer=geo.per_layer)
            proj, snaps, windows = _project_and_snap(geo, sep.blocks + lead.blocks,
                                                     lead.chosen, tau, draws)
            break
        except TargetInSnapWindow:
            continue
        except ConstructionError as e:
            raise _Invalid(str(e)) from None
    else:
        raise _Invalid("targets keep falling into snap windows")
    blocks = sep.blocks + lead.blocks + [proj] + snaps
    R, nl = sep.R, len(lead.blocks)
    record = Construction(
        kind="softmax", seed=geo.seed, N=len(geo.m), sum_m=sum(geo.m), R=R,
        phases=[Span("separation", 0, R), Span("leaders", R, R + nl),
                Span("projection", R + nl, R + nl + 1), Span("snap", R + nl + 1, len(blocks))],
        tests=[None if t is None else [str(v) for v in geo.table.points[t]]
               for t in sep.tested()],
        lifts=sep.lifts, leaders=lead.chosen, snap_windows=windows, theta=str(theta),
        folded=fold)
    return Transformer(d=geo.d, attention="softmax", blocks=blocks, tau=tau, exact=exact,
                       record=record)


def _separated_positions(geo, blocks, tau) -> list[np.ndarray]:
    """Token positions after the separation rounds (simulated in float64 when there are any)."""
    if not blocks:
        return geo.inputs
    return [as_number_array(o, geo.exact) if o.dtype != object else o
            for o in _simulate(geo, blocks, tau)]


def _simulate(geo, blocks, tau) -> list[np.ndarray]:
    """Every token's position after ``blocks``, in float64 or at ``geo.digits`` digits."""
    model = Transformer(geo.d, "softmax", blocks, tau=tau, exact=geo.exact)
    if geo.digits is None:
        return forward(model, geo.inputs_f, "float")
    outs = forward(model, geo.inputs, "mp", dps=geo.digits)
    return [_fractions(o) for o in outs]


def _fractions(a: np.ndarray) -> np.ndarray:
    """An array of floats or mpmath numbers as the Fractions of their exact binary values."""
    out = np.empty(a.shape, dtype=object)
    out.flat[:] = [Fraction(float(v)) if isinstance(v, float) else _mp_fraction(v)
                   for v in a.flat]
    return out


def _mp_fraction(v) -> Fraction:
    sign, man, exp, _ = v._mpf_  # v = (−1)^sign · man · 2^exp (mpmath's raw form)
    value = Fraction(int(man) * 2 ** max(exp, 0), 2 ** max(-exp, 0))
    return -value if sign else value


def _project_and_snap(geo, blocks, chosen, tau, draws):
    """Simulate to the collapse, project onto a generic line, and snap each leader group."""
    groups = _groups(_simulate(geo, blocks, tau), chosen)
    resolution = MIN_RELATIVE_GAP if geo.digits is None else Fraction(1, 10 ** (geo.digits - 7))
    proj, snaps, windows = project_and_snap([g for _, _, g in groups],
                                            [geo.targets[j][slot] for j, slot, _ in groups],
                                            draws, geo.per_layer, resolution)
    records = [SnapWindow(j, slot, tuple(str(c) for c in win))
               for (j, slot, _), win in zip(groups, windows, strict=True)]
    return proj, snaps, records


def project_and_snap(blobs: list[np.ndarray], targets: list[np.ndarray], draws: Draws,
                     per_layer: int = 1, resolution: Fraction = MIN_RELATIVE_GAP):
    """A non-residual projection onto a line t·e along a generic f, then one interval snap per
    blob (its simulated points) whose flat part covers the blob and sends it to its target,
    ``per_layer`` snaps on disjoint windows to an FF layer (docs/softmax.md, docs/heads.md).
    Also used by the causal construction (docs/causal.md). Raises ConstructionError when no
    line keeps the blobs apart, :class:`TargetInSnapWindow` when no reader keeps a placed
    target out of later windows. Returns the projection block, the snap blocks and the
    windows (c1, c2, c3, c4) per blob."""
    exact, d = draws.exact, len(targets[0])
    f = best_draw(lambda: draws.vector(d),
                  lambda f: _line_score(_intervals(blobs, f), resolution),
                  what="projection line (groups overlap)")
    iv = _intervals(blobs, f)
    shift = num(Fraction(1) - _rational_below(min(a for a, _ in iv)), exact)
    e = draws.vector(d)
    proj = ff_from_units([projection_unit(f, shift, e)], num(0, exact), d, exact)
    windows = _windows([(a + Fraction(shift), b + Fraction(shift)) for a, b in iv])  # t ≥ 1
    fp = _reader(targets, windows, e, draws)
    units = []
    for y, win in zip(targets, windows, strict=True):
        c1, c2, c3, c4 = (num(c, exact) for c in win)
        units.append(snap_units(fp, num(0, exact), e, c1, c2, c3, c4, y))
    k = per_layer  # snaps on disjoint windows of the line share a layer (docs/heads.md)
    snaps = [Block(ff_from_units([u for s in units[i:i + k] for u in s], num(1, exact), d, exact),
                   None) for i in range(0, len(units), k)]
    return Block(proj, None), snaps, windows


def _groups(outs, chosen) -> list[tuple[int, int, np.ndarray]]:
    """(sequence, slot, simulated points) of every leader group: each non-leader joins its
    sequence's P-leader (slot 0), each leader its own slot."""
    groups = []
    for j, (o, ch) in enumerate(zip(outs, chosen, strict=True)):
        owner = np.zeros(len(o), dtype=int)
        for slot, i in enumerate(ch):
            owner[i] = slot
        groups += [(j, slot, o[owner == slot]) for slot in range(len(ch))]
    return groups


def _intervals(blobs, f) -> list[tuple[Fraction, Fraction]]:
    """Each blob's extent along f, as exact values of the simulated numbers."""
    if blobs[0].dtype != object:
        f = np.asarray(f, dtype=float)
    return [(Fraction((g @ f).min()), Fraction((g @ f).max())) for g in blobs]


def _line_score(intervals, resolution: Fraction) -> float | None:
    """Valid when consecutive groups are farther apart than the wider of the two blobs (and than
    float64 can blur); the score is the smallest gap over the spread."""
    iv = sorted(intervals)
    scale = max(abs(iv[0][0]), abs(iv[-1][1]), 1)
    gaps = [b[0] - a[1] for a, b in zip(iv, iv[1:], strict=False)]
    for g, a, b in zip(gaps, iv, iv[1:], strict=False):
        if g <= max(a[1] - a[0], b[1] - b[0], resolution * scale):
            return None
    return float(min(gaps) / (iv[-1][1] - iv[0][0] or 1)) if gaps else 1.0


def _reader(targets, windows, e, draws):
    """The snaps' reading direction f' = e/|e|² + w (w ⊥ e, so f'·e = 1), redrawn until no
    target placed by a snap lies near a later snap's window."""
    ee = e @ e
    for _ in range(TARGET_TRIES):
        r = draws.vector(len(e))
        fp = e / ee + (r - e * ((r @ e) / ee))
        if _targets_clear(targets, windows, fp):
            return fp
    raise TargetInSnapWindow("a placed target keeps falling into a later snap window")


def _windows(line: list[tuple]) -> list[tuple]:
    """Rational (c1, c2, c3, c4) per group on a dyadic grid: the flat part [c2, c3] reaches a
    distance q = gap/8 beyond the blob, the ramps another q, so windows stay disjoint."""
    order = sorted(range(len(line)), key=lambda k: line[k])
    gap = [Fraction(1)] * len(line)  # to the nearest other group (the intervals are disjoint)
    for i, k in enumerate(order):
        near = [line[k][0] - line[order[i - 1]][1]] if i > 0 else []
        if i + 1 < len(order):
            near.append(line[order[i + 1]][0] - line[k][1])
        gap[k] = min(near, default=Fraction(1))
    out = []
    for (a, b), g in zip(line, gap, strict=True):
        q = g / 8
        step = power_of_two_below(q / 64)
        ramp = _grid(q, step, down=True)
        c2, c3 = _grid(a - q, step, down=True), _grid(b + q, step, down=False)
        out.append((c2 - ramp, c2, c3, c3 + ramp))
    return out


def _grid(v: Fraction, step: Fraction, down: bool) -> Fraction:
    k = math.floor(v / step) if down else math.ceil(v / step)
    return k * step


def _rational_below(v: Fraction) -> Fraction:
    return Fraction(math.floor(v * 1024), 1024)


def _targets_clear(targets, windows, fp) -> bool:
    """No target placed by a snap comes within a ramp's width of a later snap's window."""
    t = [Fraction(y @ fp) for y in targets]
    for k, (c1, c2, _, c4) in enumerate(windows):
        pad = c2 - c1
        if any(c1 - pad < t[i] < c4 + pad for i in range(k)):
            return False
    return True
