"""Enclosures of FF layers whose rows sit on or near a unit's kink (undecided units).

A unit whose pre-activation interval straddles 0 may be on or off; the enclosure charges such
rows the largest |J_P|·r over the on/off patterns P of their few undecided units
(docs/numerics.md#enclosures). Every test here checks the radii against an exact Fraction
evaluation of the layer at every vertex of the box's pieces (where a piecewise affine map
takes its extremes), so a pattern left out or a rounding forgotten shows as a miss.
"""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
from hypothesis import event, given, settings
from hypothesis import strategies as st
from test_enclosure import assert_verdict_is_exact, exact, ff, own_targets, pairs_of, transformer

from exactformer.evaluate import enclose
from exactformer.model import Block


def layer_value(layer, x) -> list[Fraction]:
    """η·x + W relu(U x + b) in exact arithmetic."""
    eta, U, b, W = (exact(layer.eta), [[exact(v) for v in u] for u in layer.U],
                    [exact(v) for v in layer.b], [[exact(v) for v in w] for w in layer.W])
    z = [max(Fraction(0), sum((u * v for u, v in zip(uk, x, strict=True)), Fraction(0)) + bk)
         for uk, bk in zip(U, b, strict=True)]
    return [eta * x[i] + sum((w * v for w, v in zip(W[i], z, strict=True)), Fraction(0))
            for i in range(len(x))]


def vertices(layer, X, r) -> list[list[Fraction]]:
    """The box X ± r's corners, where each unit's kink U_k·x + b_k = 0 crosses its edges,
    and (d = 2) where two kinks cross inside it: every vertex of its affine pieces."""
    d = len(X)
    lo = [exact(m) - exact(e) for m, e in zip(X, r, strict=True)]
    hi = [exact(m) + exact(e) for m, e in zip(X, r, strict=True)]
    inside = [lambda x: all(a <= v <= c for a, v, c in zip(lo, x, hi, strict=True))]
    pts = [list(c) for c in itertools.product(*zip(lo, hi, strict=True))]
    kinks = [([exact(v) for v in u], exact(bk)) for u, bk in zip(layer.U, layer.b, strict=True)]
    for u, bk in kinks:
        for j in range(d):  # free coordinate j, the others at a corner
            if u[j] == 0:
                continue
            for corner in itertools.product(*zip(lo, hi, strict=True)):
                x = list(corner)
                x[j] = -(bk + sum(u[i] * x[i] for i in range(d) if i != j)) / u[j]
                pts.append(x)
    if d == 2:
        for (u, bu), (v, bv) in itertools.combinations(kinks, 2):
            det = u[0] * v[1] - u[1] * v[0]
            if det != 0:
                pts.append([(-bu * v[1] + bv * u[1]) / det, (-bv * u[0] + bu * v[0]) / det])
    return [x for x in pts if inside[0](x)]


def check_box(layer, X, r) -> None:
    """The enclosure of the one-block model on the box X ± r holds the exact layer at every
    vertex of the box's pieces."""
    model = transformer([Block(layer, None)], d=len(X))
    (mid,), (rad,) = enclose(model, [np.array([X], dtype=float)], [np.array([r], dtype=float)])
    for x in vertices(layer, X, r):
        for i, e in enumerate(layer_value(layer, x)):
            assert abs(e - Fraction(float(mid[0, i]))) <= Fraction(float(rad[0, i])), (
                f"coordinate {i} at {[float(v) for v in x]}: exact {float(e)!r}, float "
                f"{mid[0, i]!r}, radius {rad[0, i]!r}")


SMALL = st.sampled_from([-2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 3.0, 0.1, -1 / 3])


@st.composite
def kinked_layers(draw, d: int):
    """A dense FF layer of 1 to 5 units and a point X; each unit's kink passes exactly
    through X, a few ulps beside it, or anywhere; output weights that cancel in slope (hats
    a, −2a, a) or random; η ∈ {0, 1, 1/2}."""
    X = [draw(st.integers(-8, 8)) / 4.0 for _ in range(d)]
    h = draw(st.integers(1, 5))
    U = [[draw(SMALL) for _ in range(d)] for _ in range(h)]
    b = []
    for u in U:
        at = -float(sum(exact(a) * exact(x) for a, x in zip(u, X, strict=True)))
        kind = draw(st.sampled_from(["on", "on", "near", "any"]))
        if kind == "near":
            for _ in range(draw(st.integers(1, 3))):
                at = float(np.nextafter(at, draw(st.sampled_from([np.inf, -np.inf]))))
        b.append(at if kind != "any" else draw(SMALL))
    if draw(st.booleans()):
        a = draw(st.sampled_from([1.0, 129.0, 2.0 ** 20, 0.3]))
        col = [a * c for c in itertools.islice(itertools.cycle([1.0, -2.0, 1.0]), h)]
        W = [[draw(st.sampled_from([0.0, 1.0, -1.0])) * c for c in col] for _ in range(d)]
    else:
        W = [[draw(SMALL) for _ in range(h)] for _ in range(d)]
    eta = draw(st.sampled_from([0.0, 1.0, 0.5]))
    r = [draw(st.sampled_from([0.0, 2.0 ** -40, 1e-12, 2.0 ** -10])) for _ in range(d)]
    return ff(eta, U, b, W), X, r


@settings(max_examples=150, deadline=None)
@given(d=st.integers(1, 2), data=st.data())
def test_rows_on_kinks_are_enclosed_over_their_whole_box(d, data):
    """Dense layers with units whose kinks pass through or beside the row: the exact layer
    at every vertex of the box's pieces lies within the radius."""
    layer, X, r = data.draw(kinked_layers(d))
    check_box(layer, X, r)


@settings(max_examples=60, deadline=None)
@given(d=st.integers(1, 2), data=st.data())
def test_residual_ridge_rows_on_kinks_are_enclosed(d, data):
    """Residual ridge windows (η = 1, one direction): a hat whose middle kink is the row's own
    f·x: weights 1, −2, 1 on breakpoints t − 1, t, t + 1 (a gadget) or 2, −3, 1 on t − 1, t,
    t + 2 (no power-of-two form: the general window rule, ``ff_change``)."""
    layer, X, r = data.draw(kinked_layers(d))
    f = np.array(layer.U[0])
    if not f.any():
        return
    t = float(sum(exact(a) * exact(x) for a, x in zip(f, X, strict=True)))
    weights, ends = data.draw(st.sampled_from([([1.0, -2.0, 1.0], [-1.0, 0.0, 1.0]),
                                               ([2.0, -3.0, 1.0], [-1.0, 0.0, 2.0])]))
    b = -np.array([t + e for e in ends])
    check_box(ff(1.0, np.array([f, f, f]), b, np.outer(layer.W[:, 0], weights)), X, r)


def test_a_row_on_a_hats_peak_is_charged_the_hats_slope():
    """A non-residual layer whose hat (slopes +s, −s) peaks exactly at the row: the radius
    is about s·|f|·r — a bound that adds every undecided unit's spread would give 3·s·|f|·r
    (the middle unit's weight is −2s)."""
    s, r = 129.0, 1e-11
    X = [1.0, 0.5]
    f = np.array([1.0, 1.0])
    t = 1.5
    layer = ff(0.0, [f, f, f], [-(t - 0.25), -t, -(t + 0.25)], [[s, -2 * s, s], [0, 0, 0]])
    check_box(layer, X, [r, r])
    model = transformer([Block(layer, None)])
    _, (rad,) = enclose(model, [np.array([X])], [np.array([[r, r]])])
    assert rad[0, 0] < 1.01 * s * 2 * r


@settings(max_examples=40, deadline=None)
@given(d=st.integers(2, 3), data=st.data(),
       nudge=st.sampled_from([None, Fraction(1, 10 ** 6), Fraction(1, 10 ** 12)]))
def test_verify_on_kinks_agrees_with_the_exact_evaluation(d, data, nudge):
    """Rational tokens a third of a few ulps either side of a layer's kinks (their float
    images on them), targets the enclosure's own outputs or nudged: ``verify`` says OK
    exactly when the exact evaluation fits."""
    layer, X, _ = data.draw(kinked_layers(d))
    model = transformer([Block(layer, None)], d=d)
    step = Fraction(1, 3) * Fraction(2) ** data.draw(st.integers(-60, -50))
    xs = [[[exact(v) + step for v in X], [exact(v) - step for v in X]]]
    ys = own_targets(model, xs, nudge)
    if ys is not None:
        event(assert_verdict_is_exact(model, pairs_of(xs, ys)))
