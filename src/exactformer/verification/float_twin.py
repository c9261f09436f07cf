"""Rational causal hardmax models proved by a float64 enclosure (docs/verification.md).

A rational model whose every parameter and stored position is a float64 exactly computes, on
inputs that are floats exactly, the same function as its float64 copy: so the causal
enclosure of that copy (:func:`exactformer.evaluate.enclose`) bounds the rational model's exact
outputs. A radius of exactly 0 says the float output *is* the exact output
(docs/numerics.md#exact-rows), and a position whose float output then equals its target as
rationals is proved equal without the exact pass. Every other sequence still goes to it.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from ..model import Transformer
from ..numbers import to_fraction_array


def float_twin(model: Transformer) -> Transformer | None:
    """``model`` in float64 when that changes no parameter and no stored position (compared
    as rationals), else None (a parameter beyond float64 or not a float64 value)."""
    try:
        twin = model.to_float()
    except OverflowError:
        return None
    pairs = list(zip(model.parameter_arrays(), twin.parameter_arrays(), strict=True))
    if model.positions is not None:
        pairs.append((np.ravel(model.positions), np.ravel(twin.positions)))
    same = all(_equal(exact, f) for exact, f in pairs)
    return twin if same else None


def floats_exactly(exact: list, floats: list) -> bool:
    """Whether every float64 array of ``floats`` holds the rationals of ``exact`` unrounded."""
    return all(_equal(np.ravel(e), np.ravel(f)) for e, f in zip(exact, floats, strict=True))


def _equal(exact, floats) -> bool:
    exact = np.asarray(exact, dtype=object).ravel()
    floats = np.asarray(floats, dtype=float).ravel()
    if not np.isfinite(floats).all():
        return False
    return all(Fraction(f) == Fraction(e) for f, e in zip(floats.tolist(), exact.tolist(),
                                                          strict=True))


def proved_equal(mids: np.ndarray, rads: np.ndarray, y: np.ndarray, known) -> bool:
    """One sequence: every constrained position has radius 0 in every coordinate and a float
    output equal to its target (exact rationals ``y``, the model's width; zero-padded)."""
    k = np.asarray(known, dtype=bool)
    if not k.any():
        return True
    if (rads[k] != 0).any() or not np.isfinite(mids[k]).all():
        return False
    target = to_fraction_array(y)
    out = mids[k]
    pad = out.shape[1] - target.shape[1]
    return all(Fraction(v) == t for row, want in zip(out.tolist(), target[k].tolist(),
                                                      strict=True)
               for v, t in zip(row, list(want) + [Fraction(0)] * pad, strict=True))
