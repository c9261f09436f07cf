"""A key layer's move (evaluate/keys.py) must be charged every error it makes in an enclosure.

Two moves that were charged nothing although their float64 result is not exact, each turned
into a wrong OK of ``verify`` by a later layer that amplifies the uncharged error (the exact
values are checked here by a dense Fraction pass written in this file):

* the exact activation κ·g·w + b is positive but below 2^-1075 while the float z is 0: its
  exact error rounds to the float 0 and was taken as "z is exact";
* z = 2^-1022 exactly and W = 1 − 2^-53: the product 2^-1022 − 2^-1075 rounds (a tie, to
  even) to 2^-1022, so the float test "min |W|·|z| ≥ 2^-1022" passed although the exact
  product underflows and was rounded.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

import exactformer as ef
from exactformer.evaluate import enclose, key_layers
from exactformer.model import FF, Block, Transformer

TINY = 2.0 ** -1022


def exact_out(model, x) -> list[Fraction]:
    """The dense exact pass of an FF-only set model on one token."""
    X = [Fraction(v) for v in x]
    for blk in model.blocks:
        ff = blk.ff
        z = [max(sum(Fraction(u) * v for u, v in zip(ur, X, strict=True)) + Fraction(bb),
                 Fraction(0)) for ur, bb in zip(ff.U, ff.b, strict=True)]
        X = [Fraction(ff.eta) * v + sum(Fraction(ff.W[i, k]) * z[k] for k in range(len(z)))
             for i, v in enumerate(X)]
    return X


def column(d, i, v):
    w = np.zeros((d, 1))
    w[i, 0] = v
    return w


def row(d, i, v):
    u = np.zeros((1, d))
    u[0, i] = v
    return u


def enclosed(model, x) -> bool:
    (mid,), (rad,) = enclose(model, [np.array([x])], None)
    return all(abs(Fraction(float(m)) - e) <= Fraction(float(r))
               for m, r, e in zip(mid[0], rad[0], exact_out(model, x), strict=True))


def test_a_z_error_below_the_smallest_subnormal_is_still_charged():
    kappa, g = 1 + 2.0 ** -52, 2.0 ** -1000 * (1 + 2.0 ** -52)
    b = -(2.0 ** -1000 * (1 + 2.0 ** -51))
    assert kappa * g + b == 0
    assert Fraction(kappa) * Fraction(g) + Fraction(b) == Fraction(2) ** -1104
    d = 4
    key = FF(1.0, row(d, 0, kappa), np.array([b]), column(d, 1, 2.0 ** 1000))
    amp = FF(1.0, row(d, 1, 2.0 ** 100), np.array([0.0]), column(d, 2, 1.0))
    model = Transformer(d, "hardmax", [Block(ff=key), Block(ff=amp)], exact=False)
    assert key_layers([key, amp])[0] is not None
    x = [g, 0.0, 0.0, 1.0]
    out = exact_out(model, x)
    assert out[2] == Fraction(1, 16)  # the float64 pass gives 0 there
    assert enclosed(model, x)
    report = ef.verify(model, ef.Dataset.from_arrays([[x]], [[x]]))
    assert not report.ok


def test_a_product_that_rounds_up_to_the_smallest_normal_is_charged():
    d = 5
    assert (1 - 2.0 ** -53) * TINY == TINY  # exact: 2^-1022 − 2^-1075
    key = FF(1.0, row(d, 0, 2.0 ** -1000), np.array([-TINY]), column(d, 1, 1 - 2.0 ** -53))
    amp1 = FF(1.0, row(d, 1, -2.0 ** 1000), np.array([0.0]), column(d, 2, 2.0 ** 23))
    amp2 = FF(1.0, row(d, 2, 2.0 ** 577), np.array([0.0]), column(d, 3, 2.0 ** 23))
    model = Transformer(d, "hardmax", [Block(ff=key), Block(ff=amp1), Block(ff=amp2)],
                        exact=False)
    assert key_layers([key, amp1, amp2])[0] is not None
    x = [2.0 ** -21, -TINY, 0.0, 0.0, 2.0 ** 500]  # (the last coordinate sets the data scale)
    out = exact_out(model, x)
    assert out[3] == Fraction(2) ** 548  # the float64 pass gives 0 there
    assert enclosed(model, x)
    (mid,), _ = enclose(model, [np.array([x])], None)
    report = ef.verify(model, ef.Dataset.from_arrays([[x]], [[mid[0].tolist()]]))
    assert not report.ok
