"""The attention's term quanta in the runtime proofs (runtime_attention.min_products, which
skips the keys where the answer is known at once) against their definition, a min over every
key of lowbit(weight) × lowbit(value) computed whole; and the copy of one key per row
(runtime_attention.copied_keys, a hardmax whose every row has one candidate) against the
general average of one-hot weights (docs/numerics.md#proofs-for-reduced-precision-runtimes)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from exactformer.verification import runtime_attention, runtime_scores
from exactformer.verification.formats import get_format

VALUES = [0.0, 0.25, 0.5, 1.0, 3.0, 1 / 3, 1e-30, 2.0 ** -140, 2.0 ** 100]
RADII = [0.0, 0.0, 0.0, 1e-9, 0.1, np.inf]


def whole_min(lbP, lbX):
    with np.errstate(over="ignore", invalid="ignore"):
        prod = lbP[:, :, :, None] * lbX[:, None, :, :]
        return np.where(np.isnan(prod), np.inf, prod).min(axis=2)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 3), st.integers(1, 5), st.integers(1, 4),
       st.sampled_from(["float32", "tf32", "bfloat16", "float16"]), st.integers(0, 2 ** 32 - 1))
def test_min_products_equal_the_min_over_every_key(B, n, D, runtime, seed):
    rng = np.random.default_rng(seed)
    Pm = rng.choice(VALUES, size=(B, n, n))
    Pr = rng.choice(RADII[:-1], size=(B, n, n))
    Xm = rng.choice(VALUES, size=(B, n, D)) * rng.choice([1, -1], size=(B, n, D))
    Xr = rng.choice(RADII, size=(B, n, D))
    lbP, lbX = runtime_attention.term_bits(Pm, Pr, Xm, Xr, get_format(runtime))
    assert np.array_equal(runtime_attention.min_products(lbP, lbX), whole_min(lbP, lbX))


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 3), st.integers(1, 5), st.integers(1, 4),
       st.sampled_from(["float32", "tf32", "bfloat16", "float16"]), st.integers(0, 2 ** 32 - 1))
def test_copied_keys_are_the_average_of_one_hot_weights(B, n, D, runtime, seed):
    rng = np.random.default_rng(seed)
    Xm = rng.choice(VALUES, size=(B, n, D)) * rng.choice([1, -1], size=(B, n, D))
    Xr = rng.choice(RADII[:-1], size=(B, n, D)) * (rng.random((B, 1, 1)) < 0.5)
    key = rng.integers(0, n, size=(B, n))
    Pm = (np.arange(n) == key[..., None]).astype(float)
    fmt = get_format(runtime)
    got = runtime_attention.copied_keys(key, Xm, Xr, fmt)
    want = runtime_attention.mix(Pm, np.zeros_like(Pm), Xm, Xr, fmt)
    for g, w in zip(got, want, strict=True):
        assert np.array_equal(g, w)


def test_a_key_is_not_copied_past_an_infinite_one():
    """Both queries pick key 0 (one candidate each), but key 1 is infinite: weight 0 times
    inf is nan in every runtime, so the average is unknown, not a copy of key 0."""
    from types import SimpleNamespace

    model = SimpleNamespace(attention="hardmax", causal=False, tau=None, blocks=[])
    ctx = runtime_scores.Context(model, get_format("float32"), 2.0)
    sm = np.array([[[1.0, 0.0], [1.0, 0.0]]])
    Xm = np.array([[[1.0], [np.inf]]])
    with np.errstate(invalid="ignore"):
        Ym, Yr, *_ = runtime_attention.hardmax_box(sm, np.zeros_like(sm), np.ones((2, 2), bool),
                                                   Xm, np.zeros_like(Xm), ctx)
    assert not (np.isfinite(Yr) & np.isfinite(Ym)).any()
