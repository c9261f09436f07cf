"""Causal verdicts from float64 enclosures (docs/verification.md#what-verify-decides): per
position, a rigorous bound on the exact output's distance from its target, and the softmax
verdict they give when every constrained position is within the limit."""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from ..evaluate import enclosure
from ..numbers import float_below


def causal_bounds(enclosed, dataset, ys_f) -> list[np.ndarray]:
    """Per sequence and position, an upper bound on the distance of the exact output from the
    target (0 at unconstrained positions, inf where the enclosure knows nothing): the
    enclosure's box and the float distance, inflated by their rounding
    (:func:`exactformer.evaluate.enclosure.hausdorff_upper` on one-point sets)."""
    mids, rads = enclosed[:2]
    out = []
    for o, r, y, k in zip(mids, rads, ys_f, dataset.known, strict=True):
        b = np.zeros(len(k))
        if k.any():
            one = (o[k][:, None], r[k][:, None], y[k][:, None], np.zeros_like(y[k][:, None]))
            with np.errstate(all="ignore"):
                up = enclosure.hausdorff_upper(*one)
            b[k] = np.where(np.isnan(up), np.inf, up)
        out.append(b)
    return out


def softmax_by_enclosures(enclosed, dataset, ys_f, limit: Fraction) -> dict | None:
    """The verdict fields of a float64 causal softmax model whose enclosure (``enclosed``:
    outputs, radii, statistics; None: not enclosed) bounds every constrained position of
    every sequence within the limit: OK, never a proof of exactness, as the enclosures' OK
    of a set model. None where some position's bound is above the limit (or unknown): the
    ball pass then decides the whole data, as without the enclosure."""
    if enclosed is None:
        return None
    bounds = causal_bounds(enclosed, dataset, ys_f)
    below = float_below(limit)
    if not all((b <= below).all() for b in bounds):
        return None
    return dict(arithmetic="float64 enclosures", exact_equal=None,
                position_errors=[list(b) for b in bounds], first_failure=None,
                undecided_positions=[], bound_exact=False)
