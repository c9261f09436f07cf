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
from .numbers import safe_floats


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
    lists them; positions of a causal model count as parameters too). One array operation
    over all layers at once: a large model has 10^5 layers. Values beyond float64 count as
    inf."""
    arrays = [*model.parameter_arrays(),
              *([] if model.positions is None else [np.asarray(model.positions).ravel()])]
    flat = _floats(np.concatenate(arrays, dtype=object if model.exact else float,
                                  casting="unsafe")) if arrays else np.zeros(0)
    ffs = [b.ff for b in model.blocks if b.ff is not None and b.ff.width]
    slope = 0.0
    with np.errstate(over="ignore", invalid="ignore"):
        if ffs:
            u = np.linalg.norm(_floats(np.concatenate([ff.U for ff in ffs])), axis=1)
            w = np.linalg.norm(_floats(np.concatenate([ff.W.T for ff in ffs])), axis=1)
            slope = float((u * w).max())
        return Conditioning(float(flat @ flat), float(np.abs(flat).max(initial=0.0)), slope)


def _floats(a) -> np.ndarray:
    """float64 values, inf for a rational beyond float64 range."""
    a = np.asarray(a)
    return a if a.dtype == float else safe_floats(a)
