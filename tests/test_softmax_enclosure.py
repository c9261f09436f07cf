"""Float64 enclosures of softmax averages (evaluate/softmax_radius.py, docs/numerics.md
#softmax-averages-in-the-enclosures): every box is checked against averages of points drawn
inside the rows' boxes, computed here in mpmath at 60 digits, and float64 softmax models
that verify decides by the enclosures against test_verify_bounds' 600-digit reference."""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction

import mpmath
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st
from test_verify_bounds import check, doc, ff, reference, sa, set_data

import exactformer as ef
from exactformer.evaluate import enclose, enclosure
from exactformer.evaluate.causal_radius import causal_softmax_box
from exactformer.evaluate.head_radius import score_error
from exactformer.evaluate.softmax_radius import exp_neg_upper, softmax_box
from exactformer.modelio import model_from_dict


# ------------------------------------------------------------------------------ e^(−g)
@settings(max_examples=300, deadline=None)
@given(st.one_of(st.floats(0, 2000), st.sampled_from([0.0, 5e-324, 1e-300, 0.5, 1.0, 690.0,
                                                      693.1, 1e300, np.inf])))
def test_exp_neg_upper_is_an_upper_bound_within_seven_percent(g):
    b = float(exp_neg_upper(np.array([g]))[0])
    with mpmath.workdps(60):
        true = mpmath.exp(-mpmath.mpf(g))
        assert mpmath.mpf(b) >= true
        if g < 690:
            assert mpmath.mpf(b) <= true * mpmath.mpf("1.07")


def test_exp_neg_upper_knows_nothing_of_nan_or_negative_gaps():
    assert (exp_neg_upper(np.array([np.nan, -1.0, -np.inf])) == 1.0).all()


# ------------------------------------------------------------------------------ boxes
def _case(seed: int, scale: float, ties: bool):
    """One sequence's rows X ± r, score vectors, α, τ and multiplicities."""
    rng = np.random.default_rng(seed)
    n, d = int(rng.integers(1, 7)), int(rng.integers(1, 4))
    X = rng.integers(-4, 5, size=(n, d)) / 4 + (0 if ties else rng.normal(0, 1e-3, (n, d)))
    if ties and n > 1:
        X[-1] = X[0]
    r = np.where(rng.random((n, d)) < 0.5, 0.0, rng.random((n, d)) * 1e-6)
    c, a = rng.normal(0, scale, d), rng.normal(0, 1, d)
    alpha = float(rng.choice([0.0, 0.125, -2.0]))
    tau = float(rng.choice([1.0, 0.5, 3.0]))
    w = rng.integers(1, 4, n).astype(float)
    return X, r, c, a, alpha, tau, w


def _box(X, r, c, a, alpha, tau, w, float_average=True, causal=False):
    """What head_average computes for one sequence in a tracking pass (``causal``: what
    causal_radius.causal_softmax_box computes, every row of weight 1); with ``float_average``
    False the midpoints start from each row's best key instead of the float average (whose
    accuracy would otherwise hide a box too small around it)."""
    qa, ka = X @ c, X @ a
    q_rad, k_rad = enclosure.dot_radius(X, r, c), enclosure.dot_radius(X, r, a)
    if causal and float_average:
        return causal_softmax_box(X, r, qa, q_rad, ka, k_rad, alpha, tau, X, r)
    S = np.outer(qa, ka) + ((X @ X.T) * alpha if alpha != 0 else 0.0)
    Sm = np.where(np.tri(len(X), dtype=bool), S, -np.inf) if causal else S
    Z = (Sm - Sm.max(axis=1)[:, None]) / tau
    M = np.exp(Z) * w[None, :]
    avg = (M / M.sum(axis=1, keepdims=True)) @ X if float_average else X[np.argmax(Sm, axis=1)]
    E = score_error(X, r, qa, q_rad, ka, k_rad, alpha)
    return softmax_box(avg, S, E, w, tau, X, r, causal=causal)


def _true_average(P, c, a, alpha, tau, w, causal=False) -> list[list]:
    """Softmax averages of the points P (mpmath rows) at the working precision, row i over
    the rows l ≤ i alone when ``causal``."""
    def dot(u, v):
        return mpmath.fsum(s * t for s, t in zip(u, v, strict=True))
    out = []
    for i, x in enumerate(P):
        keys, wk = (P[: i + 1], w[: i + 1]) if causal else (P, w)
        s = [dot(c, x) * dot(a, y) + alpha * dot(x, y) for y in keys]
        top = max(s)
        e = [wl * mpmath.exp((v - top) / tau) for v, wl in zip(s, wk, strict=True)]
        out.append([mpmath.fsum(el * y[t] for el, y in zip(e, keys, strict=True)) /
                    mpmath.fsum(e) for t in range(len(x))])
    return out


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2 ** 32 - 1), st.sampled_from([1.0, 30.0, 1e3, 1e5]), st.booleans(),
       st.sampled_from(["centre", "corners", "random"]), st.booleans(), st.booleans())
def test_softmax_boxes_hold_every_average_of_points_in_the_rows_boxes(seed, scale, ties, where,
                                                                       float_average, causal):
    """Set and causal boxes (docs/numerics.md#causal-softmax-averages): each holds every
    average of points drawn inside the rows' boxes, over the whole sequence or the prefix."""
    X, r, c, a, alpha, tau, w = _case(seed, scale, ties)
    w = np.ones(len(X)) if causal else w  # (a causal pass never merges rows)
    mid, rad = _box(X, r, c, a, alpha, tau, w, float_average, causal)
    rng = np.random.default_rng(seed + 1)
    u = {"centre": np.zeros(X.shape), "corners": rng.choice([-1.0, 1.0], X.shape),
         "random": rng.uniform(-1, 1, X.shape)}[where]
    with mpmath.workdps(60):
        P = [[mpmath.mpf(x) + mpmath.mpf(s) * mpmath.mpf(rr)
              for x, s, rr in zip(xr, ur, rw, strict=True)]
             for xr, ur, rw in zip(X, u, r, strict=True)]
        mp = [mpmath.mpf(v) for v in (*c, *a, alpha, tau)]
        d = X.shape[1]
        true = _true_average(P, mp[:d], mp[d:2 * d], mp[2 * d], mp[2 * d + 1],
                             [mpmath.mpf(v) for v in w], causal)
        for i, row in enumerate(true):
            for t, v in enumerate(row):
                slack = mpmath.mpf(10) ** -50 * (1 + abs(v))  # the reference's own rounding
                assert abs(v - mpmath.mpf(mid[i, t])) <= mpmath.mpf(rad[i, t]) + slack, (i, t)
    event(("causal: " if causal else "") +
          ("a best key certified" if (rad < 1e-3).all() and scale >= 1e3 else "hull"))


def test_a_certified_best_key_leaves_only_its_blur():
    """Scores 10³ apart: each row's average is its best key's carrier within e^-1000 (the
    box then rounds out to a unit in the last place), and a coordinate equal on every key
    keeps radius 0 and its exact value."""
    X = np.array([[0.0, 1.0], [1.0, 1.0], [2.0, 1.0]])
    r = np.zeros(X.shape)
    mid, rad = _box(X, r, np.array([0.0, 1e3]), np.array([1.0, 0.0]), 0.0, 1.0, np.ones(3))
    assert (rad[:, 1] == 0).all() and (mid[:, 1] == 1.0).all()
    assert rad[:, 0].max() <= 2 * np.spacing(2.0) and (np.abs(mid[:, 0] - 2.0) <= rad[:, 0]).all()


def test_rows_without_a_certified_best_key_get_the_hull():
    """Two keys with equal scores: the average lies anywhere between them."""
    X = np.array([[0.0, 0.0], [1.0, 0.0]])
    mid, rad = _box(X, np.zeros(X.shape), np.zeros(2), np.zeros(2), 0.0, 1.0, np.ones(2))
    assert np.allclose(mid[:, 0], 0.5) and (rad[:, 0] >= 0.5).all()


# ------------------------------------------------------------------------------ verify
def _keyed_float64(seed: int, n: int):
    rng = np.random.default_rng(seed)
    xs = [rng.uniform(-1, 1, (n, 2)) for _ in range(3)]
    ys = [rng.integers(-3, 4, (1, 2)).astype(float) for _ in range(3)]
    data = ef.Dataset.from_arrays(xs, ys)
    return ef.compile(data, attention="softmax", exact=False), data


def _check(model, data):
    """verify's report on the data, after test_verify_bounds.check has asserted on the data
    as the model reads them (zero-padded: the reference does not pad) that an OK is never
    contradicted by the 600-digit reference."""
    check(model, data.padded(model.d))
    return ef.verify(model, data)


@pytest.mark.parametrize("n", [30, 100])
def test_keyed_float64_softmax_models_are_decided_by_the_enclosures(n):
    """Where the collapse's blur is below the limit (here), no ball pass runs; where it is
    not (a few tokens a sequence, small score scales) the ball pass decides, as tested below."""
    model, data = _keyed_float64(n, n)
    report = _check(model, data)
    assert report.ok and report.arithmetic == "enclosures", report.table()
    assert "float64 enclosures" in report.extra["decided by"]


def _moved(model, block: int, which: str, at: tuple, rel: float):
    blocks = list(model.blocks)
    ffl = blocks[block].ff
    arr = getattr(ffl, which).copy()
    arr[at] = arr[at] * (1 + rel) + rel
    blocks[block] = replace(blocks[block], ff=replace(ffl, **{which: arr}))
    return replace(model, blocks=blocks)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2 ** 16), st.sampled_from([1e-12, 1e-9, 1e-6, 1e-2]), st.data())
def test_no_enclosure_ok_that_the_reference_contradicts(seed, rel, draw):
    """A keyed float64 softmax model with one FF weight moved: whatever verify says, an OK
    is within the limit in the 600-digit reference (check asserts it)."""
    model, data = _keyed_float64(seed, 3)
    ffs = [k for k, b in enumerate(model.blocks) if b.ff is not None]
    k = draw.draw(st.sampled_from(ffs))
    which = draw.draw(st.sampled_from(["W", "b", "U"]))
    arr = getattr(model.blocks[k].ff, which)
    nz = np.argwhere(arr != 0)
    assume(len(nz))
    at = tuple(nz[draw.draw(st.integers(0, len(nz) - 1))])
    report = _check(_moved(model, k, which, at, rel), data)
    event(f"{report.verdict()} by {report.arithmetic[:5]}")


@pytest.mark.parametrize("target, ok", [([2, 4], True), ([0, 4], False)])
def test_a_huge_cancellation_goes_to_the_ball_bound(target, ok):
    """relu(x₁ + 2^400) − relu(2^400) is x₁ in real arithmetic and 0 in float64, then the
    layer doubles the token: (1, 2) ↦ (2, 4). The enclosures cannot put the pair within the
    limit, so the ball bound decides, right about the real answer and against the float one."""
    blocks = [{"ff": ff(0, [[1, 0], [0, 0], [0, 1]], [2.0 ** 400, 2.0 ** 400, 0],
                        [[1, -1, 0], [0, 0, 1]]), "sa": sa([1, 0], [0, 0], rho="1")}]
    model = model_from_dict(doc(blocks, number="float64"))
    report = check(model, set_data([[[1, 2]]], [[target]]))
    assert report.ok == ok and report.arithmetic.startswith("ball"), report.table()


# ------------------------------------------------------------------------------ FF pieces
def _exact_ff(xs: list, eta, U, b, W) -> list:
    """η·x + W relu(U x + b) in Fractions, for one point x (Fractions; floats read exactly)."""
    F = Fraction
    h = [max(F(0), sum((F(float(u)) * v for u, v in zip(row, xs, strict=True)), F(0))
             + F(float(bi))) for row, bi in zip(U, b, strict=True)]
    return [F(float(eta)) * xs[k] + sum((F(float(W[k, i])) * h[i] for i in range(len(h))), F(0))
            for k in range(len(xs))]


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2 ** 32 - 1), st.sampled_from([1.0, 0.0, -1.0, 0.5]),
       st.sampled_from([1e-12, 1e-6, 0.0]), st.sampled_from([1.0, 1e3, 1e6]))
def test_dense_ff_boxes_hold_the_exact_layer(seed, eta, reach, size):
    """ff_dense (units' evaluation, or the affine piece where every sign is certain) against
    the exact layer at points of the boxes; layers with cancelling pairs of units (a clip
    pair) as the keyed moves have, arguments of every size."""
    rng = np.random.default_rng(seed)
    n, d, pairs = 6, int(rng.integers(1, 4)), int(rng.integers(1, 3))
    f = rng.integers(-3, 4, size=(pairs, d)).astype(float)
    U = np.repeat(f, 2, axis=0)
    b = np.concatenate([[-0.5, -1.5] for _ in range(pairs)]) * rng.choice([1.0, size])
    w = rng.normal(0, 1, (d, pairs))
    W = np.stack([w, -w], axis=2).reshape(d, 2 * pairs)
    X = rng.normal(0, size, (n, d))
    r = np.abs(rng.normal(0, reach * size, (n, d)))
    out, rad = enclosure.ff_dense(X, r, eta, U, b, W)
    for i in range(n):
        for s in (-1.0, 0.0, 1.0):
            point = [Fraction(float(m)) + Fraction(s) * Fraction(float(e))
                     for m, e in zip(X[i], r[i], strict=True)]  # exactly in the box
            exact = _exact_ff(point, eta, U, b, W)
            for k in range(d):
                if np.isfinite(rad[i, k]):
                    assert abs(exact[k] - Fraction(float(out[i, k]))) <= Fraction(float(rad[i, k]))


def test_a_flat_clip_pair_adds_its_move_without_the_argument_s_rounding():
    """relu(2a − ½) − relu(2a − 3/2) is exactly 1 for a ≥ ¾: on a = 1000 ± 10⁻⁶ the layer
    adds w to the written coordinate, which keeps its own radius (0) plus the rounding of
    x + w, however large 2a is and however wide its box."""
    X, r = np.array([[1000.0, 0.25]]), np.array([[1e-6, 0.0]])
    U, b = np.array([[2.0, 0.0], [2.0, 0.0]]), np.array([-0.5, -1.5])
    W = np.array([[0.0, 0.0], [0.75, -0.75]])
    out, rad = enclosure.ff_dense(X, r, 1.0, U, b, W)
    assert out[0, 1] == 1.0 and rad[0, 1] <= 1e-15


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2 ** 32 - 1), st.sampled_from(["every", "some", "none"]), st.booleans())
def test_a_sequence_that_asks_one_query_gets_every_rows_box_from_its_first(seed, constant,
                                                                          radius):
    """Rank-one scores whose query reads a coordinate constant on some sequences (`one` in the
    keyed separation): the pass forms one row's scores for such a batch and gives its box to
    every row (attention._one_query). Every box holds the 50-digit reference at every token,
    whether every sequence, some or none ask one query, and with a radius on the query at one
    row (which then asks another), the reference taken at that radius's end."""
    rng = np.random.default_rng(seed)
    n, N, d = int(rng.integers(2, 6)), int(rng.integers(1, 4)), 3
    xs = [rng.integers(-8, 9, (n, d)) / 8 + rng.normal(0, 1e-3, (n, d)) for _ in range(N)]
    for k, x in enumerate(xs):
        if constant == "every" or (constant == "some" and k % 2 == 0):
            x[:, 0] = float(rng.choice([1.0, -0.5, 3.0]))
    c, a = [float(rng.choice([0.0, 40.0])), 0, 0], rng.normal(0, 4, d).tolist()
    c[0] = c[0] or 2.0
    model = model_from_dict(doc([{"ff": None, "sa": sa(a, c, rho="1", beta="1",
                                                         p=[0, 1, 0], q=[0, 0, 1])}],
                                d=d, number="float64"))
    radii, ends = [np.zeros(x.shape) for x in xs], [x.copy() for x in xs]
    if radius:  # the end that turns the query toward the other sign (exact sums)
        radii[0][-1, 0] = 2.0
        ends[0][-1, 0] -= 2.0 * np.sign(ends[0][-1, 0])
    out, rad = enclose(model, xs, radii)
    with mpmath.workdps(50):
        for o, r, ref in zip(out, rad, reference(model, ends), strict=True):
            for i in range(n):
                for t in range(d):  # (slack: the reference's own rounding)
                    slack = mpmath.mpf(10) ** -45 * (1 + abs(ref[i][t]))
                    assert abs(ref[i][t] - mpmath.mpf(o[i, t])) <= mpmath.mpf(r[i, t]) + slack
