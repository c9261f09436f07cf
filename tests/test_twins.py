"""Equal rows evaluated once (evaluate/twins.py) in the dense FF of an enclosure pass.

The grouping is checked bitwise (nan, −0.0 and forced hash collisions included), and the
dense FF with the grouping against the same FF row by row (the same floats and radii, up to
the order in which a matrix product sums a bound) and against an exact evaluation of points
in every row's box, written here in Fractions.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exactformer.evaluate import enclosure, twins

POOL = [0.0, -0.0, 1.0, -1.0, 0.5, 3.0, 2.0 ** -1074, np.inf, -np.inf, np.nan, 1e300]


@st.composite
def repeated_rows(draw, pool=POOL):
    """n rows drawn from k distinct-ish rows of ``pool`` values (k small: many repeats)."""
    d = draw(st.integers(1, 4))
    k = draw(st.integers(1, 6))
    base = np.array(draw(st.lists(st.lists(st.sampled_from(pool), min_size=d, max_size=d),
                                  min_size=k, max_size=k)))
    pick = draw(st.lists(st.integers(0, k - 1), min_size=1, max_size=40))
    return base[pick]


def _bits(A):
    return np.ascontiguousarray(A).view(np.uint64)


def _check(A):
    first, inv = twins.distinct(A)
    assert (_bits(A[first[inv]]) == _bits(A)).all()
    assert len({r.tobytes() for r in _bits(A[first])}) == len(first)  # no group twice
    assert len(first) == len({r.tobytes() for r in _bits(A)})  # equal bits: one group


@settings(max_examples=200, deadline=None)
@given(repeated_rows(), st.sampled_from([1, 3, 7, twins.HASH_ROWS]))
def test_groups_are_bitwise_equal_rows(A, chunk):
    """Whatever the blocks of rows hashed at a time (a row's hash must not depend on them)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(twins, "HASH_ROWS", chunk)
        _check(A)


@settings(max_examples=100, deadline=None)
@given(repeated_rows())
def test_hash_collisions_are_split(A):
    """With a hash that reads the last column only, rows that differ elsewhere collide; each
    row must still come back as itself (the comparison with its group's first splits them)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(twins, "_MIX", np.uint64(0))
        first, inv = twins.distinct(A)
    assert (_bits(A[first[inv]]) == _bits(A)).all()


def exact_ff(x, U, b, W):
    """x + W relu(U x + b) in Fractions."""
    z = [max(Fraction(0), sum((Fraction(u) * v for u, v in zip(row, x, strict=True)),
                              Fraction(b_k))) for row, b_k in zip(U.tolist(), b.tolist(),
                                                                  strict=True)]
    return [v + sum((Fraction(w) * a for w, a in zip(row, z, strict=True)), Fraction(0))
            for v, row in zip(x, W.tolist(), strict=True)]


SMALL = [0.0, 1.0, -1.0, 0.5, 0.75, 3.0, -2.5, 1024.0]


@st.composite
def layers_and_rows(draw):
    """A residual layer of 1-4 units on 2 of d = 4 coordinates (so that the dense FF works
    on those columns alone) and rows with many repeats, with radii of a few values."""
    h = draw(st.integers(1, 4))
    U = np.zeros((h, 4))
    W = np.zeros((4, h))
    U[:, :2] = draw(st.lists(st.lists(st.sampled_from(SMALL), min_size=2, max_size=2),
                             min_size=h, max_size=h))
    W[:2, :] = np.array(draw(st.lists(st.lists(st.sampled_from(SMALL), min_size=h, max_size=h),
                                      min_size=2, max_size=2)))
    b = np.array(draw(st.lists(st.sampled_from([-1.0, -0.5, 0.0, 0.25]), min_size=h,
                               max_size=h)))
    k = draw(st.integers(1, 5))
    base_x = draw(st.lists(st.lists(st.sampled_from(SMALL), min_size=4, max_size=4),
                           min_size=k, max_size=k))
    base_r = draw(st.lists(st.lists(st.sampled_from([0.0, 0.0, 1e-9, 0.25]), min_size=4,
                                    max_size=4), min_size=k, max_size=k))
    pick = draw(st.lists(st.integers(0, k - 1), min_size=1, max_size=30))
    X, r = np.array(base_x)[pick], np.array(base_r)[pick]
    return U, b, W, X, r


def _dense(U, b, W, X, r, grouped: bool):
    X, r = X.copy(), r.copy()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(enclosure, "TWIN_ROWS", 0 if grouped else 10 ** 9)
        enclosure.ff_dense_into(X, r, 1.0, U, b, W)
    return X, r


@settings(max_examples=150, deadline=None)
@given(layers_and_rows(), st.randoms(use_true_random=False))
def test_grouped_rows_are_the_rows_alone_and_enclose_the_exact_layer(case, rnd):
    U, b, W, X, r = case
    gX, gr = _dense(U, b, W, X, r, True)
    aX, ar = _dense(U, b, W, X, r, False)
    # the same computation on fewer rows: BLAS may sum a bound in another order
    assert np.allclose(gX, aX, rtol=1e-13, atol=0) and np.allclose(gr, ar, rtol=1e-12, atol=0)
    for x, rad, m, mr in zip(X, r, gX, gr, strict=True):
        point = [Fraction(v) + Fraction(rv) * Fraction(rnd.randint(-4, 4), 4)
                 for v, rv in zip(x.tolist(), rad.tolist(), strict=True)]
        for e, mv, rv in zip(exact_ff(point, U, b, W), m.tolist(), mr.tolist(), strict=True):
            assert abs(e - Fraction(mv)) <= Fraction(rv)


@st.composite
def reading_layers(draw):
    """A residual layer whose units read coordinates 0-2 and write 0-1 of d = 4: coordinate 2
    is read only, 3 untouched; rows and radii of a few values."""
    h = draw(st.integers(1, 4))
    U, W = np.zeros((h, 4)), np.zeros((4, h))
    U[:, :3] = draw(st.lists(st.lists(st.sampled_from(SMALL), min_size=3, max_size=3),
                             min_size=h, max_size=h))
    W[:2, :] = draw(st.lists(st.lists(st.sampled_from(SMALL), min_size=h, max_size=h),
                             min_size=2, max_size=2))
    b = np.array(draw(st.lists(st.sampled_from([-1.0, -0.5, 0.0, 0.25]), min_size=h,
                               max_size=h)))
    n = draw(st.integers(1, 6))
    X = np.array(draw(st.lists(st.lists(st.sampled_from(SMALL + [1 / 3]), min_size=4,
                                        max_size=4), min_size=n, max_size=n)))
    r = np.array(draw(st.lists(st.lists(st.sampled_from([0.0, 1e-9, 0.25]), min_size=4,
                                        max_size=4), min_size=n, max_size=n)))
    return U, b, W, X, r


@settings(max_examples=150, deadline=None)
@given(reading_layers(), st.randoms(use_true_random=False))
def test_written_coordinates_alone_match_the_whole_layer(case, rnd):
    """ff_dense_into evaluates the coordinates a unit writes only: the same floats and radii
    there as the layer evaluated on every coordinate it touches, the others as they were,
    and the exact layer inside the boxes."""
    U, b, W, X, r = case
    mX, mr = X.copy(), r.copy()
    enclosure.ff_dense_into(mX, mr, 1.0, U, b, W)
    cols = np.flatnonzero(U.any(axis=0) | W.any(axis=1))  # as ff_dense_into looks
    wX, wr = enclosure._ff_dense(X[:, cols], r[:, cols], 1.0, U[:, cols], b, W[cols])
    written = W[cols].any(axis=1)
    assert np.allclose(mX[:, cols[written]], wX[:, written], rtol=1e-13, atol=0)
    assert np.allclose(mr[:, cols[written]], wr[:, written], rtol=1e-12, atol=0)
    kept = ~W.any(axis=1)
    assert (mX[:, kept] == X[:, kept]).all() and (mr[:, kept] == r[:, kept]).all()
    for x, rad, m, mrad in zip(X, r, mX, mr, strict=True):
        point = [Fraction(v) + Fraction(rv) * Fraction(rnd.randint(-4, 4), 4)
                 for v, rv in zip(x.tolist(), rad.tolist(), strict=True)]
        for e, mv, rv in zip(exact_ff(point, U, b, W), m.tolist(), mrad.tolist(), strict=True):
            assert abs(e - Fraction(mv)) <= Fraction(rv)
