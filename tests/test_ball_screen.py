"""The ball pass's float64 screen: every sign it decides holds on the whole ball, checked in
Fractions; and forced onto small keyed softmax models it proves no model the ball pass alone
would refuse, nor a perturbed one that is no longer exact."""

from fractions import Fraction

import mpmath
import numpy as np
import pytest
from conftest import datasets
from flint import arb, arb_mat, ctx, fmpq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_certify import _number_paths, perturbed

import exactformer as ef
from exactformer.evaluate.jacobians import flag_patterns
from exactformer.model import FF, SA, Block, ScoreMatrix, Transformer, ValueMatrix
from exactformer.modelio import model_to_dict
from exactformer.verification import balls
from exactformer.verification.ball_screen import LayerScreen, token_boxes
from exactformer.verification.balls import Layers, Run, as_ball
from exactformer.verification.certify import prove


def mp_gap(model, data, dps: int = 60):
    """Max Hausdorff distance (max-norm) of an mpmath pass at ``dps`` digits from the targets
    zero-padded to the model's width: an evaluation independent of the proof."""
    xs, ys = data.fractions()
    worst = mpmath.mpf(0)
    with mpmath.workdps(dps):
        for out, y in zip(ef.forward(model, xs, "mp", dps=dps), ys, strict=True):
            y = [[mpmath.mpf(t.numerator) / t.denominator for t in row] +
                 [0] * (model.d - len(row)) for row in y]
            D = [[max(abs(o - t) for o, t in zip(row, yy, strict=True)) for yy in y]
                 for row in out]
            worst = max([worst] + [min(r) for r in D] + [min(c) for c in zip(*D, strict=True)])
    return worst


def exact(x: arb) -> Fraction:
    """An exact arb (an endpoint) as a Fraction: m·2^e."""
    m, e = x.man_exp()
    return Fraction(int(m)) * Fraction(2) ** int(e)


def ends(e: arb) -> tuple[Fraction, Fraction]:
    """The ball's exact ends, mid ∓ rad (arb's lower() and upper() round outward at the
    working precision)."""
    mid, rad = exact(e.mid()), exact(e.rad())
    return mid - rad, mid + rad


numbers = st.one_of(
    st.just(Fraction(0)), st.integers(-9, 9).map(Fraction),
    st.tuples(st.integers(-2 ** 20, 2 ** 20), st.integers(-70, 70)).map(
        lambda t: Fraction(t[0]) * Fraction(2) ** t[1]),
    st.tuples(st.integers(-50, 50), st.integers(1, 12)).map(lambda t: Fraction(t[0], 3 ** t[1])),
    st.integers(-3, 3).map(lambda k: Fraction(k) * Fraction(2) ** 900),
    st.integers(-9, 9).map(lambda k: Fraction(2 ** 60 + k)))
radii = st.one_of(st.just(Fraction(0)), st.integers(0, 80).map(lambda e: Fraction(2) ** -e),
                  st.integers(1, 10 ** 6).map(lambda k: Fraction(k, 7 ** 9)))


def ball(m: Fraction, r: Fraction) -> arb:
    """A ball of radius ≥ r (0: an exact number) about m rounded to 128 bits: midpoints that
    are no float64 number, exact or not."""
    saved, ctx.prec = ctx.prec, 128
    try:
        mid = arb(fmpq(m.numerator, m.denominator)).mid()
        return mid if r == 0 else arb(mid, float(r))
    finally:
        ctx.prec = saved


@st.composite
def screens(draw):
    """A layer's rows and biases, and balls whose midpoints and radii are drawn apart; a
    bias may put a unit's zero exactly at a corner of the first ball."""
    d, n, w = draw(st.integers(2, 5)), draw(st.integers(1, 6)), draw(st.integers(1, 4))
    balls_ = [[(draw(numbers), draw(radii)) for _ in range(d)] for _ in range(n)]
    F = [[draw(numbers) if draw(st.booleans()) else Fraction(0) for _ in range(d)]
         for _ in range(w)]
    vs = [arb_mat(d, 1, [ball(m, r) for m, r in row]) for row in balls_]
    corner = [ends(vs[0][j, 0])[draw(st.integers(0, 1))] for j in range(d)]
    b = [draw(st.one_of(numbers, st.just(-sum(f * c for f, c in zip(row, corner,
                                                                    strict=True)))))
         for row in F]
    return F, b, vs


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(screens())
def test_every_decided_sign_holds_on_the_whole_ball(case):
    F, b, vs = case
    d = len(F[0])
    m, R, ok = token_boxes(vs, d)
    reads = [object() if any(row) else None for row in F]
    screen = LayerScreen(F, b, reads)
    if not screen.usable:
        return
    signs = screen.signs(m[ok], R[ok])
    for v, s in zip([v for v, o in zip(vs, ok, strict=True) if o], signs, strict=True):
        box = [ends(v[j, 0]) for j in range(d)]
        for unit, sign in zip(screen.rows, s.tolist(), strict=True):
            f = F[unit]
            hi = sum(max(fj * lo_, fj * hi_) for fj, (lo_, hi_) in zip(f, box, strict=True))
            lo = sum(min(fj * lo_, fj * hi_) for fj, (lo_, hi_) in zip(f, box, strict=True))
            if sign == 1:
                assert lo + b[unit] > 0
            elif sign == 0:
                assert hi + b[unit] <= 0


@settings(max_examples=200, deadline=None)
@given(screens())
def test_boxes_contain_their_balls(case):
    _, _, vs = case
    d = vs[0].nrows()
    m, R, ok = token_boxes(vs, d)
    for v, mi, Ri, o in zip(vs, m, R, ok, strict=True):
        if not o:
            assert not all(np.isfinite([float(v[j, 0].mid()) for j in range(d)]))
            continue
        for j in range(d):
            lo, hi = ends(v[j, 0])
            assert Fraction(mi[j]) - Fraction(Ri[j]) <= lo and hi <= Fraction(mi[j]) + \
                Fraction(Ri[j])


def test_readings_clearly_above_or_below_zero_are_decided_on_and_off():
    v = arb_mat(2, 1, [arb(3) / 7, arb(2)])
    m, R, ok = token_boxes([v, arb_mat(2, 1, [arb(-3) / 7, arb(2)])], 2)
    screen = LayerScreen([[Fraction(1), Fraction(1, 3)]], [Fraction(-1, 2)], [object()])
    # 3/7 + 2/3 − 1/2 > 0 and −3/7 + 2/3 − 1/2 < 0, both by far more than any rounding
    assert ok.all() and screen.signs(m, R).tolist() == [[1], [0]]


def test_an_exact_zero_reading_is_decided_off():
    """A unit that reads an exactly-0 coordinate with bias 0 is off (relu(0) = 0): the
    keyed models' units on unused slots, which the screen must decide to be of any use."""
    v = arb_mat(3, 1, [arb(0), arb(1) / 3, arb(5)])
    m, R, ok = token_boxes([v], 3)
    assert ok.all() and R[0, 0] == 0 and R[0, 2] == 0 and R[0, 1] > 0
    screen = LayerScreen([[Fraction(1), 0, 0], [0, 0, Fraction(1, 5)], [0, 0, Fraction(1, 5)]],
                         [Fraction(0), Fraction(-2), Fraction(-1)], [object()] * 3)
    # 1/5 is no float64: 1/5·5 − 1 = 0 exactly is left undecided
    assert screen.signs(m, R).tolist() == [[0, 0, -1]]
    moved = LayerScreen([[Fraction(1), 0, 0]], [Fraction(1, 2 ** 1100)], [object()])
    assert not moved.usable  # a bias below float64's normal range: no screen


def test_a_sum_that_overflows_on_the_way_decides_nothing():
    """Readings −0.6·M, −0.6·M, 0.7·M, 0.7·M (M the largest float64) add up to 0.2·M > 0;
    a float sum that adds the two negatives first overflows to −inf, and −inf ≤ −inf must
    not make the unit certainly off."""
    M = Fraction(float(np.finfo(float).max))
    row = [-M * Fraction(6, 10), -M * Fraction(6, 10), M * Fraction(7, 10), M * Fraction(7, 10)]
    screen = LayerScreen([row] * 3, [Fraction(0)] * 3, [object()] * 3)
    m, R, ok = token_boxes([arb_mat(4, 1, [arb(1)] * 4)], 4)
    assert screen.usable and ok.all() and (screen.signs(m, R) != 0).all()


def test_no_proof_of_a_model_whose_unit_sum_overflows_in_float64(screen_min):
    """End to end, with the screen on: a unit that reads a sum which overflows in float64
    but is positive moves x5, so the outputs are not the zero targets."""
    M, z, d = Fraction(float(np.finfo(float).max)), Fraction(0), 5
    big = [-M * Fraction(6, 10), -M * Fraction(6, 10), M * Fraction(7, 10), M * Fraction(7, 10)]

    def obj(*rows):
        return np.array(rows, dtype=object)
    mix = SA(z, ScoreMatrix(z, obj(*[z] * d), obj(*[z] * d)),
             ValueMatrix(Fraction(1), obj(*[z] * d), obj(*[z] * d)))  # uniform average
    W1 = obj(*[[z] * 3 for _ in range(d)])
    W1[4, 0] = Fraction(2) ** -1000  # x5 += 2^-1000 · (x1 + … + x4) > 0
    # three units (a matrix product: BLAS adds the two negative readings first)
    read = FF(Fraction(1), obj(*[[Fraction(1)] * 4 + [z]] * 3), obj(z, z, z), W1)
    W2 = obj(*[[z, z] for _ in range(d)])
    W2[4] = [Fraction(1), Fraction(-1)]  # η = 0, a step on x5 that lands on exact points
    step = FF(z, obj([z] * 4 + [Fraction(1)], [z] * 4 + [Fraction(1)]),
              obj(Fraction(-1), Fraction(-2)), W2)
    model = Transformer(d, "softmax", [Block(None, mix), Block(read, None), Block(step, None)])
    data = ef.Dataset.from_arrays([[big + [Fraction(j + 1)], big + [Fraction(-j - 1)]]
                                   for j in range(4)], [[[z] * d]] * 4)
    counted = screen_min(0)
    assert not prove(model, data).proved and counted  # the screen ran on the read layer
    assert mp_gap(model, data) > 0.5  # independently: x5 is 1, not 0


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 12), st.sampled_from([1, 2, 61, 62, 63, 70]), st.data())
def test_flag_patterns_give_each_row_back(n, w, draw):
    """The screen's sign rows through ``flag_patterns``: every row is its pattern, and the
    patterns are distinct (codes up to 62 units, whole rows beyond)."""
    bits = draw.draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    signs = np.array([[(b >> (k % 2)) & 1 for k in range(w)] for b in bits],
                     dtype=np.int8).reshape(n, w)
    signs[:, -1] = [b % 2 for b in bits]  # the highest unit tells rows apart too
    patterns, which = flag_patterns(signs)
    assert np.array_equal(patterns[which], signs)
    assert len({p.tobytes() for p in patterns}) == len(patterns)


# ------------------------------------------------------------------------------ forced on
@pytest.fixture
def screen_min(monkeypatch):
    """Sets the fewest ball tokens a layer screens (0: every layer, however few; restored
    after the test) and returns a list that gets the count of signs the screen decides in
    each layer from then on."""
    monkeypatch.setattr(balls, "MIN_TOKENS", balls.MIN_TOKENS)
    signs, counted = LayerScreen.signs, []

    def counting(self, m, R):
        out = signs(self, m, R)
        counted.append(int((out >= 0).sum()))
        return out
    monkeypatch.setattr(LayerScreen, "signs", counting)

    def set_min(n):
        balls.MIN_TOKENS = n
        counted.clear()
        return counted
    return set_min


@settings(max_examples=8, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.tuples(st.integers(1, 4), st.integers(2, 4)).flatmap(
    lambda nd: datasets(N=nd[0], d=nd[1], max_pool=4)), st.sampled_from(["keyed", "paper"]))
def test_forced_screen_proves_what_the_ball_pass_proves(screen_min, data, construction):
    model = ef.compile(data, attention="softmax", construction=construction)
    counted = screen_min(0)
    screened = prove(model, data)
    screen_ran = bool(counted)
    screen_min(10 ** 9)
    alone = prove(model, data)
    assert screened.proved == alone.proved and screened.pairs == alone.pairs
    assert screen_ran or not any(b.sa is not None and not b.sa.is_identity()
                                 for b in model.blocks)  # (no ball without attention)
    assert screened.proved and mp_gap(model, data) < mpmath.mpf(10) ** -50


@pytest.mark.parametrize("eta", [Fraction(1, 2), Fraction(0), Fraction(1)])
def test_a_layer_with_every_unit_off_moves_its_tokens_unless_eta_is_1(screen_min, eta):
    """Every unit off leaves x ↦ η·x: the screen keeps a token only when η = 1."""
    screen_min(0)
    d = 2
    mix = SA(Fraction(0), ScoreMatrix(Fraction(1), np.array([Fraction(0)] * d, dtype=object),
                                      np.array([Fraction(0)] * d, dtype=object)),
             ValueMatrix(Fraction(1), np.array([Fraction(0)] * d, dtype=object),
                         np.array([Fraction(0)] * d, dtype=object)))
    off = FF(eta, np.array([[Fraction(1), Fraction(0)]], dtype=object),
             np.array([Fraction(-100)], dtype=object), np.array([[Fraction(5)], [Fraction(7)]],
                                                                dtype=object))
    model = Transformer(d, "softmax", [Block(None, mix), Block(off, None)])
    xs = [np.array([[Fraction(1), Fraction(2)], [Fraction(3), Fraction(-1)]], dtype=object)]
    outs = Run(Layers(model), 64).outputs(xs)
    with mpmath.workdps(60):
        want = ef.forward(model, xs, "mp", dps=60)[0]
        slack = mpmath.mpf(10) ** -50
        for tok, row in zip(outs[0], want, strict=True):
            v = as_ball(tok)
            for j in range(d):
                lo, hi = (mpmath.mpf(e.numerator) / e.denominator for e in ends(v[j, 0]))
                assert lo - slack <= row[j] <= hi + slack
        mixed = ef.forward(Transformer(d, "softmax", [Block(None, mix)]), xs, "mp", dps=60)[0]
        moved = abs(want[0][0] - mixed[0][0]) > 10 ** -3  # the ball would have to move too
        assert moved == (eta != 1)


@pytest.fixture(scope="module")
def keyed_small():
    data = ef.Dataset.from_arrays([[[0, 1], [2, 3], [4, 1]], [[2, 3], [5, 5]], [[4, 1]]],
                                  [[[1, 1], [0, 0]], [[7, 7]], [[0, 0]]])
    return data, model_to_dict(ef.compile(data, attention="softmax"))


@settings(max_examples=30, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.data(), st.sampled_from([Fraction(1, 10 ** 30), Fraction(-3, 10 ** 12),
                                   Fraction(1, 2 ** 60)]))
def test_forced_screen_proves_no_perturbed_model_that_is_not_exact(screen_min, keyed_small,
                                                                    draw, delta):
    data, doc = keyed_small
    counted = screen_min(0)
    paths = [p for p in _number_paths(doc["blocks"]) if "ff" in p]
    model = perturbed(doc, draw.draw(st.sampled_from(paths)), delta)
    proved = prove(model, data).proved
    assert sum(counted) > 0  # the screen decided signs
    if proved:
        assert mp_gap(model, data, 100) < mpmath.mpf(10) ** -80
