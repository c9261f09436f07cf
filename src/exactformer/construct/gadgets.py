"""The ReLU gadgets of DESIGN §3 as hidden units, and the assembly of FF layers from them.

A unit is (u, b, w): it contributes w·relu(u·x + b). Gadgets read t = f·x + t0 for a direction f
(and an offset t0, so that a gadget can read a coordinate that the same layer computes).
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
    """Move every token with f·x + t0 = c by D; leave |f·x + t0 − c| ≥ δ untouched.

    With ``plateau`` (4 ReLUs) every token with |t − c| ≤ δ/2 moves by exactly D, so a token that
    arrives slightly off c (float rounding, softmax blur) still lands exactly where intended;
    without it this is DESIGN's 3-ReLU hat, used where a layer has only 3 units to spare.
    """
    if not plateau:
        return [Unit(f, t0 - c + delta, D / delta),
                Unit(f, t0 - c, D * (-2) / delta),
                Unit(f, t0 - c - delta, D / delta)]
    # Dyadic δ and c (c moves by ≤ δ/8, so the token stays on the plateau and every token
    # outside stays outside): the biases are then exact in float64, so a float64 evaluation,
    # also of a rational model, is exactly zero outside the window and exactly D on the plateau.
    k = math.floor(math.log2(delta))
    delta = Fraction(2) ** k if isinstance(delta, Fraction) else 2.0 ** k
    c = round(c / (delta / 4)) * (delta / 4)
    half = delta / 2
    return [Unit(f, t0 - c + delta, D / half), Unit(f, t0 - c + half, -D / half),
            Unit(f, t0 - c - half, -D / half), Unit(f, t0 - c - delta, D / half)]


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
    w = len(units)
    U, b, W = zeros((w, d), exact), zeros(w, exact), zeros((d, w), exact)
    for i, un in enumerate(units):
        U[i], b[i], W[:, i] = un.u, un.b, un.w
    return FF(eta, U, b, W)
