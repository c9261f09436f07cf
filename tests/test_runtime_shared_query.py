"""A head whose every query scores alike (no gram term, every row equal on the coordinates c
reads, as in a keyed separation round) is enclosed from its first row alone
(``runtime_attention.shared_query``): the boxes must be those of every query enclosed on its
own (to the float64 rounding of matrix products of another shape), and where a row differs
there, or under TF32 or a causal mask, every query is enclosed
(docs/numerics.md#proofs-for-reduced-precision-runtimes)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exactformer.verification import runtime_attention
from exactformer.verification.formats import get_format
from exactformer.verification.runtime_boxes import Weights
from exactformer.verification.runtime_scores import Context


def _head(D: int, rng, alpha: float = 0.0) -> dict:
    c = np.zeros(D)
    c[0] = 1.0  # reads the 'one' coordinate alone
    return {"alpha": alpha, "a": rng.choice([0.0, 1.0, -2.0, 0.5], D), "c": c,
            "beta": float(rng.choice([0.0, 1.0])), "p": rng.choice([0.0, 1.0], D),
            "q": rng.choice([0.0, 1.0], D)}


def _both(Xm, Xr, head, ctx, monkeypatch):
    w = Weights(head | {"V": head["beta"] * np.eye(len(head["p"])) +
                        np.outer(head["p"], head["q"])}, ctx.fmt)
    fast = runtime_attention.head_box(Xm, Xr, w, ctx)
    shared = runtime_attention.shared_query(Xm, Xr, w, ctx)
    with monkeypatch.context() as m:
        m.setattr(runtime_attention, "shared_query", lambda *a: None)
        full = runtime_attention.head_box(Xm, Xr, w, ctx)
    return shared, fast, full


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2 ** 32 - 1), st.sampled_from(["hardmax", "softmax"]),
       st.sampled_from(["float32", "bfloat16", "float16", "tf32"]), st.booleans())
def test_the_first_query_stands_for_every_query(seed, attention, runtime, differ):
    rng = np.random.default_rng(seed)
    B, n, D = int(rng.integers(1, 4)), int(rng.integers(2, 7)), 4
    Xm = rng.choice([0.0, 1.0, -3.0, 0.25, 1 / 3], (B, n, D))
    Xr = np.where(rng.random((B, n, D)) < 0.3, rng.choice([1e-9, 0.01], (B, n, D)), 0.0)
    Xm[..., 0], Xr[..., 0] = 1.0, 0.0
    if differ:  # one row off on the coordinate c reads: no shared query
        Xm[-1, -1, 0] = 1.0 + 2.0 ** -20
    model = SimpleNamespace(attention=attention, causal=False, tau=None, blocks=[])
    ctx = Context(model, get_format(runtime), 2.0)
    with np.errstate(all="ignore"):
        shared, fast, full = _both(Xm, Xr, _head(D, rng), ctx, pytest.MonkeyPatch())
    assert (shared is None) == (differ or runtime == "tf32")
    for a, b in zip(fast, full, strict=True):  # float64 matrix products of other shapes may
        assert a.shape == b.shape  # round otherwise (BLAS kernels): each path's own bounds
        if a.dtype == bool:  # cover its own midpoints; the two agree to a few ulps
            assert np.array_equal(a, b)
        else:
            assert np.allclose(a, b, rtol=1e-13, atol=1e-16, equal_nan=True)


def test_a_gram_term_or_a_causal_mask_takes_every_query():
    rng = np.random.default_rng(0)
    Xm = np.ones((1, 3, 4))
    model = SimpleNamespace(attention="hardmax", causal=False, tau=None, blocks=[])
    fmt = get_format("float32")
    gram = _head(4, rng, alpha=1.0)
    w = Weights(gram | {"V": np.eye(4)}, fmt)
    assert runtime_attention.shared_query(Xm, np.zeros_like(Xm), w, Context(model, fmt, 2.0)) \
        is None
    causal = SimpleNamespace(attention="hardmax", causal=True, tau=None, blocks=[])
    w = Weights(_head(4, rng) | {"V": np.eye(4)}, fmt)
    assert runtime_attention.shared_query(Xm, np.zeros_like(Xm), w, Context(causal, fmt, 2.0)) \
        is None
    assert runtime_attention.shared_query(Xm, np.zeros_like(Xm), w, Context(model, fmt, 2.0)) \
        is not None
