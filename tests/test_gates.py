"""Gated layers (evaluate/gates.py): FF layers whose units can only be on at the rows that
hold their key are applied to those rows alone. Checked against an evaluator written here
(every unit of every layer on every row, in Fractions): the exact pass equals it, the float64
pass equals a plain float64 pass, and the enclosure's boxes hold it, on rows of every kind:
keys of the layer's units, other keys, zero keys, no keys, radii on the key, non-finite
values, and units that fire off their own key (which the gate must see and not skip)."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exactformer.evaluate import Arithmetic, enclose, forward, gates
from exactformer.evaluate.gates import _most_frequent, gate_layers
from exactformer.evaluate.jobs import Job
from exactformer.evaluate.keys import pack
from exactformer.evaluate.state import RowState
from exactformer.model import FF, Block, Transformer

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])


def reference(blocks: list[Block], X: np.ndarray) -> list[list[Fraction]]:
    """Every FF of ``blocks`` on every row, in Fractions: x + Σ_k W_k·relu(U_k·x + b_k)."""
    rows = [[Fraction(v) for v in row] for row in X.tolist()]
    for blk in blocks:
        ff = blk.ff
        U, b, W = ([[Fraction(v) for v in r] for r in np.atleast_2d(a).tolist()]
                   for a in (ff.U, ff.b[None, :], ff.W))
        out = []
        for x in rows:
            z = [max(sum((u * v for u, v in zip(Uk, x, strict=True)), Fraction(0)) + bk, 0)
                 for Uk, bk in zip(U, b[0], strict=True)]
            out.append([xi + sum((Wi[k] * z[k] for k in range(len(z))), Fraction(0))
                        for xi, Wi in zip(x, W, strict=True)])
        rows = out
    return rows


@st.composite
def gated_model(draw):
    """A stack of gated layers on one key Q (q coordinates, w nonzero entries per unit,
    scale g on the rows' keys) with rest columns R, and rows of every kind."""
    q = draw(st.integers(2, 4))
    w = draw(st.integers(2, q))
    r = draw(st.integers(0, 3))
    D = q + r + 1  # the last coordinate: what the units write besides the key
    g = draw(st.sampled_from([1.0, 4.0, 0.5]))
    words = [np.array(t) for t in np.ndindex(*(3,) * q)]
    words = [t - 1 for t in words if np.count_nonzero(t - 1) == w]
    blocks = []
    for _ in range(draw(st.integers(1, 3))):
        h = draw(st.integers(1, 4))
        U, b, W = np.zeros((h, D)), np.zeros(h), np.zeros((D, h))
        for k in range(h):
            sigma = words[draw(st.integers(0, len(words) - 1))]
            kappa = draw(st.sampled_from([1.0, 2.0, 0.25]))
            U[k, :q] = kappa * sigma
            U[k, q:q + r] = [draw(st.integers(-3, 3)) for _ in range(r)]
            # most biases keep every other key off (quiet), some do not (loud)
            b[k] = -kappa * g * w + draw(st.sampled_from([1.0, 0.5, 1.0, kappa * g + 2.0,
                                                          -20.0]))
            W[:, k] = [draw(st.integers(-2, 2)) * 0.5 for _ in range(D)]
            if draw(st.booleans()):
                W[:q, k] = -sigma * g  # the key turns itself off, as a move does
        blocks.append(Block(FF(1.0, U, b, W), None))
    rows = []
    for _ in range(draw(st.integers(1, 12))):
        kind = draw(st.sampled_from(["own", "other", "zero", "no key"]))
        x = np.zeros(D)
        if kind == "own":
            k = draw(st.integers(0, len(blocks[0].ff.b) - 1))
            x[:q] = np.sign(blocks[0].ff.U[k, :q]) * g
        elif kind == "other":
            x[:q] = words[draw(st.integers(0, len(words) - 1))] * g
        elif kind == "no key":
            x[:q] = [draw(st.integers(-4, 4)) * 0.25 for _ in range(q)]
        x[q:q + r] = [draw(st.integers(0, 2)) * 0.5 for _ in range(r)]
        x[-1] = draw(st.integers(-3, 3))
        rows.append(x)
    return blocks, np.array(rows), q


@settings(max_examples=80, **SETTINGS)
@given(gated_model(), st.data())
def test_gated_passes_equal_every_unit_on_every_row(case, draws):
    """The exact pass equals the evaluator above; the float64 pass equals a plain float64
    pass (every value here is a small dyadic, so every float sum is exact); the enclosure
    holds the exact value, also with radii on some rows (on the key too)."""
    blocks, X, q = case
    model = Transformer(d=X.shape[1], attention="hardmax", blocks=blocks, exact=False)
    want = reference(blocks, X)
    xs = np.split(X, draws.draw(st.sampled_from([[], [len(X) // 2]])))
    xs = [x for x in xs if len(x)]
    exact = np.concatenate(forward(model, xs, arithmetic="exact", workers=1))
    assert [[Fraction(v) for v in row] for row in exact.tolist()] == want
    plain = np.concatenate(forward(model, xs, arithmetic="float"))
    assert np.array_equal(plain, np.array([[float(v) for v in row] for row in want]))
    radii = [np.where(np.array([draws.draw(st.booleans()) for _ in range(x.size)])
                      .reshape(x.shape), 2.0 ** -30, 0.0) for x in xs]
    out, rad = enclose(model, xs, radii)  # X is in its box: its value is in the output's
    out, rad = np.concatenate(out), np.concatenate(rad)
    for i, row in enumerate(want):
        for j, v in enumerate(row):
            assert abs(Fraction(out[i, j]) - v) <= Fraction(rad[i, j])


def test_only_the_rows_of_the_units_keys_are_evaluated():
    """Among 2 000 rows, a move-like layer (a key on four coordinates, a signature and
    `one` as its rest) evaluates the three rows that hold its units' keys and the row that
    is no key, and leaves the others, which it keeps off, untouched."""
    rng = np.random.default_rng(0)
    q, D = 4, 8  # key 0..3, signature 4..5, one 6, written 7
    U = np.zeros((3, D))
    U[0, :q], U[1, :q], U[2, :q] = [1, 1, 0, 0], [0, 1, -1, 0], [1, 0, 0, -1]
    U[:, 4:6] = [[256, 0], [0, -256], [128, 128]]
    U[:, 6] = [-300, -10, -200]
    b = np.array([-1.0, -1.0, -1.0])
    W = np.zeros((D, 3))
    W[7] = [1, 2, 3]
    ff = FF(1.0, U, b, W)
    gate, = gate_layers([ff])
    assert gate is not None and list(gate.Q) == [0, 1, 2, 3] and gate.w == 2
    words = [np.array(t) - 1 for t in np.ndindex(3, 3, 3, 3)]
    words = [t for t in words if np.count_nonzero(t) <= 2]
    X = np.zeros((2000, D))
    X[:, :q] = np.array(words)[rng.integers(0, len(words), 2000)]
    X[:, 4:6] = rng.integers(0, 5, (2000, 2)) / 8  # signatures in [0, 1/2]
    X[:, 6] = 1.0
    own = np.isin(pack(X[:, :q].astype(np.int64)), gate.codes) & \
        (np.count_nonzero(X[:, :q], axis=1) == 2)
    X[5, :q] = [0.5, 1, 0, 0]  # no key
    st_ = RowState([X], Arithmetic("float"))
    rows = gate.rows(st_)
    assert rows is not None
    assert set(rows.tolist()) == set(np.flatnonzero(own).tolist()) | {5}
    want = reference([Block(ff, None)], X)
    got = forward(Transformer(d=D, attention="hardmax", blocks=[Block(ff, None)],
                              exact=False), [X])[0]
    assert [[Fraction(v) for v in row] for row in got.tolist()] == want


def test_a_unit_that_fires_off_its_own_key_makes_its_rows_evaluated():
    """A unit whose bias lets another key's rows reach above 0 (κ·g·(w − 1) + b > 0) is
    loud at that scale: the gate hands the rows of that scale to the dense evaluation, and
    the other key's row takes the unit's write, as the reference says."""
    U = np.array([[1.0, 1.0, 0.25, 0.0]])  # key 0..1, rest 2
    b = np.array([-1.5])  # at key (1, −1): 0 − 1.5 < 0; at 2·(1, 0): 2 − 1.5 > 0
    W = np.array([[0.0], [0.0], [0.0], [1.0]])
    ff = FF(1.0, U, b, W)
    X = np.array([[2.0, 0.0, 0.0, 0.0], [1.0, -1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 5.0]])
    gate, = gate_layers([ff])
    assert gate is not None and gate.w == 2 and list(gate.R) == [2]
    rows = gate.rows(RowState([X], Arithmetic("float")))
    assert rows is None or 0 in rows.tolist()
    model = Transformer(d=4, attention="hardmax", blocks=[Block(ff, None)], exact=False)
    got = forward(model, [X], arithmetic="exact", workers=1)[0]
    assert [[Fraction(v) for v in row] for row in got.tolist()] == reference([Block(ff)], X)
    assert got[0, 3] == 0.5


def test_a_radius_on_the_key_is_charged_to_every_other_unit():
    """A row whose key carries a radius ρ reaches κ·w·ρ higher at another unit: at ρ = 3/4
    the unit is on at the box's corner though off at its centre, and the enclosure holds the
    value of every point of the box."""
    U = np.array([[1.0, 1.0, 0.25, 0.0], [1.0, -1.0, 0.0, 0.0]])
    b = np.array([-1.5, -1.5])
    W = np.array([[0.0, 0.0], [0.0, 0.0], [0.0, 0.0], [1.0, 1.0]])
    ff = FF(1.0, U, b, W)
    assert gate_layers([ff])[0] is not None
    model = Transformer(d=4, attention="hardmax", blocks=[Block(ff, None)], exact=False)
    X = np.array([[1.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]])  # unit 0's key; weight 1
    X[0, 2] = 1.0  # (unit 0 on at its key: a class of its own)
    for rho in (2.0 ** -20, 0.75):
        radii = np.zeros_like(X)
        radii[1, :2] = rho
        out, rad = enclose(model, [X], [radii])
        corner = X[1] + np.array([rho, rho, 0, 0])  # unit 0 at 1 + 2ρ − 3/2
        exact = reference([Block(ff)], corner[None, :])[0]
        assert exact[3] == max(2 * Fraction(rho) - Fraction(1, 2), 0)
        assert abs(Fraction(out[0][1, 3]) - exact[3]) <= Fraction(rad[0][1, 3])


def test_moved_and_unmoved_rows_are_bounded_apart():
    """Rows the construction moved (zeros on the rest) and rows it has not (`one` = 1 and a
    signature) are kept in classes apart: a box over both would reach above 0 where neither
    does, and every row would be evaluated."""
    U = np.array([[1.0, 1.0, -300.0, 256.0, 0.0]])  # key 0..1, one 2, signature 3
    b = np.array([-1.0])
    W = np.zeros((5, 1))
    W[4, 0] = 1.0
    ff = FF(1.0, U, b, W)
    X = np.array([[0.0, 0.0, 1.0, 1.0, 0.0],  # not keyed, one = 1, signature 1: −45
                  [0.0, 0.0, 0.0, 0.0, 0.0],  # moved: −1
                  [1.0, 1.0, 1.0, 0.5, 0.0]])  # its key: 2 − 300 + 128 − 1 < 0 as well
    gate, = gate_layers([ff])
    rows = gate.rows(RowState([X], Arithmetic("float")))
    assert rows is not None and rows.tolist() == [2]


def test_classes_follow_the_rows_a_layer_changed_and_bound_their_largest_values():
    """Two gated layers on one key: the first writes a rest coordinate of its own key's
    row, which turns the second layer's unit on there off its key; and two rows of one
    class (the same key scale and weight, nonzero on the same rest columns) differ in a
    signature that turns that unit on at one of them alone. Both rows must be evaluated."""
    # a second unit in each layer, always off, so that no layer is a ridge window
    U1 = np.array([[1.0, 1.0, 0.125, 0.0, 0.0], [-1.0, -1.0, 0.0, 0.0, 0.0]])
    U2 = np.array([[1.0, -1.0, 0.5, 4.0, 0.0], [-1.0, 1.0, 0.0, 0.0, 0.0]])
    W1, W2 = np.zeros((5, 2)), np.zeros((5, 2))
    W1[3, 0] = W2[4, 0] = 1.0
    blocks = [Block(FF(1.0, U1, np.array([-1.25, -5.0]), W1), None),
              Block(FF(1.0, U2, np.array([-1.5, -5.0]), W2), None)]
    X = np.array([[1.0, 1.0, 0.0, 0.0, 0.0],  # layer 1's key: col 3 becomes 3/4
                  [1.0, 0.0, 2.0, 0.0, 0.0],  # key (1, 0), signature 2: layer 2 on
                  [1.0, 0.0, 0.5, 0.0, 0.0],  # signature 1/2: layer 2 off
                  *([0.0, 0.0, 0.0, 0.0, k] for k in range(5))])  # quiet: no key
    want = reference(blocks, X)
    assert [row[4] for row in want[:3]] == [Fraction(3, 2), Fraction(1, 2), 0]
    model = Transformer(d=5, attention="hardmax", blocks=blocks, exact=False)
    assert all(g is not None for g in Job.of(model, Arithmetic("float"), None).gates)
    for arithmetic in ("exact", "float"):
        got = forward(model, [X], arithmetic=arithmetic, workers=1)[0]
        assert [[Fraction(v) for v in row] for row in got.tolist()] == want
    out, rad = enclose(model, [X], None)
    assert all(abs(Fraction(o) - v) <= Fraction(r) for o_row, r_row, w_row in
               zip(out[0], rad[0], want, strict=True)
               for o, r, v in zip(o_row, r_row, w_row, strict=True))


def test_layers_share_a_key_only_where_none_reads_it_as_its_rest():
    """Layers share the union of their keys' coordinates, except a layer that reads one of
    them with another weight: it keeps its own key, and that column stays in its rest."""
    a = FF(1.0, np.array([[1.0, 1.0, 0.0, 0.0, 0.5], [1.0, -1.0, 0.0, 0.0, 0.5]]),
           np.array([-1.0, -1.0]), np.zeros((5, 2)))
    b = FF(1.0, np.array([[0.0, 3.0, 1.0, 1.0, 0.5], [0.0, 0.0, 1.0, -1.0, 0.5]]),
           np.array([-1.0, -1.0]), np.eye(5)[:, :2])
    ga, gb = gate_layers([a, b])
    assert list(ga.Q) == [0, 1, 2, 3] and list(ga.R) == [4]
    assert list(gb.Q) == [2, 3] and list(gb.R) == [1, 4]
    X = np.array([[0.0, 1.0, 1.0, 1.0, 0.0], [0.0, 0.0, 1.0, 1.0, 0.0],
                  *([0.0, 0.0, 0.0, 0.0, k] for k in range(4))])
    model = Transformer(d=5, attention="hardmax", blocks=[Block(a), Block(b)], exact=False)
    got = forward(model, [X], arithmetic="exact", workers=1)[0]
    assert [[Fraction(v) for v in row] for row in got.tolist()] == \
        reference([Block(a), Block(b)], X)


def test_a_rational_model_beyond_float_range_is_gated_or_evaluated_exactly():
    """Rational parameters and rows beyond float64's range (a rest weight of 10^400,
    signatures of 10^-400 and 10^400 in the rows) are read as ±inf or rounded outward,
    never raise, and the exact pass still equals every unit on every row."""
    big = Fraction(10) ** 400
    U = np.array([[1, 1, 0, big, 0], [1, -1, 0, 2, 0]], dtype=object)
    U = np.vectorize(Fraction, otypes=[object])(U)
    b = np.array([Fraction(-1), Fraction(-1)], dtype=object)
    W = np.zeros((5, 2), dtype=object)
    W[:] = Fraction(0)
    W[4, 0], W[4, 1] = Fraction(1), Fraction(2)
    ff = FF(Fraction(1), U, b, W)
    assert gate_layers([ff])[0] is not None
    model = Transformer(d=5, attention="hardmax", blocks=[Block(ff, None)], exact=True)
    tiny = Fraction(1, 10 ** 400)
    X = np.array([[1, 1, 0, tiny, 0], [1, -1, 0, 0, 0], [0, 0, 1, tiny, 0], [0, 0, 0, big, 0],
                  *([0, 0, 0, 0, k] for k in range(1, 5))], dtype=object)
    X = np.vectorize(Fraction, otypes=[object])(X)
    got = forward(model, [X], arithmetic="exact", workers=1)[0]
    want = reference([Block(ff)], X)
    assert [[Fraction(v) for v in row] for row in got.tolist()] == want
    assert want[0][4] == 1 + big * tiny  # unit 0 at its key: 2 + 10^400·10^-400 − 1


def test_rationals_below_float64s_normal_range_make_no_gate():
    """A rational κ or rest weight that float64 rounds to 0 (or to a subnormal) loses more
    than the quiet bound's relative slack: such a layer is applied densely, and the exact
    and mpmath passes see the unit that is on (2^-980 − 2^-990 > 0 here; 2^-53 − 2^-55 with a
    rest weight of 2^-1076 on a value of 2^1023)."""
    def case(U, b, X):
        W = np.zeros((4, 2), dtype=object)
        W[:] = Fraction(0)
        W[3, 0] = W[3, 1] = Fraction(1)
        ff = FF(Fraction(1), np.array(U, dtype=object), np.array(b, dtype=object), W)
        model = Transformer(d=4, attention="hardmax", blocks=[Block(ff, None)], exact=True)
        want = reference([Block(ff)], np.array(X))
        assert want[0][3] > 0
        for arithmetic in ("exact", "mp"):
            got = forward(model, [np.array(X)], arithmetic=arithmetic, workers=1)[0]
            assert got[0][3] > 0
        got = forward(model, [np.array(X)], arithmetic="exact", workers=1)[0]
        assert [[Fraction(v) for v in row] for row in got.tolist()] == want

    k = Fraction(1, 2 ** 1080)
    case([[k, k, 0, 0], [k, 0, -k, 0]], [Fraction(-1, 2 ** 990), Fraction(-1, 2 ** 991)],
         [[2.0 ** 100, 0, 2.0 ** 100, 0], [0.0, 0, 0, 0], [0, 0, 0, 1.0]])
    k = Fraction(1, 2 ** 10)
    case([[k, k, 0, Fraction(1, 2 ** 1076)], [k, 0, -k, 0]], [-k - Fraction(1, 2 ** 55), -2 * k],
         [[1.0, 0, 1, 2.0 ** 1023], [0, 0, 0, 0], [0, 0, 0, 1.0]])


def test_a_dense_layer_between_gates_refreshes_the_keys_of_the_rows_it_changed():
    """A dense layer that changes a few rows (a snapped pair, a reset) keeps the other rows'
    keys and classes (evaluate/layers.py), so it must refresh those of the rows it changed:
    here it gives one row of 400 the key of the gate after it, whose unit must then fire
    there, as the reference says, in the float pass and in the enclosure."""
    q, D = 3, 6  # key 0..2, `one` 3, trigger 4, written 5
    U = np.zeros((2, D))
    U[0, :q], U[1, :q] = [4, 4, 0], [0, 4, -4]
    U[:, 3] = [-1.0, -1.0]  # at its own key 8 − 1 − 6 = 1, at another at most −3
    gated = FF(1.0, U, np.array([-6.0, -6.0]), np.outer(np.eye(D)[5], [1.0, 2.0]))
    Ut = np.zeros((2, D))
    Ut[0, 4], Ut[1, 4] = 1.0, -1.0  # the trigger's two signs: no ridge window
    Wt = np.zeros((D, 2))
    Wt[:q, 0] = [1, 1, 0]  # relu(trigger) writes unit 0's key
    dense = FF(1.0, Ut, np.zeros(2), Wt)
    blocks = [Block(gated), Block(dense), Block(gated)]
    model = Transformer(d=D, attention="hardmax", blocks=blocks, exact=False)
    job = Job.of(model, Arithmetic("float"), None)
    assert job.gates[0] is not None and job.gates[1] is None and job.keys[1] is None
    X = np.zeros((400, D))
    X[:, 3] = 1.0
    X[7, 4] = 1.0  # the one row the dense layer moves
    X[::3, :q] = [0, 1, -1]  # unit 1's key at a third of the rows
    want = reference(blocks, X)
    assert want[7][5] == 1 and want[0][5] == 4  # the new key's unit, the other's twice
    got = forward(model, [X])[0]
    assert [[Fraction(v) for v in row] for row in got.tolist()] == want
    out, rad = enclose(model, [X], None)
    assert all(abs(Fraction(o) - v) <= Fraction(r) for o_row, r_row, w_row in
               zip(out[0], rad[0], want, strict=True)
               for o, r, v in zip(o_row, r_row, w_row, strict=True))
    assert out[0][7, 5] == 1.0


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 6).flatmap(lambda w: st.integers(1, 8).flatmap(lambda d: st.lists(
    st.lists(st.sampled_from([0.0, 0.0, 0.5, 1.0, 2.0, 3.0, 2.0 ** -1000, 2.0 ** 1000]),
             min_size=d, max_size=d), min_size=w, max_size=w))))
def test_a_units_kappa_is_its_most_frequent_weight_in_floats_and_in_rationals(rows):
    """κ per unit, read from float weights all at once, is what the rationals' count by
    count gives: the most frequent nonzero |weight|, the smallest of equally frequent ones,
    None where a unit reads nothing."""
    A = np.array(rows)
    got = _most_frequent(A)
    assert A.size * A.shape[1] <= gates.COUNT_AT_ONCE  # (the float count ran)
    want = _most_frequent(np.array([[Fraction(v) for v in row] for row in rows], dtype=object))
    assert (got is None) == (want is None)
    if got is not None:
        assert [Fraction(v) for v in got] == list(want)
