"""Window–flip pairs (evaluate/window_pairs.py, docs/numerics.md#window-flip-pairs): a tracking
pass encloses a tagging window and its flip only on the rows near the window. Every box is
checked against an exact evaluation written here, on stacks of pairs with other units beside
them, rows on both sides of the window's edge, slots below 0, radii, and near-forms that must
not be taken for pairs."""

from __future__ import annotations

from fractions import Fraction

import mpmath
import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from test_gates import reference
from test_verify_bounds import doc, ff, sa
from test_verify_bounds import reference as reference_mp

import exactformer as ef
from exactformer.evaluate import Arithmetic, enclose, window_pairs
from exactformer.evaluate.arithmetic import PassStats
from exactformer.evaluate.jobs import Job
from exactformer.model import FF, Block, Transformer
from exactformer.modelio import model_from_dict

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])
D_DATA, SLOTS, CODE = 3, (3, 4), 5  # columns: data 0..2, two slots, a code
D = 6


@pytest.fixture(autouse=True)
def pairs_on_any_rows(monkeypatch):
    """Pairs taken however few rows a pass holds (a pass skips them below PAIR_ROWS)."""
    monkeypatch.setattr(window_pairs, "PAIR_ROWS", 0)


def _window(u, b, omega, k):
    """The two window units on slot k: ω·relu(u·x + b) + ω·relu(−u·x − b)."""
    U, W = np.array([u, -np.asarray(u)]), np.zeros((D, 2))
    W[k] = omega
    return U, np.array([b, -b]), W


def _flip(k, one=1.0):
    """slot ← slot − relu(slot) + relu(one − slot) (one = 1: the flip)."""
    U, W = np.zeros((2, D)), np.zeros((D, 2))
    U[0, k], U[1, k], W[k, 0], W[k, 1] = 1.0, -1.0, -1.0, 1.0
    return U, np.array([0.0, one]), W


def _clip(k):
    """relu(16·slot − 4) − relu(16·slot − 12) into the code: reads the slot a window fills."""
    U, W = np.zeros((2, D)), np.zeros((D, 2))
    U[:, k] = 16.0
    W[CODE] = [0.125, -0.125]
    return U, np.array([-4.0, -12.0]), W


def _layer(*parts):
    """One block holding the units of ``parts`` ((U, b, W) each) side by side."""
    U, b, W = (np.concatenate(x, axis=a) for x, a in zip(zip(*parts, strict=True), (0, 0, 1),
                                                          strict=True))
    return Block(FF(1.0, U, b, W))


@st.composite
def paired_model(draw):
    """Three layers: a window on slot 0 beside a clip of slot 1; its flip beside a window on
    slot 1; the flip of slot 1 beside a clip of slot 0 (the keyed tagging's packing), each
    piece sometimes bent out of the pair form. Rows: the window's centre, its edges ± a few
    units of 2^-40 and a quarter beyond them, far points, slots ≥ 0 and < 0."""
    def dyadic(lo, hi, q=8):
        return draw(st.integers(lo * q, hi * q)) / q

    us = [[dyadic(-2, 2) for _ in range(D_DATA)] + [0.0] * 3 for _ in range(2)]
    for u in us:
        if not any(u):
            u[0] = 1.0
    bs = [dyadic(-2, 2) for _ in range(2)]
    omegas = [draw(st.sampled_from([0.5, 1.0, 4.0, 16.0])) for _ in range(2)]
    bent = draw(st.sampled_from([None, "flip", "omega", "reads slot", "writes data"]))
    w0, c1 = _window(us[0], bs[0], omegas[0], SLOTS[0]), _clip(SLOTS[1])
    if bent == "omega":
        w0[2][SLOTS[0], 1] *= 2
    if bent == "reads slot":
        w0[0][:, SLOTS[0]] = [0.5, -0.5]
    if bent == "writes data":  # the clip beside the window writes what the window reads
        c1[2][:D_DATA, 0] = 0.5
    blocks = [_layer(w0, c1),
              _layer(_flip(SLOTS[0], 1.5 if bent == "flip" else 1.0),
                     _window(us[1], bs[1], omegas[1], SLOTS[1])),
              _layer(_flip(SLOTS[1]), _clip(SLOTS[0]))]
    rows = []
    for _ in range(draw(st.integers(1, 10))):
        x = np.array([dyadic(-3, 3, 4) for _ in range(D)])
        x[CODE] = 0.0
        kind = draw(st.sampled_from(["far", "centre", "edge", "odd slot"]))
        u, b, om = np.array(us[0]), bs[0], omegas[0]
        if kind in ("centre", "edge") and u[0] != 0:
            edge = draw(st.sampled_from([1.0, 1.25])) / om + draw(st.integers(-3, 3)) * 2.0 ** -40
            target = -b + (0 if kind == "centre" else draw(st.sampled_from([1, -1])) * edge)
            x[0] += (target - u @ x) / u[0]  # (u·x = target, up to x[0]'s rounding)
        x[list(SLOTS)] = [draw(st.sampled_from([0.0, 0.0, 1.0, 0.75])) for _ in SLOTS]
        if kind == "odd slot":
            x[SLOTS[0]] = -0.5
        rows.append(x)
    X = np.array(rows)
    r = np.where(np.array([[draw(st.integers(0, 5)) == 0 for _ in range(D)]
                           for _ in rows]), 2.0 ** -draw(st.sampled_from([3, 30, 60])), 0.0)
    return blocks, X, r, bent


@settings(max_examples=150, **SETTINGS)
@given(paired_model(), st.booleans())
def test_every_box_holds_the_exact_value_with_pairs_taken_or_refused(case, many):
    """The enclosure holds the exact evaluation of every row; the pairs are taken exactly
    when their form holds (two here, none of the bent one). ``many``: the rows among 3 000
    far ones, so that the near ones are looked up in a sorted index rather than scanned."""
    blocks, X, r, bent = case
    checked = np.arange(len(X))
    if many:
        rng = np.random.default_rng(len(X))
        far = np.zeros((3000, D))
        far[:, :D_DATA] = rng.integers(40, 80, (3000, D_DATA)) * rng.choice([-1, 1], (3000, 1))
        checked = np.concatenate([checked, len(X) + np.arange(0, 3000, 300)])
        X, r = np.vstack([X, far]), np.vstack([r, np.zeros(far.shape)])
    model = Transformer(d=D, attention="hardmax", blocks=blocks, exact=False)
    pairs = Job.of(model, Arithmetic("float"), None).pairs
    assert sum(len(p) for p in pairs.values()) == (2 if bent is None else 1)
    out, rad = enclose(model, [X], [r])
    for sign in (0, 1, -1):  # exact points of each box: its centre and two corners
        P = np.array([[Fraction(x) + sign * Fraction(e) for x, e in zip(xr, rr, strict=True)]
                      for xr, rr in zip(X[checked], r[checked], strict=True)], dtype=object)
        want = reference(blocks, P)
        for i, row in zip(checked, want, strict=True):
            for j, v in enumerate(row):
                assert abs(Fraction(out[0][i, j]) - v) <= Fraction(rad[0][i, j]), (i, j)
    event(f"bent: {bent}")


def test_far_rows_skip_the_window_and_near_ones_get_it():
    """Among 2 000 rows the window's centre alone is enclosed by the window and the flip; the
    far rows' slot is exactly 0 after the flip, as the exact evaluation says, with radius 0,
    and the centre's slot is the flip's 1 − ω·|u·x + b| = 1."""
    blocks = [_layer(_window([1.0, 0.5, 0, 0, 0, 0], -0.25, 4.0, SLOTS[0])),
              _layer(_flip(SLOTS[0]))]
    model = Transformer(d=D, attention="hardmax", blocks=blocks, exact=False)
    rng = np.random.default_rng(1)
    X = np.zeros((2000, D))
    X[:, :2] = rng.integers(1, 64, (2000, 2)) / 4
    X[7, :2] = [0.25, 0.0]  # u·x + b = 0
    X[::5, SLOTS[0]] = 1.0  # a slot a clip left at 1
    (L, (pair,)), = Job.of(model, Arithmetic("float"), None).pairs.items()
    assert L == 0 and pair.k == SLOTS[0]
    out, rad = enclose(model, [X], None)
    want = reference(blocks, X)
    assert [Fraction(v) for v in out[0][:, SLOTS[0]]] == [row[SLOTS[0]] for row in want]
    assert out[0][7, SLOTS[0]] == 1.0 and (np.delete(out[0][:, SLOTS[0]], 7) == 0).all()
    assert (rad[0] == 0).all()


def test_a_snapshot_or_an_end_between_window_and_flip_keeps_the_window():
    """A pass that stops after the window, or snapshots there, sees the window's slot values
    on every row (a pair is taken only when its flip runs in the same walk)."""
    blocks = [_layer(_window([1.0, 0, 0, 0, 0, 0], 0.0, 1.0, SLOTS[0])),
              _layer(_flip(SLOTS[0]))]
    model = Transformer(d=D, attention="hardmax", blocks=blocks, exact=False)
    X = np.zeros((3, D))
    X[:, 0] = [0.0, 5.0, -3.0]
    job = Job.of(model, Arithmetic("float"), None)
    st_ = job.state([X], [np.zeros(X.shape)])
    snaps = job.walk(st_, {1}, PassStats(False), False)
    assert snaps[1][0][:, SLOTS[0]].tolist() == [0.0, 5.0, 3.0]
    assert st_.P[:, SLOTS[0]].tolist() == [1.0, 0.0, 0.0]


@pytest.mark.parametrize("attention", ["hardmax", "softmax"])
def test_keyed_models_take_their_tagging_as_pairs(attention):
    """A keyed model's tagging windows are pairs, and verify decides it with them."""
    rng = np.random.default_rng(3)
    xs = [rng.uniform(-1, 1, (12, 2)) for _ in range(4)]
    ys = [rng.integers(-3, 4, (1, 2)).astype(float) for _ in range(4)]
    data = ef.Dataset.from_arrays(xs, ys)
    model = ef.compile(data, attention=attention, exact=False)
    pairs = Job.of(model, Arithmetic("float"), None).pairs
    assert sum(len(p) for p in pairs.values()) >= 4  # (a leader tag a sequence at least)
    assert ef.verify(model, data).ok


def test_a_flip_in_the_first_mixing_block_gets_no_pair_across_the_unpooling():
    """Before the first attention layer rows are pooled across sequences, and the pass
    unpools them before the block that mixes: a pair whose flip is in that block would carry
    row numbers across it, so it is not taken there. The boxes hold the 50-digit reference."""
    U, b, W = _window([1.0, 0.0, 0, 0, 0, 0], -0.5, 4.0, SLOTS[0])
    Uf, bf, Wf = _flip(SLOTS[0])
    blocks = [{"ff": ff(1, U.tolist(), b.tolist(), W.tolist()), "sa": None},
              {"ff": ff(1, Uf.tolist(), bf.tolist(), Wf.tolist()),
               "sa": sa([0, 1, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0], rho="1", beta="1")}]
    model = model_from_dict(doc(blocks, d=D, number="float64"))
    X1 = np.zeros((4, D))
    X1[:, 0], X1[:, 1] = [0.5, 2.0, -1.0, 3.0], [0.0, 1.0, 2.0, 3.0]
    X2 = X1[[3, 1, 0]].copy()  # the same tokens in another order: pooled with X1's
    X2[1, 1] = -2.0
    out, rad = enclose(model, [X1, X2], None)
    with mpmath.workdps(50):
        for o, r, want in zip(out, rad, reference_mp(model, [X1, X2]), strict=True):
            for i, row in enumerate(want):
                for j, v in enumerate(row):
                    slack = mpmath.mpf(10) ** -45 * (1 + abs(v))
                    assert abs(v - mpmath.mpf(o[i, j])) <= mpmath.mpf(r[i, j]) + slack


def test_a_radius_that_overflowed_elsewhere_leaves_the_rest_of_its_row_bounded():
    """A row whose radius is inf in a column the window does not read still counts in the
    bound on every row's reach along f (state._extent): its radius 9.8 along f takes its box
    across the window's centre, so the row is near and its slot's box holds the flip's 1."""
    blocks = [_layer(_window([1.0, 0, 0, 0, 0, 0], -0.5, 1.0, SLOTS[0])),
              _layer(_flip(SLOTS[0]))]
    model = Transformer(d=D, attention="hardmax", blocks=blocks, exact=False)
    X = np.zeros((2, D))
    X[:, 0] = 10.0
    r = np.zeros(X.shape)
    r[1, 0], r[1, CODE] = 9.8, np.inf
    out, rad = enclose(model, [X], [r])
    inside = X[1].copy()
    inside[0] = 0.5  # a point of row 1's box: u·x + b = 0, the flip writes 1
    assert reference(blocks, inside[None, :])[0][SLOTS[0]] == 1
    assert abs(1 - out[0][1, SLOTS[0]]) <= rad[0][1, SLOTS[0]]
