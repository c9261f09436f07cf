"""Exactness per coordinate in the float64 enclosures (evaluate/enclosure.py): a unit that
reads only coordinates of radius 0 has an exact pre-activation when no evaluation rounds it,
an output written only from such inputs is exact, and a unit reading only exact zeros is
its bias, and an output whose affine piece is constant on the box is exact where the float
evaluation at the midpoint is. Checked against the exact evaluation, in Fractions, at points
of every box: rows mix exact and uncertain coordinates, zeros, tiny radii (2^-1022-sized,
what a reset leaves) and the extreme parameters of test_enclosure.py."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_enclosure import head, random_ffs, transformer

from exactformer import Dataset, verify
from exactformer.evaluate import enclose, enclosure
from exactformer.model import FF, SA, Block

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow], max_examples=150)
RADII = [0.0, 0.0, 0.0, 2.0 ** -1020, 2.0 ** -30, 1e-9, 0.5]


@st.composite
def boxes(draw, d: int):
    """1 to 4 rows of d coordinates (zeros, small dyadics, arbitrary floats), each with its
    own radius, most of them 0."""
    n = draw(st.integers(1, 4))
    coord = st.one_of(st.just(0.0), st.just(0.0), st.integers(-4, 4).map(float),
                      st.floats(-4, 4, allow_nan=False, allow_infinity=False))
    X = np.array([[draw(coord) for _ in range(d)] for _ in range(n)])
    r = np.array([[draw(st.sampled_from(RADII)) for _ in range(d)] for _ in range(n)])
    return X, r


def points(X, r, draw) -> list[list[Fraction]]:
    """Exact points of each row's box: its centre, and a corner or an inner dyadic point."""
    out = []
    for x, rad in zip(X.tolist(), r.tolist(), strict=True):
        out.append([Fraction(v) for v in x])
        t = [Fraction(draw(st.sampled_from([-1, 1, 0, 1, -1]))) /
             draw(st.sampled_from([1, 1, 2, 3])) for _ in x]
        out.append([Fraction(v) + s * Fraction(e) for v, s, e in zip(x, t, rad, strict=True)])
    return out


def exact_ff(ff, x: list[Fraction]) -> tuple[list[Fraction], list[Fraction]]:
    """(pre-activations, output) of η·x + W·relu(U·x + b), exactly."""
    U, b, W = (np.asarray(a).tolist() for a in (ff.U, ff.b, ff.W))
    z = [sum((Fraction(u) * v for u, v in zip(row, x, strict=True)), Fraction(0)) +
         Fraction(bk) for row, bk in zip(U, b, strict=True)]
    h = [max(v, Fraction(0)) for v in z]
    eta = Fraction(float(ff.eta))
    out = [eta * x[c] + sum((Fraction(w) * v for w, v in zip(W[c], h, strict=True)),
                            Fraction(0)) for c in range(len(x))]
    return z, out


@settings(**SETTINGS)
@given(d=st.integers(2, 4), data=st.data())
def test_every_exact_point_is_in_its_box(d, data):
    """ff_dense's boxes, and maybe_on's verdicts, hold at every exact point sampled from
    the input boxes (finite parameters and values only: the rest is test_enclosure's)."""
    X, r = data.draw(boxes(d))
    ff = data.draw(random_ffs(d, False, sorted({float(v) for v in X.flat})))
    if not all(np.isfinite(np.asarray(a, dtype=float)).all() for a in (ff.U, ff.b, ff.W)):
        return
    with np.errstate(all="ignore"):
        out, rad = enclosure.ff_dense(X, r, float(ff.eta), ff.U, ff.b, ff.W)
        on = enclosure.maybe_on(X, r, ff.U, ff.b)
    for i, x in enumerate(points(X, r, data.draw)):
        z, want = exact_ff(ff, x)
        row = i // 2
        assert all(on[row, k] for k, v in enumerate(z) if v > 0)
        for c, v in enumerate(want):
            if np.isfinite(out[row, c]) and np.isfinite(rad[row, c]):
                assert abs(Fraction(out[row, c]) - v) <= Fraction(rad[row, c]), (row, c)


def test_a_unit_reading_exact_zeros_is_its_bias():
    """A snapped pair's units read the snap coordinate, an exact 0 (radius 0) at every row
    it does not move, beside coordinates with radii: maybe_on gives b > 0 there, where the
    generic bound (its 2^-1022 slack) would leave relu(2s) undecided; any radius or nonzero
    value on a coordinate it reads sends the unit back to the bound."""
    X = np.array([[0.0, 3.0], [0.0, 3.0], [2.0 ** -60, 3.0]])
    r = np.array([[0.0, 1e-9], [2.0 ** -1020, 1e-9], [0.0, 0.0]])
    U = np.array([[2.0, 0.0], [2.0, 0.0], [0.0, 1.0], [2.0, 0.0]])
    b = np.array([0.0, -2.0, -3.0, np.nan])
    on = enclosure.maybe_on(X, r, U, b)
    assert on[0].tolist() == [False, False, True, True]  # 0, −2 exactly; 3 ± 1e-9 − 3
    # undecided; a nan bias may be on
    assert on[1, 0] and on[2, 0]  # a radius, or a value, on what unit 0 reads
    assert on[2, 2]  # 3 − 3 = 0, but only exact zeros skip the bound's slack


def test_an_average_of_exact_zeros_is_exactly_zero():
    """A collapse (ρ = 0, V = I + p·qᵀ) over rows whose column 1 is exactly 0 while column 0
    carries radii: column 1 of every output is exactly 0 (β·0 + 0·(q·avg), whatever the
    weights), with radius 0, where it used to take the sum's 2^-1022 slack; column 0 keeps
    a radius. A nonzero p there gives column 1 the radius of q·avg."""
    for p1, zero in ((0.0, True), (0.5, False)):
        sa = SA(0.0, heads=[head(0.0, [0.0, 0.0], [0.0, 0.0], 1.0, [0.0, p1], [1.0, 0.0])])
        model = transformer([Block(None, sa)], d=2)
        xs = [np.array([[1.0, 0.0], [3.0, 0.0]])]
        out, rad = enclose(model, xs, [np.array([[1e-9, 0.0], [2e-9, 0.0]])])
        assert (rad[0][:, 0] > 0).all()
        assert ((rad[0][:, 1] == 0) & (out[0][:, 1] == 0)).all() == zero


def test_a_bias_times_a_weight_that_underflows_keeps_its_radius():
    """W·relu(b) with b = W = 2^-1074 is exactly 2^-2148, which float64 rounds to 0: the
    output box must still hold it, and a model that then scales it up by 2^2200 must not be
    enclosed at 0 ± 0 (a reviewer's attack on a rule that read W·b in float64)."""
    tiny = 2.0 ** -1074
    out, rad = enclosure.ff_dense(np.array([[0.0]]), np.zeros((1, 1)), 0.0,
                                  np.array([[0.0]]), np.array([tiny]), np.array([[tiny]]))
    assert abs(Fraction(out[0, 0]) - Fraction(tiny) ** 2) <= Fraction(rad[0, 0])
    assert rad[0, 0] > 0
    blocks = [Block(FF(0.0, np.zeros((1, 2)), np.array([tiny]), np.array([[tiny], [0.0]])))]
    for s in (2.0 ** 1000, 2.0 ** 1000, 2.0 ** 200):  # x0 ↦ x0 + relu(s·x0): 2^-2148 → 2^52
        blocks.append(Block(FF(1.0, np.array([[s, 0.0]]), np.array([0.0]),
                               np.array([[1.0], [0.0]]))))
    X = np.array([[1.0, 1.0]])
    data = Dataset.from_arrays([X], [np.array([[0.0, 0.0]])])
    assert verify(transformer(blocks, d=2), data).verdict() == "FAILED"


def test_a_carrier_with_a_radius_keeps_the_column_it_writes_uncertain():
    """V = I + p·qᵀ with p = e_1 and q = e_0: column 1 (exact zeros) gains q·avg, the
    average of column 0, which carries radii; its boxes must hold the exact average at the
    corners of the inputs' boxes (an exact column 1 would hide it)."""
    sa = SA(1.0, heads=[head(0.0, [0.0, 0.0], [0.0, 0.0], 1.0, [0.0, 1.0], [1.0, 0.0])])
    model = transformer([Block(None, sa)], d=2)
    X = np.array([[1.0, 0.0], [1.0 / 3.0, 0.0], [2.0, 0.0]])
    r = np.array([[1e-9, 0.0], [0.0, 0.0], [2e-9, 0.0]])
    out, rad = (a[0] for a in enclose(model, [X], [r]))
    for signs in ((1, 1, 1), (-1, -1, -1), (1, 0, -1)):
        x0 = [Fraction(v) + s * Fraction(e) for v, s, e in zip(X[:, 0], signs, r[:, 0],
                                                                strict=True)]
        mean = sum(x0, Fraction(0)) / 3  # hardmax with equal scores: every row's average
        for i in range(3):
            assert abs(Fraction(out[i, 1]) - mean) <= Fraction(rad[i, 1])
    assert (rad[:, 1] > 0).all()


@st.composite
def cancelling_ffs(draw, d: int) -> FF:
    """A residual layer whose units read one or two coordinates with small dyadic or
    arbitrary weights, and write them back with weights that often cancel the identity
    (a clear x_c − relu(x_c), a flip, a pair): the constant pieces of the keyed models."""
    dyadic = st.sampled_from([1.0, -1.0, 2.0, -2.0, 0.5, -0.5])
    weight = st.one_of(dyadic, dyadic, st.just(0.0), st.sampled_from([3.0, 1 / 3, 0.1]))
    h = draw(st.integers(1, 4))
    U, W = np.zeros((h, d)), np.zeros((d, h))
    for k in range(h):
        for c in draw(st.lists(st.integers(0, d - 1), min_size=1, max_size=2, unique=True)):
            U[k, c] = draw(weight)
            W[c, k] = draw(st.sampled_from([-1.0, -1.0, 1.0])) / U[k, c] if U[k, c] else 0.0
        W[draw(st.integers(0, d - 1)), k] += draw(st.sampled_from([0.0, 0.0, 1.0]))
    b = np.array([draw(st.sampled_from([0.0, 0.0, -1.0, 1.0, -0.5, 2.0 ** -60]))
                  for _ in range(h)])
    return FF(draw(st.sampled_from([1.0, 1.0, 0.0])), U, b, W)


@settings(**SETTINGS)
@given(d=st.integers(2, 4), data=st.data())
def test_a_constant_piece_holds_its_exact_value(d, data):
    """Layers whose units cancel the identity on some output (J's row exactly 0 on the
    box's piece): the box holds the exact output at every sampled point, the rule that
    makes such an output exact included (a rounded pre-activation or weight, or a
    rounded sum at the midpoint, must keep its radius), at scales from 2^-980, where a flat
    piece's own bound beats the units' few 2^-1022, to 2^40."""
    X, r = data.draw(boxes(d))
    scale = data.draw(st.sampled_from([1.0, 8.0, 2.0 ** 40, 2.0 ** -980]))
    X, r = X * scale, r * max(scale, 1.0)
    ff = data.draw(cancelling_ffs(d))
    if scale < 1 and data.draw(st.booleans()):  # values and biases near the subnormals
        ff = FF(ff.eta, ff.U, ff.b * scale, ff.W)
    with np.errstate(all="ignore"):
        out, rad = enclosure.ff_dense(X, r, float(ff.eta), ff.U, ff.b, ff.W)
    for i, x in enumerate(points(X, r, data.draw)):
        _, want = exact_ff(ff, x)
        for c, v in enumerate(want):
            assert abs(Fraction(out[i // 2, c]) - v) <= Fraction(rad[i // 2, c]), (i, c)


def test_a_clear_of_a_positive_coordinate_is_exactly_zero():
    """x_c − relu(x_c) at x_c = 2 ± 10⁻⁹: the piece is constant 0 and the midpoint's float
    evaluation 2 − 2 is exact, so the output is 0 with radius 0 (not the few 2^-1022 that
    would leave the next unit reading it undecided at 0). The same clear through a
    rounded weight (3·x_c, then −x_c/3) keeps a radius."""
    X, r = np.array([[2.0, 1.0]]), np.array([[1e-9, 0.5]])
    for u, w, exact in ((1.0, -1.0, True), (2.0, -0.5, True), (3.0, -1 / 3, False)):
        out, rad = enclosure.ff_dense(X, r, 1.0, np.array([[u, 0.0]]), np.array([0.0]),
                                      np.array([[w], [0.0]]))
        assert (rad[0, 0] == 0) == exact and abs(out[0, 0]) <= rad[0, 0]
        assert rad[0, 1] == 0.5  # untouched: keeps its own radius


def test_a_constant_piece_with_a_rounded_pre_activation_keeps_its_radius():
    """x_0 + relu(x_0 + x_1) − relu(x_0 + x_1 + 2^-60) − relu(x_0) at x = (1, 2^-60): the
    piece is the constant −2^-60 (J's row is exactly 0), and the midpoint's float sum
    1 + 1 − 1 − 1 is exact, but both pre-activations x_0 + x_1 round to 1: the float
    output 0 is not the exact one, so the radius must cover 2^-60."""
    X, r = np.array([[1.0, 2.0 ** -60]]), np.zeros((1, 2))
    U, b = np.array([[1.0, 1.0], [1.0, 1.0], [1.0, 0.0]]), np.array([0.0, 2.0 ** -60, 0.0])
    W = np.array([[1.0, -1.0, -1.0], [0.0, 0.0, 0.0]])
    out, rad = enclosure.ff_dense(X, r, 1.0, U, b, W)
    assert out[0, 0] == 0.0
    assert Fraction(rad[0, 0]) >= Fraction(2) ** -60


def test_a_jacobian_that_only_rounds_to_zero_keeps_the_radius():
    """x_0 − relu(x_0 + 1) + relu(2^-60·x_0 + 1) on x_0 ∈ [−2^-70, 2^-70]: the midpoint's float
    evaluation 0 − 1 + 1 is exact, and J = 1 − 1 + 2^-60 rounds to 0 in float64, but the
    exact J is 2^-60: the output moves by 2^-130 over the box, which its radius must cover."""
    X, r = np.array([[0.0]]), np.array([[2.0 ** -70]])
    U, b = np.array([[1.0], [2.0 ** -60]]), np.array([1.0, 1.0])
    out, rad = enclosure.ff_dense(X, r, 1.0, U, b, np.array([[-1.0, 1.0]]))
    corner = Fraction(2) ** -70
    exact = corner - (corner + 1) + (Fraction(2) ** -60 * corner + 1)
    assert abs(Fraction(out[0, 0]) - exact) <= Fraction(rad[0, 0])


def test_a_flat_piece_never_replaces_a_midpoint_called_exact():
    """η = 0, w·relu(x + b_1) − w·relu(x + b_2) at x ≈ 2^-981 (both units on): the piece is
    flat (J = 0 = η·I) and constant, w·(b_1 − b_2). The units' midpoint sum is exact, and
    the flat piece's own evaluation fl(w·b_1 − w·b_2) rounds; near 2^-980 the flat rule's
    bound beats the units' few 2^-1022, so it used to replace the midpoint after the
    constant rule had called the cell exact (a reviewer's attack): radius 0 on a value one
    ulp off, scaled to a wrong OK by later layers."""
    w = float.fromhex("0x1.912265b1f6000p+0")
    b1, b2 = float.fromhex("0x1.6c78b8p-980"), float.fromhex("0x1.ec78b8p-980")
    U = np.array([[1.0], [1.0]] + [[0.0]] * 20)  # the off units raise the units' radius
    b = np.array([b1, b2] + [-1.0] * 20)
    W = np.array([[w, -w] + [0.0] * 20])
    out, rad = enclosure.ff_dense(np.array([[float.fromhex("0x1.270e9p-981")]]),
                                  np.array([[2.0 ** -990]]), 0.0, U, b, W)
    exact = Fraction(w) * (Fraction(b1) - Fraction(b2))
    assert abs(Fraction(out[0, 0]) - exact) <= Fraction(rad[0, 0])


@settings(**SETTINGS)
@given(w=st.integers(1, 2 ** 40), t=st.integers(1, 2 ** 20), a=st.integers(1, 8),
       off=st.integers(0, 24), scale=st.sampled_from([1.0, 2.0 ** -980]))
def test_opposite_twin_units_hold_their_constant(w, t, a, off, scale):
    """η = 0 and w·relu(x + b_1) − w·relu(x + b_2), w of 41 bits, x and the b_k of many bits
    but x + b_k = 2s and (2 + a/4)s of few (s the scale): the piece is flat and constant,
    the units' midpoint sum is exact and the flat piece's own w·b_1 − w·b_2 rounds. Near
    2^-980 the flat rule's bound wins; the box must hold w·(b_1 − b_2) either way."""
    wf = 1 + w * 2.0 ** -40
    x = scale * (1 - t * 2.0 ** -21)
    b1, b2 = 2 * scale - x, (2 + a / 4) * scale - x
    U = np.array([[1.0], [1.0]] + [[0.0]] * off)
    b = np.array([b1, b2] + [-1.0] * off)
    W = np.array([[wf, -wf] + [0.0] * off])
    out, rad = enclosure.ff_dense(np.array([[x]]), np.array([[scale * 2.0 ** -10]]), 0.0,
                                  U, b, W)
    exact = Fraction(wf) * (Fraction(b1) - Fraction(b2))
    assert abs(Fraction(out[0, 0]) - exact) <= Fraction(rad[0, 0])


@settings(**SETTINGS)
@given(d=st.integers(2, 4), data=st.data())
def test_a_residual_layer_on_some_columns_holds_every_point(d, data):
    """ff_dense_into, which looks only at the columns a residual layer reads or writes and
    skips rows whose units are off (rows reading only exact zeros are off by their biases
    alone when every bias is ≤ 0): the boxes hold the exact output at sampled points, on
    rows mixing exact zeros with other values and with biases of either sign."""
    X, r = data.draw(boxes(d))
    ff = data.draw(st.one_of(cancelling_ffs(d),
                             random_ffs(d, False, sorted({float(v) for v in X.flat}))))
    if not all(np.isfinite(np.asarray(a, dtype=float)).all() for a in (ff.U, ff.b, ff.W)):
        return
    U, W = np.asarray(ff.U, dtype=float), np.asarray(ff.W, dtype=float)
    wide = FF(1.0, np.hstack([U, np.zeros((len(U), 2))]), np.asarray(ff.b, dtype=float),
              np.vstack([W, np.zeros((2, W.shape[1]))]))
    Xw, rw = np.hstack([X, np.ones((len(X), 2))]), np.hstack([r, np.zeros((len(X), 2))])
    out, rad = Xw.copy(), rw.copy()
    with np.errstate(all="ignore"):
        enclosure.ff_dense_into(out, rad, 1.0, wide.U, wide.b, wide.W)
    for i, x in enumerate(points(Xw, rw, data.draw)):
        _, want = exact_ff(wide, x)
        for c, v in enumerate(want):
            if np.isfinite(out[i // 2, c]) and np.isfinite(rad[i // 2, c]):
                assert abs(Fraction(out[i // 2, c]) - v) <= Fraction(rad[i // 2, c]), (i, c)
