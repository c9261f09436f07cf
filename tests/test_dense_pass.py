"""The plain dense float64 pass (evaluate/dense.py and the modules it runs: dense_stretch.py
for blocks that do not mix tokens, dense_batch.py for those that do) against the plain pass
written here, every layer on every token, every column and every score. On small integers
every value is exact in float64, so any order of the sums gives the same numbers and the
comparison is exact."""

from __future__ import annotations

import math
from unittest import mock

import numpy as np
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

import exactformer as ef
from exactformer.evaluate import boxes, dense
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


def stretch_blocks(data, d: int) -> list[Block]:
    """Mostly residual FF layers whose units fire on a few rows (a bias below most U·x, as
    a keyed model's moves), some wide, some with η = 1/2, an infinite weight or no FF, and
    now and then a block whose head averages the sequence (hardmax over equal scores:
    weights 1/n)."""
    blocks = []
    for _ in range(data.draw(st.integers(1, 12))):
        if data.draw(st.integers(0, 9)) == 0:
            ff = None
        else:
            h = data.draw(st.integers(1, 3))
            ff = FF(data.draw(st.sampled_from([1.0, 1.0, 1.0, 0.5])),
                    data.draw(small((h, d), -2, 2)), data.draw(small((h,), -12, 2)),
                    data.draw(small((d, h), -3, 3)))
            if data.draw(st.integers(0, 19)) == 0:  # 0·inf = nan on a row no unit fires on
                ff.W[0, 0] = np.inf
        sa = None
        if data.draw(st.integers(0, 5)) == 0:  # attention between stretches
            sa = SA(1.0, heads=[Head(ScoreMatrix(0.0, np.zeros(d), np.zeros(d)),
                                     ValueMatrix(0.0, data.draw(small((d,), 0, 1)),
                                                 data.draw(small((d,), 0, 1))))])
        blocks.append(Block(ff, sa))
    return blocks


def pooled_sequences(data, d: int) -> list[np.ndarray]:
    """Sequences drawn from a small pool of tokens (rows repeat within and across
    sequences), now and then holding inf or nan."""
    pool = data.draw(small((data.draw(st.integers(1, 40)), d), -4, 4))
    if data.draw(st.integers(0, 7)) == 0:
        pool[data.draw(st.integers(0, len(pool) - 1)), data.draw(st.integers(0, d - 1))] = \
            data.draw(st.sampled_from([np.inf, -np.inf, np.nan]))
    xs = []
    for _ in range(data.draw(st.integers(1, 12))):
        n = data.draw(st.sampled_from([1, 2, 4]))  # (a head's weights 1/n are exact)
        xs.append(pool[data.draw(st.lists(st.integers(0, len(pool) - 1), min_size=n,
                                          max_size=n))])
    return xs


def test_a_peak_within_the_limit_is_recorded_when_no_row_is_evaluated():
    """Layer 1 turns every row on and writes nothing: each row leaves its box and, one dirty
    row at a time (ABSORB = 1), goes into a new one, so the old boxes are empty. Layer 2
    (U = 0, b = 0) has bound 0 on every box and picks an empty one as its largest; under a
    limit the other boxes' bound stands for them, and no row is evaluated. Its pre-activation
    peak must still be recorded (0, as the plain pass's), not left out."""
    zero = FF(1.0, np.zeros((1, 2)), np.zeros(1), np.zeros((2, 1)))
    model = Transformer(d=2, attention="hardmax", exact=False, blocks=[
        Block(zero), Block(FF(1.0, np.zeros((1, 2)), np.ones(1), np.zeros((2, 1)))),
        Block(zero)])
    X = np.column_stack([np.arange(4.0), np.zeros(4)])
    peaks: dict = {}
    with mock.patch.object(boxes, "GROUP", 2), mock.patch.object(boxes, "ABSORB", 1):
        ef.evaluate.dense_forward(model, [X], peaks=peaks, peak_limit=0.5)
    want: dict = {}
    plain_pass(model, X, want)
    assert peaks.keys() == want.keys()
    assert want[2, "FF pre-activation"] <= peaks[2, "FF pre-activation"] <= 0.5


# no explain phase: its tracing takes minutes on a failure
@settings(max_examples=100, deadline=None, phases=[Phase.generate, Phase.shrink])
@given(data=st.data())
def test_stretches_on_boxes_match_the_plain_pass_exactly(data):
    """Outputs and every peak equal the plain pass's, exactly, whatever the boxes' size
    and the number of dirty rows they absorb (drawn small here, so that rows leave boxes,
    are absorbed into new ones and boxes are rebuilt within a few layers): a box skipped
    must hold no active row and no row above the peak, and a written row must leave its
    box's bounds. With a peak limit, a peak above it is still exact, and one at most the
    limit comes as a bound between it and the limit."""
    d = data.draw(st.integers(1, 4))
    model = Transformer(d=d, attention="hardmax", blocks=stretch_blocks(data, d),
                        exact=False)
    xs = pooled_sequences(data, d)
    limit = data.draw(st.sampled_from([None, 0.5, 4.0, 64.0]))
    peaks: dict = {}
    with mock.patch.object(boxes, "GROUP", data.draw(st.sampled_from([2, 3, 4, 32]))), \
            mock.patch.object(boxes, "ABSORB", data.draw(st.sampled_from([1, 2, 5, 128]))):
        got = ef.evaluate.dense_forward(model, xs, peaks=peaks, peak_limit=limit)
    want_peaks: dict = {}
    want = [plain_pass(model, x, want_peaks) for x in xs]
    for g, w in zip(got, want, strict=True):
        assert np.array_equal(g, w, equal_nan=True)
    assert peaks.keys() == want_peaks.keys()
    for key, top in want_peaks.items():
        if math.isnan(top) or limit is None or top > limit:
            assert top == peaks[key] or (math.isnan(top) and math.isnan(peaks[key])), key
        else:
            assert top <= peaks[key] <= limit, key


@pytest.mark.parametrize("limit", [None, 50.0, 120.0, 200.0])
def test_a_peak_limit_keeps_the_peak_above_it_exact_and_bounds_the_rest(limit):
    """Two boxes of two rows (sorted apart by their third coordinate, which the first layer
    weighs most): box P, whose loose bound may be on, and box Q, |U·x + b| = 130 on both rows
    and bounded by 131. Without a limit and with limits 50 and 120 (below Q's bound) Q is
    evaluated and the peak is exactly 130; with 200 Q's bound stands for it (in [130, 200]).
    A pass that left Q out would record P's 100."""
    X = np.array([[-60.0, 60.0, 0.0], [60.0, -60.0, 0.0], [-15.0, -15.0, 1.0],
                  [-14.0, -16.0, 1.0]])
    quiet = FF(1.0, np.array([[0.0, 0.0, 1000.0]]), np.array([-1e9]), np.zeros((3, 1)))
    read = FF(1.0, np.array([[1.0, 1.0, 0.0]]), np.array([-100.0]), np.array([[1.0], [0], [0]]))
    model = Transformer(d=3, attention="hardmax", exact=False,
                        blocks=[Block(quiet), Block(read)])
    peaks: dict = {}
    with mock.patch.object(boxes, "GROUP", 2):
        ef.evaluate.dense_forward(model, [X], peaks=peaks, peak_limit=limit)
    top = peaks[1, "FF pre-activation"]
    assert top == 130.0 if limit != 200.0 else 130.0 <= top <= 200.0


def test_an_overflowing_write_reaches_every_column_as_in_the_plain_pass():
    """A residual FF whose write overflows to inf: the next layer's pre-activations are nan
    on that row in the plain pass (inf·0 reaches every unit), though no unit reads the
    column, and so they are here; the boxes are left for every row and column."""
    X = np.array([[k, 0.0] for k in range(-20, 3)])
    model = Transformer(d=2, attention="hardmax", exact=False, blocks=[
        Block(FF(1.0, np.array([[1.0, 0.0]]), np.array([-100.0]), np.array([[1.0], [0.0]]))),
        Block(FF(1.0, np.array([[1.0, 0.0]]), np.array([0.0]), np.array([[0.0], [2.0 ** 1023]]))),
        Block(FF(1.0, np.array([[1.0, 0.0]]), np.array([-10.0]), np.array([[1.0], [0.0]])))])
    peaks: dict = {}
    got = ef.evaluate.dense_forward(model, [X], peaks=peaks)
    want_peaks: dict = {}
    want = plain_pass(model, X, want_peaks)
    assert np.isnan(want[-1]).all() and np.array_equal(got[0], want, equal_nan=True)
    key = (2, "FF pre-activation")
    assert math.isnan(peaks[key]) and math.isnan(want_peaks[key])


@pytest.mark.parametrize("attends", [False, True])
def test_an_infinite_weight_reaches_the_rows_no_unit_fires_on(attends):
    """relu(z) = 0 times an infinite W is nan in the plain pass on every row, so a layer
    with such a W cannot skip the rows where no unit fires (nor write W's columns alone),
    in a stretch without attention or in a block that attends."""
    X = np.array([[k, 0.0] for k in range(-20, 3)])
    e = np.array([1.0, 0.0])
    sa = SA(1.0, heads=[Head(ScoreMatrix(0.0, e, e), ValueMatrix(0.0, e, e))]) if attends else None
    model = Transformer(d=2, attention="hardmax", exact=False, blocks=[
        Block(FF(1.0, np.array([[1.0, 0.0]]), np.array([-100.0]), np.array([[1.0], [0.0]]))),
        Block(FF(1.0, np.array([[1.0, 0.0]]), np.array([-1.0]), np.array([[0.0], [np.inf]])),
              sa)])
    xs = [x[None] for x in X]  # one token a sequence: a head mixes no rows
    got = ef.evaluate.dense_forward(model, xs)
    want = np.concatenate([plain_pass(model, x, {}) for x in xs])
    assert np.isnan(want[:-1, 1]).all()
    assert np.array_equal(np.concatenate(got), want, equal_nan=True)


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
    # rows run at once: one sequence, a few, or the whole batch
    with mock.patch.object(dense, "ROWS", data.draw(st.sampled_from([1, 1, 2, 5, 1 << 14]))):
        got = ef.evaluate.dense_forward(model, xs, peaks=peaks)
    want_peaks: dict = {}
    want = [plain_pass(model, x, want_peaks) for x in xs]
    if not order_free(model, xs, want, want_peaks):
        return
    size = max(np.abs(v[np.isfinite(v)]).max(initial=0.0) for v in [*xs, *want])
    tol = 1e-10 * size  # softmax weights and 1/|argmax| round; a sum may cancel to 0 or not
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=tol)
    assert peaks.keys() == want_peaks.keys()
    for key, top in want_peaks.items():
        np.testing.assert_allclose(peaks[key], top, rtol=1e-12, atol=tol, err_msg=str(key))


def order_free(model, xs, want, want_peaks) -> bool:
    """Whether the plain pass gives the same non-finite entries and peaks with the
    coordinates reversed, and with every product rounded before it is added (no fused
    multiply-add). Where a partial sum overflows, inf or nan depends on the order of the
    sums and on whether BLAS fuses them (fma(x, y, inf) = inf where x·y + inf may be nan),
    which BLAS picks by shape: no pass is then wrong to differ from another, and a
    comparison would test BLAS, not the pass (only the scale 2^600 gets here)."""
    for variant in ({"order": np.arange(model.d)[::-1]}, {"matmul": unfused}):
        peaks: dict = {}
        other = [plain_pass(model, x, peaks, **variant) for x in xs]
        if not (all(np.array_equal(np.isfinite(a), np.isfinite(b))
                    for a, b in zip(want, other, strict=True))
                and all(math.isnan(peaks[k]) == math.isnan(v) for k, v in want_peaks.items())):
            return False
    return True


def unfused(P: np.ndarray, Q: np.ndarray) -> np.ndarray:
    """P @ Q with each product rounded to float64 before the (pairwise) sum."""
    return (P[:, :, None] * Q[None, :, :]).sum(axis=1)


def plain_pass(model, X: np.ndarray, peaks: dict, order=None, matmul=np.matmul
               ) -> np.ndarray:
    """One sequence through every block as written, recording each part's largest |value|
    into ``peaks`` (nan once seen stays, as dense_forward records it); with the coordinates
    in ``order`` (the same function; the sums go in another order) and the products by
    ``matmul``."""
    p = np.arange(X.shape[1]) if order is None else np.asarray(order)
    X = X[:, p]
    def note(k, part, values):
        top = float(np.abs(values).max())
        old = peaks.get((k, part), 0.0)
        peaks[k, part] = math.nan if math.isnan(top) or math.isnan(old) else max(old, top)

    n = len(X)
    seen = np.tril(np.ones((n, n), dtype=bool)) if model.causal else np.ones((n, n), bool)
    with np.errstate(all="ignore"):
        for k, blk in enumerate(model.blocks):
            if blk.ff is not None:
                Z = matmul(X, blk.ff.U[:, p].T) + blk.ff.b
                note(k, "FF pre-activation", Z)
                X = blk.ff.eta * X + matmul(np.maximum(Z, 0.0), blk.ff.W[p].T)
                note(k, "FF output", X)
            if blk.sa is not None and not blk.sa.is_identity():
                out = blk.sa.rho * X
                for head in blk.sa.heads:
                    A, V = head.A.dense()[np.ix_(p, p)], head.V.dense()[np.ix_(p, p)]
                    S = matmul(matmul(X, A.T), X.T)
                    note(k, "scores", S)
                    S = np.where(seen, S, -np.inf)
                    if model.attention == "hardmax":
                        M = (S == S.max(axis=1, keepdims=True)).astype(float)
                    else:
                        M = np.exp(S - S.max(axis=1, keepdims=True))
                    out = out + matmul(matmul(M / M.sum(axis=1, keepdims=True), X), V.T)
                X = out
            note(k, "state", X)
    return X[:, np.argsort(p)]
