"""The grid certificate (evaluate/grid.py): a dot product it calls exact is exact in every
summation order, checked against exact rational sums and several float evaluations written
here, in float64 and float32."""

import math
from fractions import Fraction

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from exactformer.evaluate.grid import FLOAT64, exact_dots, lowbit

FLOAT32 = (24, 2.0 ** -149, float(np.finfo(np.float32).max))


def values(draw, n: int, dtype) -> np.ndarray:
    """Floats of every kind the construction meets: dyadic, random, powers of two, zeros,
    tiny and huge ones."""
    kind = draw(st.sampled_from(["dyadic", "random", "mixed"]))
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    if kind == "dyadic":
        out = rng.integers(-2 ** 12, 2 ** 12, n) * 2.0 ** rng.integers(-30, 10, n)
    elif kind == "random":
        out = rng.standard_normal(n) * 2.0 ** rng.integers(-5, 5, n)
    else:
        pool = [0.0, 1.0, -1.0, 0.5, 3.0, 1 / 3, 2.0 ** -140, 2.0 ** -1070, 2.0 ** 100,
                float(np.finfo(dtype).tiny), 1 + 2.0 ** -20, 1024.0, -1536.0]
        out = np.array([pool[i] for i in rng.integers(0, len(pool), n)])
    return out.astype(dtype).astype(np.float64)


ORDERS = ("seq", "rev", "pairwise", "perm")


def ordered_sum(terms: list, dtype, order: str, rng):
    """The float sum of ``terms`` (already products, exact or not) in one order: in turn,
    reversed, by halves (pairwise) or in a random permutation."""
    def seq(ts):
        s = dtype(0)
        for t in ts:
            s = dtype(s + t)
        return s

    def pairwise(ts):
        if len(ts) <= 1:
            return dtype(ts[0]) if ts else dtype(0)
        h = len(ts) // 2
        return dtype(pairwise(ts[:h]) + pairwise(ts[h:]))

    if order == "pairwise":
        return pairwise(terms)
    if order == "perm":
        return seq([terms[i] for i in rng.permutation(len(terms))])
    return seq(terms[::-1] if order == "rev" else terms)


def orders(terms: list, dtype, rng) -> list:
    """The float sum of ``terms`` in each of :data:`ORDERS`."""
    return [ordered_sum(terms, dtype, order, rng) for order in ORDERS]


@settings(max_examples=300, deadline=None)
@given(st.data(), st.integers(1, 6), st.sampled_from([np.float64, np.float32]))
def test_certified_dots_are_exact_in_every_order(data, n, dtype):
    fmt = FLOAT64 if dtype == np.float64 else FLOAT32
    x = values(data.draw, n, dtype)
    v = values(data.draw, n, dtype)
    c = values(data.draw, 1, dtype)
    ok = exact_dots(x[None, :], v[None, :], c, fmt)[0, 0]
    exact = sum((Fraction(a) * Fraction(b) for a, b in zip(x, v, strict=True)), Fraction(c[0]))
    rng = np.random.default_rng(0)
    with np.errstate(all="ignore"):
        products = [dtype(dtype(a) * dtype(b)) for a, b in zip(x, v, strict=True)]
        sums = orders(products + [dtype(c[0])], dtype, rng)
    if ok:
        assert all(np.isfinite(s) and Fraction(float(s)) == exact for s in sums)
        assert all(Fraction(float(p)) == Fraction(a) * Fraction(b)
                   for p, a, b in zip(products, x, v, strict=True))


def test_lowbit_of_known_values():
    low = lowbit(np.array([1.0, 0.75, 0.0, 3 * 2.0 ** -1074, np.inf, np.nan, -6.0]))
    assert low.tolist() == [1.0, 0.25, np.inf, 2.0 ** -1074, np.inf, np.inf, 2.0]


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                 st.integers(0, 2 ** 64 - 1).map(
                     lambda k: float(np.array([k], dtype=np.uint64).view(np.float64)[0]))))
def test_lowbit_is_the_lowest_set_bit(x):
    """lowbit against the definition in integers: |x| = M·2^e with M odd gives 2^e."""
    low = float(lowbit(np.array([x]))[0])
    if not math.isfinite(x) or x == 0:
        assert low == math.inf
        return
    num, den = Fraction(abs(x)).as_integer_ratio()  # den a power of two
    assert Fraction(low) == Fraction(num & -num, den)


def test_the_keyed_gadget_sums():
    """What the keyed construction relies on: a slot minus its ReLU cancels, a clip of
    2v − ½ and 2v − 3/2 differs by exactly 1, while 1 − v for a 53-bit v does not fit."""
    v = np.array([[87.89296579848282], [0.9375 + 2.0 ** -40]])
    assert exact_dots(np.hstack([v, v]), np.array([[1.0, -1.0]]), np.zeros(1)).all()
    assert exact_dots(v, np.array([[2.0], [2.0]]), np.array([-0.5, -1.5])).all()
    assert not exact_dots(np.array([[1 / 3]]), np.array([[-1.0]]), np.ones(1))[0, 0]


def test_a_constant_per_row_is_that_row_s_own():
    """c given per row and dot product (η·x_k in an FF's output) is judged row by row."""
    X = np.array([[1.0, 0.5], [1.0, 0.5]])
    V = np.array([[1.0, 1.0]])
    c = np.array([[2.0 ** 60], [0.25]])  # 2^60 + 1.5 needs 61 bits; 0.25 + 1.5 does not
    assert exact_dots(X, V, c).tolist() == [[False], [True]]
    assert exact_dots(X[:1], V, c[0]).tolist() == [[False]]
