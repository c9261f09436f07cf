"""The proof line of a float64 keyed softmax model: an exact output off its target by the
parameters' rounding is "not exact", never "wrong", while the pair is within the limit; and
no mpmath measurement is run when the ball bound already puts every pair within it."""

from __future__ import annotations

from fractions import Fraction

import mpmath
import numpy as np
from conftest import dense_pass

import exactformer as ef


def thirds_and_sevenths(N: int = 24, d: int = 3, seed: int = 0) -> ef.Dataset:
    """Inputs in thirds, targets in sevenths: neither is a float64, so a float64 model's
    outputs are off its targets by rounding."""
    rng = np.random.default_rng(seed)
    pool = [[Fraction(int(v), 3) for v in rng.integers(-20, 21, d)] for _ in range(8)]
    xs, ys, seen = [], [], set()
    while len(xs) < N:
        idx = tuple(sorted(rng.choice(8, rng.integers(1, 4), replace=False)))
        if idx not in seen:
            seen.add(idx)
            xs.append([pool[i] for i in idx])
            ys.append([[Fraction(int(v), 7) for v in rng.integers(-20, 21, d)]])
    return ef.Dataset.from_arrays(xs, ys)


def _mp(v):
    v = Fraction(v)
    return mpmath.mpf(v.numerator) / v.denominator


def mp_distance(model, data) -> float:
    """The largest Hausdorff distance of the outputs from the targets, by the test's own
    dense pass (conftest.dense_pass) in 60-digit mpmath."""
    to_mp = np.frompyfunc(_mp, 1, 1)
    worst = mpmath.mpf(0)
    with mpmath.workdps(60):
        for x, y in zip(data.inputs, data.padded(model.d).targets, strict=True):
            out = dense_pass(model, x, object, arr=lambda a: to_mp(np.asarray(a, dtype=object)),
                             exp=np.frompyfunc(mpmath.exp, 1, 1))[-1]
            outs, want = out.tolist(), to_mp(np.asarray(y, dtype=object)).tolist()
            for a in outs + want:  # Hausdorff: every output near a target and vice versa
                pool = want if a in outs else outs
                worst = max(worst, min(mpmath.sqrt(sum((u - v) ** 2 for u, v in
                                                       zip(a, b, strict=True))) for b in pool))
    return float(worst)


def test_within_the_limit_is_not_called_wrong():
    data = thirds_and_sevenths()
    model = ef.compile(data, attention="softmax", keys=True, exact=False)
    report = ef.verify(model, data)
    assert 0 < mp_distance(model, data) <= 1e-9 * data.coordinate_scale()
    assert report.verdict() == "OK" and "model is wrong" not in report.proof
    assert "within the limit" in report.proof and "not proved exact" in report.proof
    assert "not exactly a target" in report.proof or report.arithmetic == "enclosures"
    assert report.extra["mp pass"].startswith("not run")


def test_beyond_the_limit_is_called_wrong_and_measured():
    data = thirds_and_sevenths()
    model = ef.compile(data, attention="softmax", keys=True, exact=False)
    strict = ef.verify(model, data, tolerance=1e-30)
    assert mp_distance(model, data) > 1e-30 * data.coordinate_scale()
    assert strict.verdict() == "FAILED" and "the model is wrong on this pair" in strict.proof
    assert "hausdorff_mp" in strict.extra  # a failure is measured
