"""The plain dense float64 pass (evaluate/dense.py) on stretches of FF layers alone, which it
runs on the distinct rows and writes only where a unit is active: against the same layers
applied to every row, on small integers (every value exact in float64)."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

import exactformer as ef
from exactformer.model import FF, SA, Block, Head, ScoreMatrix, Transformer, ValueMatrix


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


def sparse(d, lo, hi):
    """A length-d integer vector, mostly zeros (the heads of a keyed model read a few
    coordinates), as floats."""
    return st.lists(st.sampled_from([0, 0, 0, *range(lo, hi + 1)]), min_size=d,
                    max_size=d).map(lambda v: np.array(v, dtype=float))


def heads(d):
    """A head whose scores are α⟨x_i, x_l⟩ + (c·x_i)(a·x_l) and value β·y + p(q·y), sparse."""
    return st.builds(lambda al, a, c, be, p, q: Head(ScoreMatrix(al, a, c), ValueMatrix(be, p, q)),
                     st.sampled_from([0.0, 0.0, 1.0, -0.5]), sparse(d, -2, 2), sparse(d, -2, 2),
                     st.sampled_from([0.0, 0.0, 1.0]), sparse(d, -2, 2), sparse(d, -2, 2))


# no explain phase: its tracing takes minutes on a failure
@settings(max_examples=150, deadline=None, phases=[Phase.generate, Phase.shrink])
@given(data=st.data())
def test_attention_blocks_match_the_plain_pass_token_by_token(data):
    """Outputs and every peak of blocks that attend equal those of the plain pass written
    here (every column, every n×n score, each sequence alone): on sequences whose queries
    are all equal (one score row, masked per token when causal), and on scales where
    scores overflow or inputs hold inf or nan (every column, inf·0 = nan)."""
    d = data.draw(st.integers(2, 4))
    blocks = []
    for _ in range(data.draw(st.integers(1, 3))):
        ff = None if data.draw(st.booleans()) else FF(
            data.draw(st.sampled_from([1.0, 0.5])), data.draw(small((2, d), -2, 2)),
            data.draw(small((2,), -3, 1)), data.draw(small((d, 2), -2, 2)))
        sa = SA(data.draw(st.sampled_from([1.0, 0.0])),
                heads=data.draw(st.lists(heads(d), min_size=1, max_size=2)))
        blocks.append(Block(ff, sa if data.draw(st.integers(0, 3)) else None))
    model = Transformer(d=d, attention=data.draw(st.sampled_from(["hardmax", "softmax"])),
                        blocks=blocks, tau=1.0, exact=False, causal=data.draw(st.booleans()))
    scale = data.draw(st.sampled_from([1.0, 1.0, 2.0 ** 600, 2.0 ** -600]))
    xs = []
    for _ in range(data.draw(st.integers(1, 4))):
        x = data.draw(small((data.draw(st.integers(1, 4)), d), -3, 3)) * scale
        if data.draw(st.booleans()):
            x[:, 0] = 1.0  # a coordinate every token holds: equal queries where A reads it
        if data.draw(st.integers(0, 9)) == 0:
            x[0, -1] = data.draw(st.sampled_from([np.inf, -np.inf, np.nan]))
        xs.append(x)
    peaks: dict = {}
    got = ef.evaluate.dense_forward(model, xs, peaks=peaks)
    want_peaks: dict = {}
    want = [plain_pass(model, x, want_peaks) for x in xs]
    size = max(np.abs(v[np.isfinite(v)]).max(initial=0.0) for v in [*xs, *want])
    tol = 1e-10 * size  # softmax weights and 1/|argmax| round; a sum may cancel to 0 or not
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=tol)
    assert peaks.keys() == want_peaks.keys()
    for key, top in want_peaks.items():
        np.testing.assert_allclose(peaks[key], top, rtol=1e-12, atol=tol, err_msg=str(key))


def plain_pass(model, X: np.ndarray, peaks: dict) -> np.ndarray:
    """One sequence through every block as written, recording each part's largest |value|
    into ``peaks`` (nan once seen stays, as dense_forward records it)."""
    def note(k, part, values):
        top = float(np.abs(values).max())
        old = peaks.get((k, part), 0.0)
        peaks[k, part] = math.nan if math.isnan(top) or math.isnan(old) else max(old, top)

    n = len(X)
    seen = np.tril(np.ones((n, n), dtype=bool)) if model.causal else np.ones((n, n), bool)
    with np.errstate(all="ignore"):
        for k, blk in enumerate(model.blocks):
            if blk.ff is not None:
                Z = X @ blk.ff.U.T + blk.ff.b
                note(k, "FF pre-activation", Z)
                X = blk.ff.eta * X + np.maximum(Z, 0.0) @ blk.ff.W.T
                note(k, "FF output", X)
            if blk.sa is not None and not blk.sa.is_identity():
                out = blk.sa.rho * X
                for head in blk.sa.heads:
                    S = (X @ head.A.dense().T) @ X.T
                    note(k, "scores", S)
                    S = np.where(seen, S, -np.inf)
                    if model.attention == "hardmax":
                        M = (S == S.max(axis=1, keepdims=True)).astype(float)
                    else:
                        M = np.exp(S - S.max(axis=1, keepdims=True))
                    out = out + (M / M.sum(axis=1, keepdims=True) @ X) @ head.V.dense().T
                X = out
            note(k, "state", X)
    return X
