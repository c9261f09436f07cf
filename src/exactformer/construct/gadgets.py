"""The ReLU gadgets as hidden units, and the assembly of FF layers from them.

A unit is (u, b, w): it contributes w·relu(u·x + b). Gadgets read t = f·x + t0 for a direction f
(and an offset t0, so that a gadget can read a coordinate that the same layer computes).
Derivations: docs/gadgets.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from ..model import FF
from ..numbers import zeros


@dataclass
class Unit:
    u: np.ndarray
    b: object
    w: np.ndarray


def hat_units(f, t0, c, delta, D, plateau: bool = True) -> list[Unit]:
    """Move the token with t = f·x + t0 = c by D; leave every token with |t − c| ≥ 2δ untouched.

    Without ``plateau`` this is the 3-ReLU hat D·max(0, 1 − |t − c|/δ), used where a layer has
    only 3 units to spare: exact at t = c, zero for |t − c| ≥ δ. With it (4 ReLUs) δ becomes the
    largest power of two δ' ≤ δ and c the nearest multiple c' of δ'/4; the layer adds exactly D
    for |t − c'| ≤ δ'/2 (so a token within 3δ'/8 of c, slightly off through rounding or softmax
    blur, still lands exactly) and exactly 0 for |t − c'| ≥ δ', which contains |t − c| ≥ 9δ/8.
    Breakpoints on a dyadic grid are exact in float64 too. See docs/gadgets.md.
    """
    if not plateau:
        base, w = t0 - c, D / delta
        return [Unit(f, base + delta, w), Unit(f, base, D * (-2) / delta), Unit(f, base - delta, w)]
    delta = power_of_two_below(delta)
    step = delta / 4
    if isinstance(c, np.generic):  # the same value as a Python number: a much faster round
        c = c.item()
    c = round(c / step) * step
    half = delta / 2
    base = t0 - c
    w = D / half
    nw = -w  # = −D/half exactly (negation is exact in float64 too)
    return [Unit(f, base + delta, w), Unit(f, base + half, nw), Unit(f, base - half, nw),
            Unit(f, base - delta, w)]


def power_of_two_below(x):
    """The largest power of two ≤ x > 0, exactly, in x's arithmetic (Fraction or float)."""
    if isinstance(x, Fraction):
        p = Fraction(2) ** (x.numerator.bit_length() - x.denominator.bit_length())
        return p if p <= x else p / 2
    return math.ldexp(0.5, math.frexp(float(x))[1])


def snap_units(f, t0, e, c1, c2, c3, c4, y) -> list[Unit]:
    """Interval snap (4 ReLUs) for tokens x = t·e with f·e = 1: every t ∈ [c2, c3] goes to y
    exactly, and the layer is the identity when t ∉ (c1, c4)."""
    w1 = (y - e * c2) / (c2 - c1)
    w4 = (y - e * c3) / (c4 - c3)
    return [Unit(f, t0 - c1, w1), Unit(f, t0 - c2, -e - w1),
            Unit(f, t0 - c3, e - w4), Unit(f, t0 - c4, w4)]


def projection_unit(f, t0, e) -> Unit:
    """e·relu(f·x + t0): with η = 0 this projects onto the line of e (f·x + t0 > 0 assumed)."""
    return Unit(f, t0, e)


def ff_from_units(units: list[Unit], eta, d: int, exact: bool) -> FF:
    """The FF layer η·x + Σ w·relu(u·x + b) over ``units`` (one hidden unit each, in order),
    balanced: U and b times a power of two c, W divided by it (:func:`balance_scale`). In a
    non-residual layer the first unit is the projection unit and keeps its scale, so W's first
    column stays the direction e of the line it projects onto; the gadgets after it are
    balanced together."""
    w = len(units)
    U, b, W = zeros((w, d), exact), zeros(w, exact), zeros((d, w), exact)
    for i, un in enumerate(units):
        U[i], b[i], W[:, i] = un.u, un.b, un.w
    return balanced_ff(U, b, W, eta, exact)


def balanced_ff(U: np.ndarray, b: np.ndarray, W: np.ndarray, eta, exact: bool) -> FF:
    """The layer η·x + W·relu(U·x + b), balanced as :func:`ff_from_units` describes."""
    s = 1 if eta == 0 else 0
    c = balance_scale(U[s:], b[s:], W[:, s:], exact)
    U[s:], b[s:], W[:, s:] = U[s:] * c, b[s:] * c, W[:, s:] / c
    return FF(eta, U, b, W)


def balance_scale(U: np.ndarray, b: np.ndarray, W: np.ndarray, exact: bool):
    """The power of two c nearest (in log) to the minimiser of c²·‖(U, b)‖² + ‖W‖²/c².

    relu(c·z)·w/c = relu(z)·w for c > 0, so the layer computes the same function, exactly, and
    with c a power of two also bit-for-bit in binary floating point (barring overflow and
    subnormals); only its parameter norm shrinks (never grows: the objective is convex and
    symmetric in log c about its minimiser): a hat of slope D/h keeps |u|·|w| but no longer
    carries D/h as one weight. Norms are taken as base-2 logarithms, so data near the float64
    range cannot overflow here. See docs/numerics.md#balancing.
    """
    inner = _log2_norm(np.concatenate([np.ravel(U), np.ravel(b)]))
    outer = _log2_norm(np.ravel(W))
    k = 0 if inner is None or outer is None else round((outer - inner) / 2)
    return Fraction(2) ** k if exact else math.ldexp(1.0, k)


def _log2_norm(values: np.ndarray):
    """log2 of the Euclidean norm of ``values`` (Fractions or floats; None if all are 0),
    computed as log2 M + log2 ‖values/M‖ with M the largest |value|, which cannot overflow."""
    if values.dtype != object:  # the same numbers as below, divided and squared at once
        top = float(np.abs(values).max(initial=0.0))
        if top == 0:
            return None
        return math.log2(top) + math.log2(math.fsum(np.square(values / top).tolist())) / 2
    top = max((abs(v) for v in values), default=0)
    if top == 0:
        return None
    rest = math.log2(math.fsum(float(v / top) ** 2 for v in values)) / 2
    if isinstance(top, Fraction):
        return math.log2(top.numerator) - math.log2(top.denominator) + rest
    return math.log2(float(top)) + rest
