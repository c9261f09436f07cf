"""verify fails a float64 model whose plain float64 pass gives inf or nan, causal or set.

Without attention the causal enclosure is a float64 pass from the first block, but not the
plain one: a hat's certainly active units are evaluated as their affine piece. A hat of width
2^600 read just below its right end makes the plain pass form w·(t − a0) − 2w·(t − a1) =
inf − inf while the affine piece w·(a2 − t) is finite, so the enclosure's outputs cannot stand
in for the plain float64 pass when non-finite outputs are judged. A set model's verify runs an
independent dense float64 pass for them: a row beyond a window that the fast pass skips is
evaluated there.
"""

from __future__ import annotations

import numpy as np

import exactformer as ef
from exactformer.evaluate import forward_causal
from exactformer.model import FF, Block, Transformer


def test_an_inf_of_the_plain_float64_pass_fails_a_causal_model_without_attention():
    t, w = 2.0 ** 600 - 2.0 ** 547, 2.0 ** 430
    om = np.array([1.0, -2.0, 1.0])
    ff = FF(1.0, np.array([[1.0, 0.0]] * 3), np.array([0.0, -2.0 ** 599, -2.0 ** 600]),
            np.array([0 * om, w * om]))
    model = Transformer(2, "hardmax", [Block(ff=ff)], exact=False, causal=True,
                        positions=np.zeros((4, 2)))
    with np.errstate(all="ignore"):
        plain = forward_causal(model, [np.array([[t, 0.0]])], "float")[0]
    assert not np.isfinite(plain).all()
    target = w * 2.0 ** 547  # the exact output w·(a2 − t), a float
    report = ef.verify(model, ef.CausalDataset.from_arrays([[[t, 0.0]]], [[[t, target]]]))
    assert report.nonfinite_sequences == [0]
    assert not report.ok


def test_an_inf_or_nan_only_a_dense_pass_forms_fails_a_set_model():
    """A row beyond the hat's right end: the fast pass and the enclosure leave it alone (the
    window is 0 there), a dense pass forms w·t − 2w·(t − a1) + w·(t − a2) with products beyond
    float64: inf − inf, or inf where an FMA keeps the later products exact. verify's independent
    dense pass must see it and fail the pair, although the exact output (t, 0) is the target."""
    t, w = 2.0 ** 601, 2.0 ** 430
    om = np.array([1.0, -2.0, 1.0])
    ff = FF(1.0, np.array([[1.0, 0.0]] * 3), np.array([0.0, -2.0 ** 599, -2.0 ** 600]),
            np.array([0 * om, w * om]))
    model = Transformer(2, "hardmax", [Block(ff=ff)], exact=False)
    x = np.array([[t, 0.0], [1.0, 0.0]])
    with np.errstate(all="ignore"):
        plain = x + np.maximum(x @ ff.U.T + ff.b, 0) @ ff.W.T  # the dense layer, written here
        fast = ef.evaluate.forward(model, [x], "float")[0]
    assert not np.isfinite(plain[0]).all() and np.isfinite(fast).all()
    report = ef.verify(model, ef.Dataset.from_arrays([x], [x]))
    assert report.nonfinite_pairs == [0]
    assert not report.ok
    assert report.extra["float64 max Hausdorff error (NumPy dense)"] in ("inf", "nan")
