"""Where the runtime proofs call a sum exact (docs/numerics.md#proofs-for-reduced-precision-
runtimes). Linear maps (``runtime_boxes.linear``): where X Wᵀ + b is called exact, every float32
evaluation of the test's own (each order of the terms, with and without a fused multiply-add)
of every stored value of the boxes tried (their ends, the powers of two inside, random values)
gives exactly the rational value; everywhere, the midpoint ± spread + rounding holds every
evaluation. Scores (``runtime_attention.scores_box``): the sum is judged before 1/τ divides it."""

from __future__ import annotations

from fractions import Fraction
from itertools import permutations
from types import SimpleNamespace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from exactformer.verification.formats import get_format
from exactformer.verification.runtime_attention import Context, scores_box
from exactformer.verification.runtime_boxes import Weights, linear

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
