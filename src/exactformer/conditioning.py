"""Conditioning statistics of a model: parameter norms and the largest slope of a ReLU unit.

These numbers bound how much rounding a plain dense evaluation can add: a unit w·relu(u·x + b)
turns an error ε in its pre-activation into |w|·ε at the output, and its pre-activation is
computed with an error of about (unit roundoff)·|u|·|x|, so the largest |u|·|w| (the unit's
Lipschitz constant) is what a float32 or bfloat16 runtime amplifies. See
docs/numerics.md#conditioning. Pure NumPy; exact (Fraction) models are read as float64.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from .model import Transformer


@dataclass(frozen=True)
class Conditioning:
    """‖θ‖₂², max|θ| over every parameter, and max over FF units of |u|₂·|w|₂."""

    norm_sq: float
    max_abs: float
    max_slope: float

    def to_dict(self) -> dict:
        return asdict(self)


def conditioning(model: Transformer) -> Conditioning:
    """The conditioning statistics of ``model`` (parameters as ``Transformer.parameter_arrays``
    lists them; positions of a causal model count as parameters too)."""
    arrays = [_floats(a).ravel() for a in model.parameter_arrays()]
    if model.positions is not None:
        arrays.append(_floats(model.positions).ravel())
    flat = np.concatenate(arrays) if arrays else np.zeros(0)
    slope = 0.0
    for block in model.blocks:
        if block.ff is not None and block.ff.width:
            u = np.linalg.norm(_floats(block.ff.U), axis=1)
            w = np.linalg.norm(_floats(block.ff.W), axis=0)
            slope = max(slope, float((u * w).max()))
    return Conditioning(float(flat @ flat), float(np.abs(flat).max(initial=0.0)), slope)


def _floats(a) -> np.ndarray:
    return np.asarray(a, dtype=float)
