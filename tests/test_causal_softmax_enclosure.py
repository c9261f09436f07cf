"""Causal float64 enclosures of softmax models (evaluate/causal_radius.causal_softmax_box,
evaluate/softmax_radius.py over each row's prefix, verification/causal_enclosure.py;
docs/numerics.md#causal-softmax-averages), judged by test_verify_bounds' dense mpmath
reference, which keeps every weight of every prefix: random causal softmax models (several
heads, α ≠ 0, τ ≠ 1, repeated rows, huge and subnormal coordinates, stored positions) whose
every finite radius must hold the 400-digit value; a later key that outscores a row's whole
prefix, which the row must not see; a score lead within the score error, which certifies
nothing; keyed causal builds on random sequences and on random texts, which verify decides
by the enclosures (OK, never PROVED EXACT), agreeing with the ball pass; moved weights, which
must never turn into a wrong OK; a verdict at the edge of the limit; and hat models, which go
to the ball pass alone.
"""

from __future__ import annotations

import math
from dataclasses import replace
from fractions import Fraction

import mpmath
import numpy as np
import pytest
from conftest import conflict_data
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from test_causal_enclosure import moved_weights
from test_softmax_enclosure_attacks import _random_inputs, _random_model, mpf
from test_verify_bounds import reference, true_error

import exactformer as ef
from exactformer.evaluate import enclose
from exactformer.evaluate.causal_radius import causal_softmax_box
from exactformer.evaluate.softmax_radius import tail_weight
from exactformer.model import SA, Block, ScoreMatrix, Transformer, ValueMatrix
from exactformer.verification import CausalReport, decide
from exactformer.verification.margins import snap_start


def _causal_model(rng):
    """test_softmax_enclosure_attacks' random softmax model under the causal mask, with stored
    positions (four rows: its sequences are at most four tokens long) half the time."""
    model = replace(_random_model(rng), causal=True)
    if rng.random() < 0.5:
        model = replace(model, positions=rng.normal(0, 1, (4, model.d)) *
                        float(rng.choice([1.0, 1e-3, 1e5])))
    return model


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2 ** 32 - 1))
def test_random_causal_softmax_models_are_enclosed(seed):
    """Every finite radius of the causal enclosure bounds the distance of its float output
    from the 400-digit causal value of the stored floats."""
    rng = np.random.default_rng(seed)
    model = _causal_model(rng)
    xs = _random_inputs(rng, model.d)
    outs, rads = enclose(model, xs, None)
    finite = 0
    with mpmath.workdps(400):
        refs = reference(model, [[[Fraction(float(v)) for v in r] for r in x] for x in xs])
        for o, r, ref in zip(outs, rads, refs, strict=True):
            for (i, t), rv in np.ndenumerate(r):
                if math.isfinite(rv):
                    finite += 1
                    assert math.isfinite(o[i, t])
                    assert abs(ref[i][t] - mpf(o[i, t])) <= mpf(rv), (i, t, rv)
    event("all radii finite" if finite == sum(x.size for x in outs) else
          "some radii finite" if finite else "no finite radius")


def test_a_later_key_that_outscores_the_prefix_is_not_seen():
    """Key 1 outscores key 0 by 100, but row 0 sees key 0 alone: its certified best key is
    key 0 with no tail, and its box is key 0's exact carrier. Row 1's best key is key 1."""
    S = np.array([[0.0, 100.0], [0.0, 100.0]])
    best, certain, W = tail_weight(S, np.zeros((2, 2)), np.ones(2), 1.0, causal=True)
    assert best.tolist() == [0, 1] and certain.all()
    assert W[0] <= 1e-300 and 0 < W[1] <= 1.07 * math.exp(-100)
    X, zero = np.array([[1.0], [2.0]]), np.zeros(2)
    avg, rad = causal_softmax_box(X, np.zeros((2, 1)), np.array([1.0, 1.0]), zero,
                                  np.array([0.0, 100.0]), zero, 0.0, 1.0, X,
                                  np.zeros((2, 1)))
    assert avg[0, 0] == 1.0 and rad[0, 0] == 0.0
    assert abs(avg[1, 0] - 2.0) <= rad[1, 0] <= 1e-15


def test_a_score_lead_within_the_score_error_certifies_nothing():
    """Queries 1000 and keys 0 and 0.05 (radius 0.1): key 1 leads row 1 by 50 in float64, but
    the keys may be 0.1 and −0.05, where key 0 leads by 150; row 1's box must then hold the
    average of carriers 1.0 and 1.05 (radius 10^-3) near 1.0, which only the score error
    bounds keep in (no certified key: the hull)."""
    X, r = np.array([[1.0], [1.05]]), np.full((2, 1), 1e-3)
    k, k_rad = np.array([0.0, 0.05]), np.full(2, 0.1)
    avg, rad = causal_softmax_box(X, r, np.full(2, 1000.0), np.zeros(2), k, k_rad, 0.0, 1.0,
                                  X, r)
    with mpmath.workdps(40):
        e0, e1 = mpmath.exp(1000 * mpmath.mpf("0.1")), mpmath.exp(1000 * mpmath.mpf("-0.05"))
        true = (e0 * mpf(1.0) + e1 * mpf(1.05)) / (e0 + e1)
        assert abs(true - mpf(avg[1, 0])) <= mpf(rad[1, 0])


def _three_and_one(s: float, tau: float) -> tuple[Transformer, ef.CausalDataset]:
    """The sequence (0, 1), (0, 1), (0, 1), (1, 1) under one causal head with scores s·x_l1 and
    V = I: the first three positions see (0, 1) alone and return it exactly; the last sees
    all four, its best key (1, 1) behind three others, and returns 1 − 3/(3 + e^(s/τ)) in its
    first coordinate. Every target is the token itself (scale 1)."""
    sa = SA(0.0, ScoreMatrix(0.0, np.array([1.0, 0.0]), np.array([0.0, s])),
            ValueMatrix(1.0, np.zeros(2), np.zeros(2)))
    model = Transformer(d=2, attention="softmax", blocks=[Block(None, sa)], tau=tau,
                        exact=False, causal=True)
    x = [[0.0, 1.0]] * 3 + [[1.0, 1.0]]
    return model, ef.CausalDataset.from_arrays([x], [x])


@pytest.mark.parametrize("s, tau", [(20.0, 1.0), (12.0, 0.5), (45.0, 3.0)])
def test_a_causal_verdict_at_the_edge_of_the_limit(s, tau):
    """The true error e = 3/(3 + e^(s/τ)) at the last position: a tolerance 2.2 e is OK by the
    enclosures (their bound is 2 e, as for set models: the radius is taken about the float
    average, which the distance to the target counts again), 1.1 e by the ball pass, and one
    1 % below e is never OK; the first three positions are bounded by the
    distance's underflow slack alone."""
    model, data = _three_and_one(s, tau)
    with mpmath.workdps(50):
        rel = float(3 / (3 + mpmath.exp(mpmath.mpf(s) / mpmath.mpf(tau))))
    above = ef.verify(model, data, tolerance=rel * 2.2)
    assert above.ok and above.arithmetic == "float64 enclosures", above.table()
    assert max(above.position_errors[0][:3]) <= 1e-150  # (the distance's underflow slack)
    assert 1.99 * rel <= above.position_errors[0][3] <= 2.01 * rel
    between = ef.verify(model, data, tolerance=rel * 1.1)
    assert between.ok and between.arithmetic.startswith("ball"), between.table()
    below = ef.verify(model, data, tolerance=rel * 0.99)
    assert not below.ok and below.first_failure == (0, 3), below.table()


def _keyed_softmax(data, width: int = 4):
    return ef.compile(data, causal=True, keys=True, attention="softmax", width=width,
                      exact=False)


def _true_error(model, data) -> float:
    """The largest true error of the model on the data, relative to their scale, at 600
    digits (test_verify_bounds.true_error), on the data zero-padded to the model's width as
    verify reads them."""
    xs, ys = data.fractions()
    pad = [Fraction(0)] * (model.d - data.d)
    padded = ef.CausalDataset.from_arrays(
        [[[*r, *pad] for r in x] for x in xs],
        [[[*y[i], *pad] if k[i] else None for i in range(len(k))]
         for y, k in zip(ys, data.known, strict=True)])
    return max(true_error(model, padded))


def _ball_verdict(model, data, report) -> dict:
    """The ball pass's verdict fields on the data (padded as verify pads them), at the limit
    verify used."""
    limit = Fraction(report.tolerance) * Fraction(report.coordinate_scale)
    return decide._causal_softmax(model, decide.check_layers(model, data), limit, 50, None)


def _texts() -> ef.CausalDataset:
    """Three short texts, each opened by a marker of its own (as the benchmark's sentences):
    the same character at the same position continues differently."""
    return ef.CausalDataset.from_text(["1abcab.", "2abdab!", "3xbcaby"], d=3)


def _check_keyed(data) -> CausalReport:
    """verify's report on a float64 keyed causal softmax build of the data, after asserting
    that an OK is never contradicted by the 600-digit reference and that an OK of the
    enclosures is no failure of the ball pass, run on its own."""
    model = _keyed_softmax(data)
    report = ef.verify(model, data)
    if report.ok:
        assert _true_error(model, data) <= report.tolerance, report.table()
    if report.arithmetic == "float64 enclosures":
        assert not report.proved
        assert _ball_verdict(model, data, report)["first_failure"] is None
    return report


@pytest.mark.parametrize("data", [conflict_data(3, n=6, length=5), _texts()],
                         ids=["random sequences", "texts"])
def test_keyed_causal_softmax_builds_are_decided_by_the_enclosures(data):
    """A float64 keyed causal softmax build: verify says OK by float64 enclosures (not proved
    exact), every constrained position's true error is within the limit, and the ball pass
    finds no failure either."""
    report = _check_keyed(data)
    assert report.ok and report.arithmetic == "float64 enclosures", report.table()


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.text("ab.", min_size=1, max_size=5), min_size=1, max_size=3),
       st.sampled_from([2, 3]))
def test_random_texts_get_no_wrong_ok(texts, d):
    """Random texts over a three-letter alphabet, each opened by a marker of its own: whatever
    decides the keyed build, an OK holds in the reference and agrees with the ball pass."""
    data = ef.CausalDataset.from_text([str(k) + t for k, t in enumerate(texts)], d=d)
    report = _check_keyed(data)
    event(f"{report.verdict()} by {report.arithmetic}")


def test_a_moved_weight_never_becomes_a_wrong_ok():
    """Every attention value weight and (first) FF output weight of a keyed causal softmax
    model moved by 1/64 of itself: an OK is never contradicted by the 600-digit reference,
    an OK of the enclosures is never a failure of the ball pass, and some moves fail."""
    data = conflict_data(3, n=6, length=5)
    model = _keyed_softmax(data)
    rejected = 0
    for where, moved in moved_weights(model):
        report = ef.verify(moved, data)
        if report.ok:
            assert _true_error(moved, data) <= report.tolerance, where
        if report.arithmetic == "float64 enclosures":
            assert _ball_verdict(moved, data, report)["first_failure"] is None, where
        rejected += report.first_failure is not None
    assert rejected


def test_a_hat_model_goes_to_the_ball_pass_alone():
    """A float64 causal softmax hat model (a snap line) is not enclosed: its enclosure loses
    nearly every row (docs/numerics.md#causal-softmax-averages), so the ball pass decides."""
    data = conflict_data(2, n=4, length=3)
    model = ef.compile(data, causal=True, attention="softmax", exact=False,
                       construction="paper")
    assert snap_start(model) is not None
    assert decide._causal_enclosure(model, data, None, data.floats()[0], False, None) is None
    assert ef.verify(model, data).arithmetic.startswith("ball")
