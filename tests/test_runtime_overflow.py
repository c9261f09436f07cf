"""Runtime proofs where an intermediate of some evaluation may overflow although the exact
values it leads to are moderate: inf − inf and 0·inf are nan, which no box contains
(docs/numerics.md#proofs-for-reduced-precision-runtimes). Each model here is proved by none
of the runtimes it would break in."""

from __future__ import annotations

import numpy as np

import exactformer as ef
from exactformer.model import FF, SA, Block, ScoreMatrix, Transformer, ValueMatrix


def test_an_off_unit_whose_float32_sums_overflow_is_not_passed_over():
    """A residual FF's unit is far below 0 exactly (2·x − 4·x = −4·10³⁸), but its float32
    products overflow to +inf and −inf: the runtime's pre-activation is nan and relu(nan)
    reaches the output through W. The coarse 'every unit off' shortcut must not pass the row."""
    ff = FF(1.0, np.array([[2.0, -4.0]]), np.array([0.0]), np.array([[1.0], [0.0]]))
    model = Transformer(2, "hardmax", [Block(ff, None)], exact=False)
    X = [[[2e38, 2e38], [1.0, 1.0]]]
    data = ef.Dataset.from_arrays(X, X)
    with np.errstate(all="ignore"):
        z = np.float32(2e38) * np.float32(2) + np.float32(2e38) * np.float32(-4)
    assert np.isnan(z)  # what every float32 evaluation of the unit computes
    assert not ef.prove_runtime(model, data, "float32").ok
