"""The evaluation stage: forward passes of a model in exact, float64 or mpmath arithmetic.

``forward`` (set data), ``forward_causal`` (decoder data), ``enclose`` (float64 with rigorous
radii) and ``predict`` are the interface; ``dense_forward`` is the plain float64 reference pass.
See docs/numerics.md.
"""

from .passes import (
    ARITHMETICS,
    Arithmetic,
    CausalScan,
    PassStats,
    Ridge,
    causal_row,
    dense_forward,
    direction_scales,
    distinct_rows,
    enclose,
    forward,
    forward_causal,
    in_arithmetic,
    predict,
    relu,
    ridge_groups,
    ridge_window,
    ridges_in,
    ridges_of,
    with_positions,
)

__all__ = ["ARITHMETICS", "Arithmetic", "CausalScan", "PassStats", "Ridge", "causal_row",
           "dense_forward", "direction_scales", "distinct_rows", "enclose", "forward",
           "forward_causal", "in_arithmetic", "predict", "relu", "ridge_groups", "ridge_window",
           "ridges_in", "ridges_of", "with_positions"]
