"""A softmax row whose weight sits almost all on one key (a keyed collapse: the others within
e^-30 of 0) rounds, in any order, by a few units of its result, not by n of them: adding a
partial sum of the light keys to the heavy key's rounds by at most that partial sum
(``runtime_attention.average_rounding`` and the softmax's sum, docs/numerics.md). Checked by
float32 evaluations of the test's own in several orders, with and without a fused sum, and
against the bound that counts every key's roundings."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from test_grid import ORDERS, ordered_sum

from exactformer.model import SA, Block, ScoreMatrix, Transformer, ValueMatrix
from exactformer.verification.formats import get_format, theta
from exactformer.verification.runtime_attention import _normaliser, average_rounding
from exactformer.verification.runtime_proof import enclose_runtime

F32 = np.float32


def _model(D: int, beta_c: float) -> Transformer:
    """One softmax head, scores (x_0)(β_c·x_1) (x_0 = 1 on every token, x_1 a priority),
    ρ = 0 and V = I: each row becomes the softmax average of the keys."""
    a, c = np.zeros(D), np.zeros(D)
    a[1], c[0] = beta_c, 1.0
    sa = SA(0.0, ScoreMatrix(0.0, a, c), ValueMatrix(1.0, np.zeros(D), np.zeros(D)))
    return Transformer(D, "softmax", [Block(None, sa)], exact=False)


def _sum(terms, order: str, rng) -> F32:
    """A float32 sum of ``terms`` in one of test_grid's orders, or ("fused") the exact sum
    rounded once."""
    if order == "fused":
        return F32(float(sum(Fraction(float(t)) for t in terms)))
    return ordered_sum([F32(t) for t in terms], F32, order, rng)


def _evaluate(X: np.ndarray, beta_c: float, order: str, rng) -> np.ndarray:
    """The layer in float32: scores, exp(s − max), their sum, weights, the average."""
    S = (X[:, 0, None].astype(F32) * (F32(beta_c) * X[None, :, 1].astype(F32))).astype(F32)
    e = np.exp((S - S.max(axis=1, keepdims=True)).astype(F32)).astype(F32)
    Z = np.array([_sum(row, order, rng) for row in e], dtype=F32)
    P = (e / Z[:, None]).astype(F32)
    return np.array([[float(_sum(P[i] * X[:, j].astype(F32), order, rng))
                      for j in range(X.shape[1])] for i in range(len(X))])


@settings(max_examples=25, deadline=None)
@given(st.integers(8, 64), st.sampled_from([1.0, 16.0, 64.0]), st.integers(0, 2 ** 32 - 1))
def test_every_order_lands_in_the_box(n, beta_c, seed):
    rng = np.random.default_rng(seed)
    D = 5
    X = np.zeros((n, D))
    X[:, 0] = 1.0
    X[:, 1] = rng.choice([0.0, 0.25, 1.0], n)
    X[0, 1] = 1.0 + 0.5 * (beta_c > 1)
    X[:, 2:] = F32(rng.choice([2176.0, -1152.0, 1.0], (n, D - 2)) *
                   rng.uniform(0.5, 2.0, (n, D - 2)))
    (m, r), = enclose_runtime(_model(D, beta_c), [X], get_format("float32"))
    for order in (*ORDERS, "fused"):
        got = _evaluate(X, beta_c, order, rng)
        assert (np.abs(got - m) <= r).all(), (order, np.abs(got - m).max(), r.max())


def test_a_collapse_row_rounds_by_a_few_units_not_n():
    """64 keys, the first ahead by 64 in score (the others weigh e^-64 each), values near
    2176: the box of every row is within 12 float32 roundings of its size, where n + 12
    would be 76 (and every order's value lands in it)."""
    n, D, beta_c = 64, 4, 64.0
    rng = np.random.default_rng(7)
    X = np.zeros((n, D))
    X[:, 0], X[0, 1] = 1.0, 1.0
    X[:, 2:] = F32(2176.0 + rng.integers(-8, 8, (n, D - 2)))
    (m, r), = enclose_runtime(_model(D, beta_c), [X], get_format("float32"))
    size = np.abs(X[0, 2:]).max()
    fmt = get_format("float32")
    assert r[:, 2:].max() < 4 * theta(12, 0, fmt) * size < theta(n + 12, 0, fmt) * size
    for order in (*ORDERS, "fused"):
        got = _evaluate(X, beta_c, order, rng)
        assert (np.abs(got - m) <= r).all()


@settings(max_examples=200, deadline=None)
@given(st.integers(2, 40), st.sampled_from([1e-13, 1e-6, 1e-2, 0.5]), st.integers(0, 2 ** 32 - 1))
def test_the_heavy_key_bound_holds_a_weighted_sum_in_any_order(n, light, seed):
    """``average_rounding`` on a plain weighted sum Σ_l π_l·x_l (each product rounded, then
    summed: at most n roundings a term, two off the sum): every float32 order's distance from
    the exact sum is within it, for light keys from 10⁻¹³ to half the weight."""
    rng = np.random.default_rng(seed)
    w = np.concatenate([[1.0], rng.uniform(0, 1, n - 1) * light])
    P = (w / w.sum()).astype(F32)
    x = F32(rng.choice([2176.0, -1152.0, 3.0], n) * rng.uniform(0.5, 2.0, n))
    terms = [F32(p * v) for p, v in zip(P, x, strict=True)]
    exact = sum(Fraction(float(p)) * Fraction(float(v)) for p, v in zip(P, x, strict=True))
    size = np.abs(P.astype(float) * x.astype(float))
    M = np.array([size.sum() * (1 + 2.0 ** -40)])
    rest = np.array([size[1:].sum() * (1 + 2.0 ** -40)])
    bound = average_rounding(M, rest, np.array([n + 1]), n, get_format("float32"))[0]
    for order in (*ORDERS, "fused"):
        got = _sum(terms, order, rng) if order != "fused" else F32(float(exact))
        assert abs(Fraction(float(got)) - exact) <= Fraction(float(bound)), order


@settings(max_examples=200, deadline=None)
@given(st.integers(2, 40), st.sampled_from([1e-13, 1e-6, 1e-2, 1.0]), st.integers(0, 2 ** 32 - 1))
def test_the_softmax_sum_holds_every_order(n, light, seed):
    """``runtime_attention._normaliser``: every float32 order's Σ e_l of float32 values lies
    in its bounds, one e_l = exp(0) = 1 and the rest from 10⁻¹³ to 1."""
    rng = np.random.default_rng(seed)
    e = F32(np.concatenate([[1.0], rng.uniform(0, 1, n - 1) * light]))
    lo, hi, err = _normaliser(e.astype(float)[None, None], e.astype(float)[None, None],
                              get_format("float32"))
    for order in (*ORDERS, "fused"):
        z = _sum(e, order, rng)
        assert lo[0, 0, 0] <= float(z) <= hi[0, 0, 0], order
        assert abs(Fraction(float(z)) - sum(Fraction(float(v)) for v in e)) <= \
            Fraction(float(err[0, 0, 0])), order


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 40), st.sampled_from([0.0, 1e-3, 1.0, 30.0, 200.0]),
       st.sampled_from([0.0, 1.0, 2.0, 4.0]), st.integers(0, 2 ** 32 - 1))
def test_the_softmax_weights_hold_every_order_and_exp(n, spread, exp_ulps, seed):
    """``runtime_attention.softmax_box``: every weight fl(e_l / z) of a float32 softmax of
    the test's own (exp(s − max) off by up to ``exp_ulps`` ulps either way, one e_l per key
    used in both the sum and the division, the sum in every order, random ones eight times
    more) lies in its box: scores with a clear heaviest key (spread 30, 200: the keyed
    collapse), keys at a tie (0) and between; and the heaviest key's weight of a clear row
    is within 8 float32 units of 1, which bounds taking numerator and denominator apart
    would not give at 2 ulps."""
    from types import SimpleNamespace

    from exactformer.verification.runtime_attention import softmax_box

    rng = np.random.default_rng(seed)
    fmt = get_format("float32")
    s = F32(rng.uniform(-1, 0, n) * spread)
    s[0] = F32(s.max() + spread)  # the heaviest key
    ctx = SimpleNamespace(fmt=fmt, exp_err=exp_ulps * 2.0 ** -23 * (1 + 2.0 ** -40))
    mid, rad = softmax_box(s.astype(float)[None, None], np.zeros((1, 1, n)),
                           np.ones((1, 1, n), dtype=bool), ctx)
    lo, hi = mid[0, 0] - rad[0, 0], mid[0, 0] + rad[0, 0]
    g = (s - s.max()).astype(F32)
    for order in ORDERS + ("perm",) * 8:
        exact = np.exp(g.astype(float))
        ulp = np.spacing(exact.astype(F32)).astype(float)
        e = F32(np.maximum(exact + rng.uniform(-exp_ulps, exp_ulps, n) * ulp, 0.0))
        z = _sum(e, order, rng)
        p = (e / z).astype(F32).astype(float)
        assert ((lo <= p) & (p <= hi)).all(), order
    if spread >= 30:
        assert 1 - lo[0] <= 8 * 2.0 ** -24
