"""A residual attention layer of α = β = 0 heads gives back, exactly, every sequence whose
rows hold exact zeros wherever a head's a, q or V reads (``runtime_attention.idle_sequences``,
a keyed separation round on the sequences that hold none of its tests): the proof encloses
only the others, and their rows alone are found distinct again (a row shared with a sequence
that does not change keeps its box there). Checked here by the float32 and TF32 passes of
test_runtime_proof (every summation order and layout): each lies in the boxes, and on such a
sequence each gives x itself, as the boxes say
(docs/numerics.md#proofs-for-reduced-precision-runtimes)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from test_runtime_proof import PASSES

from exactformer.model import SA, Block, Head, ScoreMatrix, Transformer, ValueMatrix
from exactformer.verification.formats import get_format
from exactformer.verification.runtime_attention import idle_sequences
from exactformer.verification.runtime_boxes import Weights
from exactformer.verification.runtime_proof import enclose_runtime


def _layer(rng, D: int, c_far: float) -> Transformer:
    """Two equal residual layers of one or two α = β = 0 heads: c reads the 'one' coordinate
    0 (and the last coordinate with weight ``c_far``), a, p and q a few of the others."""
    def sparse():
        v = np.zeros(D)
        v[1:D - 1] = np.where(rng.random(D - 2) < 0.5, rng.integers(-4, 5, D - 2) / 4, 0.0)
        return v

    heads = []
    for _ in range(int(rng.integers(1, 3))):
        c = np.zeros(D)
        c[0], c[D - 1] = 1.0, c_far
        heads.append(Head(ScoreMatrix(0.0, sparse(), c), ValueMatrix(0.0, sparse(), sparse())))
    return Transformer(D, str(rng.choice(["hardmax", "softmax"])),
                       [Block(None, SA(1.0, heads=heads)) for _ in range(2)], exact=False)


def _reads(model: Transformer, names: tuple) -> np.ndarray:
    """The coordinates a key's a or q (``names``) reads, in the test's own terms."""
    out = np.zeros(model.d, dtype=bool)
    for h in model.blocks[0].sa.heads:
        out |= (np.asarray(h.A.a) != 0) & ("a" in names)
        out |= (np.asarray(h.V.q) != 0) & ("q" in names)
    return out


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), c_far=st.sampled_from([0.0, 1.0, 2.0 ** 127]),
       far=st.sampled_from([0.0, 3.0, 2e38]))
def test_sequences_with_zeros_where_the_heads_read_come_back_exactly(seed, c_far, far):
    rng = np.random.default_rng(seed)
    D = int(rng.integers(4, 8))
    model = _layer(rng, D, c_far)
    pool = np.hstack([np.ones((4, 1)), rng.integers(-8, 9, (4, D - 2)) / 8,
                      np.where(rng.random((4, 1)) < 0.5, far, 0.0)])
    xs, quiet = [], []
    for _ in range(5):  # rows shared by sequences that change and ones that do not
        x = pool[rng.integers(0, 4, int(rng.integers(2, 5)))]
        zero = bool(rng.random() < 0.6)
        names = ("a", "q") if zero else tuple(rng.choice(["a", "q"], 1))  # one of them alone
        x[:, _reads(model, names)] = 0.0
        xs.append(x)
        # c·x stays far below overflow: the row gives back x in every pass
        quiet.append(zero and c_far * far < 1e30)
    for runtime in ("float32", "tf32"):
        boxes = enclose_runtime(model, xs, get_format(runtime))
        for p in (p for p in PASSES if p.tf32 == (runtime == "tf32")):
            for x, (m, r), same in zip(xs, boxes, quiet, strict=True):
                out = p.run(model, x)
                if same:  # (x as float32 stores it)
                    assert (out == x.astype(np.float32)).all(), (runtime, p.order, p.lens)
                with np.errstate(invalid="ignore"):
                    held = np.isinf(r) | (out == m) | (np.abs(out - m) <= r)
                assert held.all(), (runtime, p.order, p.lens, p.value, out, m, r)
        for x, (m, r), same in zip(xs, boxes, quiet, strict=True):
            if same and far != 2e38:
                assert (m == x).all() and not r.any()


def test_a_value_near_the_range_or_a_radius_where_a_head_reads_keeps_the_sequence():
    fmt = get_format("float16")
    D = 3
    w = Weights({"alpha": 0.0, "a": np.array([0.0, 1.0, 0.0]), "c": np.array([1.0, 0.0, 0.0]),
                 "beta": 0.0, "p": np.array([0.0, 0.0, 1.0]), "q": np.array([0.0, 1.0, 0.0]),
                 "V": np.outer([0.0, 0.0, 1.0], [0.0, 1.0, 0.0])}, fmt)
    X = np.zeros((4, 2, D))
    X[..., 0] = 1.0
    R = np.zeros_like(X)
    X[1, 0, 2] = 3e4  # beyond a quarter of float16's range: its average may overflow
    R[2, 1, 1] = 2.0 ** -30  # a radius where a and q read: the key may be nonzero
    X[3, 0, 0] = 7e4  # c·x overflows float16
    assert idle_sequences(X, R, [w], fmt).tolist() == [True, False, False, False]
    f32 = get_format("float32")
    assert idle_sequences(X[:1], R[:1], [w], f32).tolist() == [True]
    # V reads only zeros, but the scores (c·x_i)(a·x_l) = 10^30·10^10 overflow float32: inf − inf
    # is nan in the softmax, and nan·0 is nan
    w = Weights({"alpha": 0.0, "a": np.array([0.0, 1.0, 0.0]), "c": np.array([1.0, 0.0, 0.0]),
                 "beta": 0.0, "p": np.array([1.0, 0.0, 0.0]), "q": np.array([0.0, 0.0, 1.0]),
                 "V": np.outer([1.0, 0.0, 0.0], [0.0, 0.0, 1.0])}, f32)
    Y = np.array([[[1e30, 1e10, 0.0], [1e30, 0.0, 0.0]]])
    assert idle_sequences(Y, np.zeros_like(Y), [w], f32).tolist() == [False]
