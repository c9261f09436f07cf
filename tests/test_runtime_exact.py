"""Where the runtime proofs call a sum exact (docs/numerics.md#proofs-for-reduced-precision-
runtimes). Linear maps (``runtime_boxes.linear``): where X Wᵀ + b is called exact, every float32
evaluation of the test's own (each order of the terms, with and without a fused multiply-add)
of every stored value of the boxes tried (their ends, the powers of two inside, random values)
gives exactly the rational value; everywhere, the midpoint ± spread + rounding holds every
evaluation. Scores (``runtime_scores.scores_box``): the sum is judged before 1/τ divides it."""

from __future__ import annotations

from fractions import Fraction
from itertools import permutations
from types import SimpleNamespace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from exactformer.evaluate.enclosure import rounding
from exactformer.verification.formats import get_format, stored
from exactformer.verification.runtime_boxes import Weights, linear
from exactformer.verification.runtime_proof import _midpoint_error, _writers, ff_box
from exactformer.verification.runtime_scores import Context, scores_box

F32 = np.float32
FMT = get_format("float32")


def _stored_values(m: float, r: float, rng) -> list[F32]:
    """float32 values in [m − r, m + r]: both ends (rounded inward), every power of two
    inside with its neighbours, and random values."""
    lo, hi = m - r, m + r
    ends = [np.nextafter(F32(lo), F32(np.inf)) if F32(lo) < lo else F32(lo),
            np.nextafter(F32(hi), F32(-np.inf)) if F32(hi) > hi else F32(hi)]
    out = ends + [F32(v) for v in rng.uniform(lo, hi, 6)]
    if lo > 0:
        for e in range(int(np.floor(np.log2(lo))), int(np.ceil(np.log2(hi))) + 1):
            p = F32(2.0 ** e)
            out += [p, np.nextafter(p, F32(0)), np.nextafter(p, F32(np.inf))]
    return [v for v in out if lo <= float(v) <= hi]


def _evaluations(x, w, b) -> list[float]:
    """Every float32 value of Σ w_c·x_c + b the test's orders give: each order of the
    rounded products and the bias, and one rounding of the exact sum (FMA-like)."""
    terms = [F32(wc) * F32(xc) for wc, xc in zip(w, x, strict=True) if wc != 0] + [F32(b)]
    out = []
    for order in permutations(terms):
        acc = order[0]
        for t in order[1:]:
            acc = F32(acc + t)
        out.append(float(acc))
    exact = sum((Fraction(float(wc)) * Fraction(float(xc)) for wc, xc in zip(w, x, strict=True)),
                Fraction(float(b)))
    out.append(float(F32(float(exact))))
    return out


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1))
def test_exact_claims_hold_in_every_order_and_boxes_hold_every_value(seed):
    rng = np.random.default_rng(seed)
    D, units = int(rng.integers(1, 3)), int(rng.integers(1, 4))
    powers = 2.0 ** rng.integers(-4, 8, size=(units, D))
    odd = rng.choice([1.0, 1.0, 3.0, 63.0, 1.0 + 2.0 ** -20], size=(units, D))
    W = np.where(rng.random((units, D)) < 0.7, powers * odd, 0.0) * rng.choice([-1, 1],
                                                                              (units, D))
    b = rng.integers(-64, 65, size=units) * 2.0 ** rng.choice([-20, -18, -4, 0, 1], size=units)
    T = 3
    Xm = np.asarray(F32(rng.choice([1.0, 0.5, 2.0, 0.75], (T, D)) *
                        (1 + rng.uniform(-2.0 ** -8, 2.0 ** -8, (T, D)))), dtype=float)
    Xr = np.where(rng.random((T, D)) < 0.6, rng.choice([2.0 ** -10, 2.0 ** -14], (T, D)), 0.0)
    mid, spread, rnd, q = linear(Xm, Xr, W, np.zeros_like(W), b, np.zeros_like(b), FMT)
    for t in range(T):
        values = [_stored_values(Xm[t, c], Xr[t, c], rng) for c in range(D)]
        rows = [np.array([rng.choice(v) for v in values]) for _ in range(6)]
        rows.append(np.array([v[-1] for v in values]))
        for x in rows:
            for i in range(units):
                exact = float(sum((Fraction(float(W[i, c])) * Fraction(float(x[c]))
                                   for c in range(D)), Fraction(float(b[i]))))
                got = _evaluations(x, W[i], b[i])
                reach = spread[t, i] + rnd[t, i]
                assert all(abs(g - mid[t, i]) <= reach for g in got), (t, i, x)
                if q[t, i] > 0:
                    assert all(g == exact for g in got), (t, i, x, W[i], b[i])


def test_a_scaled_slot_read_across_a_power_of_two_is_exact():
    """A clip unit 64·x − 16 on a slot known as 0.9995 ± 0.0005 (the box passes 1): the term
    alone is a scaling, exact, and the sum stays below 2^24 of its quantum, so every
    evaluation gives exactly 64·x − 16 although the partial sums' bound (64.00005) passes
    2^24·2^-18. With 63 for 64 the product itself rounds: no claim."""
    Xm, Xr = np.array([[0.9995122045007754]]), np.array([[0.0004886312438717024]])
    b = np.array([-16.0])
    *_, q = linear(Xm, Xr, np.array([[64.0]]), np.zeros((1, 1)), b, np.zeros(1), FMT)
    assert q[0, 0] == 2.0 ** -18
    *_, q = linear(Xm, Xr, np.array([[63.0]]), np.zeros((1, 1)), b, np.zeros(1), FMT)
    assert q[0, 0] == 0


def test_a_scaled_sum_that_may_pass_its_quantum_is_not_exact():
    """64·x + 2^-18 with x in 1 − 2^-12 ± 2^-10: the midpoint's sum is below 2^24 of its
    quantum, but at x = 1 + 2^-23 the sum needs 25 bits: the spread must count."""
    Xm, Xr = np.array([[1 - 2.0 ** -12]]), np.array([[2.0 ** -10]])
    b = np.array([2.0 ** -18])
    *_, q = linear(Xm, Xr, np.array([[64.0]]), np.zeros((1, 1)), b, np.zeros(1), FMT)
    assert q[0, 0] == 0
    assert F32(F32(64.0) * F32(1 + 2.0 ** -23)) + F32(b[0]) != 64 * (1 + 2.0 ** -23) + b[0]


def test_a_score_sum_is_judged_before_the_temperature_divides_it():
    """A softmax score ⟨x, x⟩/τ with τ = 2 and x = (1 + 2^-11, 2): the sum 5 + 2^-10 + 2^-22
    needs 25 bits, so float32 rounds it before the (exact) division, though the divided
    value would fit. The box must hold every order's result."""
    model = SimpleNamespace(attention="softmax", causal=False, tau=2.0, blocks=[])
    ctx = Context(model, FMT, 2.0)
    x = np.array([1 + 2.0 ** -11, 2.0])
    head = Weights({"alpha": 1.0, "a": np.zeros(2), "c": np.zeros(2), "beta": 1.0,
                    "p": np.zeros(2), "q": np.zeros(2)}, FMT)
    mid, rad = scores_box(np.stack([x, x])[None], np.zeros((1, 2, 2)), head, ctx)
    got = [float(F32(F32(x[0] * x[0]) + F32(x[1] * x[1])) / F32(2)),
           float(F32(F32(x[1] * x[1]) + F32(x[0] * x[0])) / F32(2))]
    assert any(g != float(x @ x) / 2 for g in got)
    assert all(abs(g - mid[0, 0, 0]) <= rad[0, 0, 0] for g in got)


def test_an_unread_column_that_may_not_be_finite_is_still_read():
    """A dense product reads every column: 0·inf and 0·nan are nan. A column no weight reads
    is left out of the bounds only where its values are finite; an infinite value, or an
    unknown one (infinite radius), leaves the sum unknown."""
    W, b = np.array([[1.0, 0.0]]), np.zeros(1)
    for Xm, Xr in (([[1.0, np.inf]], [[0.0, 0.0]]), ([[1.0, 0.0]], [[0.0, np.inf]])):
        with np.errstate(all="ignore"):  # as the pass runs it: nan is the point here
            mid, spread, rnd, q = linear(np.array(Xm), np.array(Xr), W, np.zeros_like(W), b,
                                         np.zeros(1), FMT)
        assert not np.isfinite(mid[0, 0] + spread[0, 0] + rnd[0, 0]) and q[0, 0] == 0
    mid, spread, rnd, q = linear(np.array([[1.0, 5.0]]), np.array([[0.0, 1.0]]), W,
                                 np.zeros_like(W), b, np.zeros(1), FMT)
    assert (mid[0, 0], spread[0, 0] + rnd[0, 0], q[0, 0]) == (1.0, 0.0, 1.0)


def test_a_score_divided_by_a_large_power_of_two_may_round_below_the_normals():
    """⟨c, x⟩·⟨a, x⟩ = 3·2^-126 is exact, and τ = 2^24 is a power of two, but the divided
    score 3·2^-150 is below float32's subnormal step 2^-149: the division rounds."""
    model = SimpleNamespace(attention="softmax", causal=False, tau=2.0 ** 24, blocks=[])
    ctx = Context(model, FMT, 2.0)
    x = np.array([2.0 ** -63, 3 * 2.0 ** -63])
    head = Weights({"alpha": 0.0, "a": np.array([0.0, 1.0]), "c": np.array([1.0, 0.0]),
                    "beta": 1.0, "p": np.zeros(2), "q": np.zeros(2)}, FMT)
    mid, rad = scores_box(x[None, None], np.zeros((1, 1, 2)), head, ctx)
    got = float(F32(F32(x[0]) * F32(x[1])) / F32(2.0 ** 24))
    assert Fraction(got) != Fraction(x[0]) * Fraction(x[1]) / 2 ** 24
    assert abs(got - mid[0, 0, 0]) <= rad[0, 0, 0]


def test_a_cell_of_no_terms_is_its_exact_zero():
    """η = ½ and a coordinate that is 0 with no unit writing it: the cell has no terms, so its
    quantum is inf, and snapping it to rint(0/inf)·inf made it nan and the model UNDECIDED
    (a harmless refusal, found by an attack helper); it is 0, and the model is proved."""
    import exactformer as ef
    from exactformer.model import FF, Block, Transformer
    from exactformer.verification import prove_runtime
    from exactformer.verification.runtime_proof import ff_box

    U, b, W = np.array([[1.0, 0.0]]), np.zeros(1), np.array([[1.0], [0.0]])
    w = Weights({"eta": 0.5, "U": U, "b": b, "W": W}, FMT)
    mid, rad = ff_box(np.array([[2.0, 0.0]]), np.zeros((1, 2)), w, FMT)
    assert mid.tolist() == [[3.0, 0.0]] and rad.max() < 1e-15
    model = Transformer(2, "hardmax", [Block(FF(0.5, U, b, W), None)], exact=False)
    data = ef.Dataset.from_arrays([np.array([[2.0, 0.0]])], [np.array([[3.0, 0.0]])])
    assert prove_runtime(model, data, "float32").ok


def _format_values(m: float, r: float, fmt, rng) -> list[float]:
    """Values of the format in [m − r, m + r]: both ends rounded inward and random ones."""
    lo, hi = m - r, m + r
    vals = stored(np.concatenate([[lo, hi, m], rng.uniform(lo, hi, 8)]), fmt)
    return [float(v) for v in vals if lo <= v <= hi]


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(["float32", "bfloat16", "float16"]), st.sampled_from([1.0, 0.5, 2.0]),
       st.sampled_from([1.0, 2.0, 0.5]), st.sampled_from([-1.0, -2.0, -0.5, -4.0, 1.0]),
       st.sampled_from([0.0, 0.0, 2.0 ** -12, -3.0]), st.floats(-3.0, 12.0),
       st.integers(0, 2 ** 32 - 1))
def test_a_cancelling_pair_holds_every_evaluation(runtime, eta, u, w, b, log_m, seed):
    """η·x + w·relu(u·x + b) on one coordinate, powers of two (a flip's x − relu(x) among
    them): where both terms are within a factor 2 and of opposite signs the sum is exact in
    every format, and the box is a point; everywhere, each format value of the input box,
    with the dot product and the sum stored in the format in either order (and fused),
    lands in the box (``runtime_proof._cancelling``, docs/numerics.md)."""
    rng = np.random.default_rng(seed)
    fmt = get_format(runtime)
    m = float(stored(np.array([2.0 ** log_m * rng.uniform(1, 2)]), fmt)[0])
    r = float(rng.choice([0.0, 2.0 ** -30, 1e-3 * m, 0.3 * m]))
    layer = Weights({"eta": eta, "U": np.array([[u]]), "b": np.array([b]),
                     "W": np.array([[w]])}, fmt)
    mid, rad = ff_box(np.array([[m]]), np.array([[r]]), layer, fmt)

    def st_(v):
        return float(stored(np.array([float(F32(v))]), fmt)[0])

    for x in _format_values(m, r, fmt, rng):
        a = max(st_(st_(u * x) + b), 0.0)
        t1, t2 = st_(eta * x), st_(w * a)
        for got in (st_(t1 + t2), st_(float(Fraction(eta) * Fraction(x) + Fraction(w) *
                                             Fraction(a)))):
            assert abs(got - mid[0, 0]) <= rad[0, 0], (x, got, mid, rad)


def test_a_flip_on_an_inexact_slot_is_an_exact_zero():
    """slot − relu(slot) on a slot known only as 1024 ± 0.0015 is an exact 0 in every format
    (Sterbenz): the box is the point 0, so a later reset of the slot is off for certain.
    With the unit's weight −4 the terms are more than a factor 2 apart: no such claim."""
    Xm, Xr = np.array([[1023.99896799]]), np.array([[0.0014264839]])
    for runtime in ("float32", "bfloat16", "float16"):
        fmt = get_format(runtime)
        flip = Weights({"eta": 1.0, "U": np.array([[1.0]]), "b": np.zeros(1),
                        "W": np.array([[-1.0]])}, fmt)
        assert [a.tolist() for a in ff_box(Xm, Xr, flip, fmt)] == [[[0.0]], [[0.0]]]
        far = Weights({"eta": 1.0, "U": np.array([[1.0]]), "b": np.zeros(1),
                       "W": np.array([[-4.0]])}, fmt)
        assert ff_box(Xm, Xr, far, fmt)[1][0, 0] > 0


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 2 ** 32 - 1))
def test_the_midpoint_error_bounds_the_float64_sum_exactly(seed):
    """``runtime_proof._midpoint_error`` against the rational value of η·x + Σ_k W_ck·a_k: never
    below |exact − mid|, and equal to it where it claims TwoSum's exact error (one unit
    beside η·x, powers of two, a W or η that is not one, and subnormal a's and x's that a
    factor ½ rounds)."""
    rng = np.random.default_rng(seed)
    T, D, n = 4, 3, 3
    pick = [1.0, -1.0, 0.5, 4.0, 3.0, 0.0]
    W = rng.choice(pick, size=(D, n))
    eta = float(rng.choice([1.0, 0.5, 3.0, 0.0]))
    Xm = rng.choice([1.0, 1 + 2.0 ** -52, 2.0 ** 60, 3.0, 0.0], size=(T, D)) * \
        rng.uniform(0.5, 2, (T, D))
    Xm = np.where(rng.random((T, D)) < 0.2, 3 * 2.0 ** -1074, Xm)
    Am = rng.choice([1.0, 2.0 ** -53, 3 * 2.0 ** -1074, 7.0, 0.0], size=(T, n)) * \
        rng.choice([1.0, 1 + 2.0 ** -52], size=(T, n))
    on = rng.random((T, n)) < 0.6
    Am = np.where(on, Am, 0.0)
    T1, AW = eta * Xm, Am @ W.T
    mid = T1 + AW
    S = np.abs(T1) + np.abs(Am) @ np.abs(W).T
    layer = SimpleNamespace(eta=eta, W=W)
    err = _midpoint_error(Xm, AW, mid, Am, on, _writers(on, W), layer, S, n + 1)
    loose = rounding(S, n + 1)
    for t in range(T):
        for c in range(D):
            exact = Fraction(eta) * Fraction(float(Xm[t, c])) + sum(
                Fraction(float(W[c, k])) * Fraction(float(Am[t, k])) for k in range(n))
            gap = abs(exact - Fraction(float(mid[t, c])))
            assert Fraction(float(err[t, c])) >= gap
            if err[t, c] != loose[t, c]:
                assert Fraction(float(err[t, c])) == gap
