"""The plain dense float64 pass (evaluate/dense.py) on stretches of FF layers alone, which it
runs on the distinct rows and writes only where a unit is active: against the same layers
applied to every row, on small integers (every value exact in float64)."""

from __future__ import annotations

import numpy as np
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

import exactformer as ef
from exactformer.model import FF, Block, Transformer


def small(shape, lo, hi):
    """Integer arrays of ``shape`` with entries in [lo, hi], as floats."""
    n = int(np.prod(shape))
    return st.lists(st.integers(lo, hi), min_size=n, max_size=n).map(
        lambda v: np.array(v, dtype=float).reshape(shape))


# no explain phase: its tracing takes minutes on a failure
@settings(max_examples=200, deadline=None, phases=[Phase.generate, Phase.shrink])
@given(data=st.data())
def test_ff_stretch_peaks_and_outputs_match_every_row_dense(data):
    """Outputs and every peak of a stretch of residual FFs equal those of the same layers on
    every row: a unit that fires on a column's largest entry and lowers it lowers that
    column's peak, which the pass must see though it wrote no other row."""
    d = data.draw(st.integers(1, 3))
    blocks = []
    for _ in range(data.draw(st.integers(1, 4))):
        h = data.draw(st.integers(1, 3))
        blocks.append(Block(FF(1.0, data.draw(small((h, d), -2, 2)),
                               data.draw(small((h,), -4, 1)),
                               data.draw(small((d, h), -3, 3))), None))
    model = Transformer(d=d, attention="hardmax", blocks=blocks, exact=False)
    xs = [data.draw(small((data.draw(st.integers(1, 5)), d), -4, 4))
          for _ in range(data.draw(st.integers(1, 3)))]
    peaks: dict = {}
    got = ef.evaluate.dense_forward(model, xs, peaks=peaks)
    X, want = np.concatenate(xs), {}
    for k, blk in enumerate(blocks):
        Z = X @ blk.ff.U.T + blk.ff.b
        X = X + np.maximum(Z, 0) @ blk.ff.W.T
        want[k, "FF pre-activation"] = np.abs(Z).max()
        want[k, "FF output"] = want[k, "state"] = np.abs(X).max()
    assert np.array_equal(np.concatenate(got), X)
    assert peaks == want
