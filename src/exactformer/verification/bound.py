"""Rigorous error bounds for softmax models: what ``verify`` decides them by.

A softmax model is run on its data in ball arithmetic (:class:`balls.Run`: every value encloses
the true real one, no attention weight is ever dropped), and each pair's error is then bounded
from above and below with exact rational endpoints. A pair is *within* when the upper bound
is at most the limit, *beyond* when the lower bound exceeds it, and otherwise *undecided*;
precision is doubled from 64 bits while some pair is undecided and none is beyond. Limits are
compared with ``==``/``<=`` on rationals, never after a float conversion. The errors are the
Hausdorff distance of output and target sets (set models) or the distance of each constrained
output to its target (causal models). See docs/verification.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from fractions import Fraction

import numpy as np
from flint import arb, arb_mat, ctx, fmpq

from ..distance import smallest, worst
from ..evaluate import forward, forward_causal
from ..model import first_mixing
from .balls import Exact, Layers, Run, as_ball, as_fmpq, column
from .certify import Proof, judge

START_BITS = 64
HUGE_EXPONENT = 1 << 20  # endpoints beyond 2^±HUGE_EXPONENT count as unbounded


def max_bits(digits: int) -> int:
    """The largest ball precision tried: as many bits as 16 × ``digits`` decimal digits."""
    return max(START_BITS, math.ceil(16 * digits * math.log2(10)))


@dataclass
class Bound:
    """What the ball pass showed, per pair (set data) or per sequence (causal data).

    ``status``: "within", "beyond" or "undecided" against the limit. ``upper``: an upper bound
    on the error (float64, rounded up; inf when unbounded). ``measured``: the error of the
    balls' midpoints, a measurement only. ``bits``: the precision of the last pass. ``proof``:
    certify's judgement of the same outputs (set data only). Causal data: ``positions`` holds
    per sequence the (position, status, upper) of every constrained position."""

    status: list[str]
    upper: list[float]
    measured: list[float]
    bits: int
    proof: Proof | None = None
    positions: list[list[tuple[int, str, float]]] = field(default_factory=list)

    @property
    def exact(self) -> bool:
        """Every error is bounded by 0: each output is exactly its target (a proof)."""
        return all(u == 0 for u in self.upper)


def exact_prefix(model, xs: list) -> tuple[int, list]:
    """(first block whose attention mixes tokens, the exact rows entering it): the blocks
    before act on each token alone, exactly as the exact pass computes them (positions
    added, equal tokens of all sequences pooled, keyed layers looked up), so the ball pass
    starts there instead of carrying every token through them one by one."""
    first = first_mixing(model.blocks)
    if first == 0:
        return 0, xs
    prefix = replace(model, blocks=model.blocks[:first], attention="hardmax")
    return first, (forward_causal if model.causal else forward)(prefix, xs, "exact")


def bound_set(model, dataset, limit: Fraction, digits: int = 50, tau=None) -> Bound:
    """Bound the Hausdorff error of every pair of a softmax set model (docs/verification.md)."""
    xs, ys = dataset.fractions()
    targets = [[column(map(as_fmpq, row)) for row in y] for y in ys]
    layers, bits = Layers(model, tau), START_BITS
    start, xs = exact_prefix(model, xs)
    lim2 = _fmpq(limit) ** 2
    while True:
        run = Run(layers, bits)
        outs = run.outputs(xs, start)
        proof = judge(outs, targets, bits, run.first_doubt)
        with _precision(bits):
            found = [_hausdorff(o, t) for o, t in zip(outs, targets, strict=True)]
        status = [_status(lo, hi, lim2) for lo, hi, _ in found]
        if proof.proved or _settled(status) or bits >= max_bits(digits):
            return Bound(status, [_root_up(hi) for _, hi, _ in found],
                         [m for _, _, m in found], bits, proof)
        bits = min(2 * bits, max_bits(digits))


def bound_causal(model, dataset, limit: Fraction, digits: int = 50, tau=None) -> Bound:
    """Bound the error at every constrained position of a softmax causal model."""
    xs, ys = dataset.fractions()
    layers, bits = Layers(model, tau), START_BITS
    start, xs = exact_prefix(model, xs)
    lim2 = _fmpq(limit) ** 2
    while True:
        outs = Run(layers, bits).outputs(xs, start)
        with _precision(bits):
            per = [[(i, *_squared(o[i], column(map(as_fmpq, y[i]))))
                    for i in range(len(k)) if k[i]]
                   for o, y, k in zip(outs, ys, dataset.known, strict=True)]
        rows = [[(i, _status(lo, hi, lim2), hi, m) for i, lo, hi, m in p] for p in per]
        status = [_worst_status([s for _, s, _, _ in r]) for r in rows]
        if _settled(status) or bits >= max_bits(digits):
            return Bound(status, [_root_up(_max_up([hi for _, _, hi, _ in r])) for r in rows],
                         [worst([0.0, *(m for *_, m in r)]) for r in rows], bits,
                         positions=[[(i, s, _root_up(hi)) for i, s, hi, _ in r] for r in rows])
        bits = min(2 * bits, max_bits(digits))


# ------------------------------------------------------------------------------ distances
def _squared(tok, y) -> tuple[fmpq, fmpq | None, float]:
    """(lower, upper, measured) for |tok − y|²: exact rationals for an exact point, else the
    ball's endpoints made exact (upper None: unbounded); ``measured`` from the midpoint."""
    if isinstance(tok, Exact):
        v = sum(((a - b) ** 2 for a, b in zip(tok.o.entries(), y.entries(), strict=True)),
                fmpq(0))
        return v, v, _root_up(v)
    diff = as_ball(tok) - arb_mat(y)
    # x·x, not x**2: python-flint's power gives nan for a ball with midpoint exactly 0
    sq = sum((diff[t, 0] * diff[t, 0] for t in range(diff.nrows())), arb(0))
    lo, hi = _endpoints(sq)
    mids = [float(diff[t, 0].mid()) for t in range(diff.nrows())]  # inf beyond float64
    with np.errstate(over="ignore"):
        measured = float(np.sqrt(np.sum(np.square(mids))))
    return max(lo, fmpq(0)), hi, measured


def _hausdorff(toks: list, targets: list) -> tuple[fmpq, fmpq | None, float]:
    """(lower, upper, measured) for the squared Hausdorff distance of the output tokens and
    the target set: min and max are monotone, so the endpoints go through them separately."""
    sq = [[_squared(t, y) for y in targets] for t in toks]
    cols = list(zip(*sq, strict=True))
    lo = max(max(min(e[0] for e in row) for row in sq), max(min(e[0] for e in c) for c in cols))
    hi = _max_up([_min_up([e[1] for e in row]) for row in sq] +
                 [_min_up([e[1] for e in c]) for c in cols])
    meas = worst([smallest(e[2] for e in row) for row in sq] +
                 [smallest(e[2] for e in c) for c in cols])
    return lo, hi, meas


def _min_up(values: list) -> fmpq | None:
    """The minimum of upper bounds (None: unbounded)."""
    known = [v for v in values if v is not None]
    return min(known) if known else None


def _max_up(values: list) -> fmpq | None:
    if not values:
        return fmpq(0)
    return None if any(v is None for v in values) else max(values)


def _endpoints(x: arb) -> tuple[fmpq, fmpq | None]:
    """The ball's lower and upper ends as exact rationals (lower −∞ is reported as 0 by the
    caller's clamp: squared distances are never negative)."""
    if not x.is_finite():
        return fmpq(0), None
    lo, hi = _exact(x.lower()), _exact(x.upper())
    return (fmpq(0) if lo is None else lo), hi


def _exact(e: arb) -> fmpq | None:
    """An exact (radius 0) arb as a rational; None when its exponent is beyond all reason."""
    m, ex = e.man_exp()
    m, ex = int(m), int(ex)
    if abs(ex) > HUGE_EXPONENT:
        return None
    return fmpq(m * 2 ** ex) if ex >= 0 else fmpq(m, 2 ** -ex)


def _status(lo: fmpq, hi: fmpq | None, lim2: fmpq) -> str:
    if hi is not None and hi <= lim2:
        return "within"
    return "beyond" if lo > lim2 else "undecided"


def _worst_status(values: list[str]) -> str:
    for s in ("beyond", "undecided"):
        if s in values:
            return s
    return "within"


def _settled(status: list[str]) -> bool:
    """Nothing more to learn: every pair decided, or one certainly beyond (a failure)."""
    return "beyond" in status or "undecided" not in status


def _root_up(v: fmpq | None) -> float:
    """√v as a float64 no smaller than the true root (for reports)."""
    if v is None:
        return math.inf
    if v == 0:
        return 0.0
    p, q = int(v.p), int(v.q)
    try:
        r = math.sqrt(p / q)  # exact-rounded division; 0 below the float64 range
        if r == 0:
            r = math.exp((math.log(p) - math.log(q)) / 2)
    except OverflowError:
        return math.inf
    return math.nextafter(math.nextafter(r, math.inf), math.inf)


def _fmpq(v: Fraction) -> fmpq:
    return fmpq(v.numerator, v.denominator)


class _precision:
    """Work at ``bits`` bits of ball precision inside the block."""

    def __init__(self, bits: int):
        self.bits = bits

    def __enter__(self):
        self.saved, ctx.prec = ctx.prec, self.bits

    def __exit__(self, *exc):
        ctx.prec = self.saved
