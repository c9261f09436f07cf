"""Keyed softmax set models in float32 (docs/keyed.md#softmax, docs/numerics.md#proofs-for-
reduced-precision-runtimes): with snapped moves they are PROVED FAITHFUL IN float32, and the
test's own passes, every output column summed in an order of its own included, agree; the
snaps are dropped only where they would break the paper's bound; the two rules the proof
needs for them (a sum of two exact terms rounds once; c·x is exact for a power of two c)
hold against float32 arithmetic of the test's own."""

from __future__ import annotations

import warnings

import numpy as np
from conftest import datasets
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_default import paper_bound
from test_runtime_proof import PASSES, TOL, Pass, pass_error

import exactformer as ef
from exactformer.data import builtin
from exactformer.model import FF
from exactformer.verification import prove_runtime
from exactformer.verification.formats import FORMATS
from exactformer.verification.runtime_boxes import Weights
from exactformer.verification.runtime_proof import ff_box

F32 = np.float32
FMT = FORMATS["float32"]


def _softmax(data, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return ef.compile(data, attention="softmax", **kw)


@settings(max_examples=10, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(ds=datasets(max_pool=5), wide=st.booleans())
def test_snapped_softmax_models_are_proved_and_meet_every_order(ds, wide):
    """Grid data (integers or small fractions, shared tokens): the default softmax model is
    snapped wherever it fits the bound, is then proved in float32, and no pass of the test's
    own misses the tolerance."""
    kw = {"width": 64, "heads": 4} if wide else {}
    model = _softmax(ds, **kw)
    if not model.record.keyed["snaps"]:  # snaps would have broken the bound
        assert model.n_blocks <= paper_bound(ds, "softmax")
        return
    verdict = prove_runtime(model, ds, "float32")
    assert verdict.verdict == "PROVED FAITHFUL IN float32", verdict.table()
    assert verdict.bound <= TOL
    for p in [q for q in PASSES if not q.tf32]:
        assert pass_error(model, ds, p) <= TOL, (p.order, p.fma, p.lens, p.value)


def test_demo_softmax_is_proved_in_float32_at_both_widths():
    data = builtin.demo()
    for kw in ({}, {"width": 64, "heads": 4}):
        model = _softmax(data, **kw)
        assert model.record.keyed["snaps"]
        assert prove_runtime(model, data, "float32").ok


def test_snaps_give_way_to_the_papers_bound():
    """Two sequences of many targets: snapped moves (three units a move) would take the model
    past 2Σm + 3N at width 4, so the build lays plain clip pairs, within the bound; exact
    either way. At width 64 the same data are snapped."""
    rng = np.random.default_rng(3)
    grid = np.array([(x, y) for x in range(-10, 10) for y in range(-10, 10)], dtype=float)
    data = ef.Dataset.from_arrays([grid[rng.choice(len(grid), 20, replace=False)]
                                   for _ in range(2)],
                                  [grid[rng.choice(len(grid), 20, replace=False)]
                                   for _ in range(2)])
    narrow = _softmax(data, exact=True)
    assert not narrow.record.keyed["snaps"]
    assert narrow.n_blocks <= paper_bound(data, "softmax")
    assert ef.verify(narrow, data).verdict() == "PROVED EXACT"
    wide = _softmax(data, exact=True, width=64)
    assert wide.record.keyed["snaps"]
    assert ef.verify(wide, data).verdict() == "PROVED EXACT"


def test_a_pair_reading_two_values_is_not_proved():
    """Tamper: the second unit of a snapped pair also reads a code coordinate with a weight of
    2⁻¹⁶, so its two units no longer read one stored value and the pair's plateau is off by
    about 2⁻¹⁶·2C·|move|: the proof must not stand."""
    data = builtin.demo()
    model = _softmax(data, exact=False)
    assert prove_runtime(model, data).ok
    d = data.d
    for blk in model.blocks:  # the second unit of a pair: relu(s − 1)·(−move), s a work coordinate
        if blk.ff is None:
            continue
        U, b, W = (np.array(a, dtype=float) for a in (blk.ff.U, blk.ff.b, blk.ff.W))
        second = [k for k in range(len(b)) if (U[k] != 0).sum() == 1 and b[k] < 0
                  and np.argmax(U[k] != 0) >= d + 4 and np.abs(W[:d, k]).any()]
        if second:
            k = second[0]
            U[k, model.d - 2] = 2.0 ** -16 * np.abs(U[k]).max()  # the last code coordinate
            blk.ff = FF(blk.ff.eta, U, b, W)
            break
    else:
        raise AssertionError("no snapped pair found")
    assert not prove_runtime(model, data).ok


def _ff_runs(X, U, b, W, orders: int, seed: int):
    """The float32 outputs of x + W·relu(U·x + b) for each row of X, each output summed in a
    random order of its own terms (``orders`` times), and with one rounding of the exact sum."""
    rng = np.random.default_rng(seed)
    Z = (X.astype(np.float64) @ U.T.astype(np.float64) + b).astype(F32)  # ≤ 1 term + bias
    A = np.maximum(Z, F32(0))
    outs = []
    for _ in range(orders):
        out = np.empty_like(X)
        for i in range(len(X)):
            for c in range(X.shape[1]):
                terms = [X[i, c]] + [W[c, k] * A[i, k] for k in range(len(A[i]))]
                acc = F32(0)
                for t in rng.permutation(len(terms)):
                    acc = F32(acc + terms[t])
                out[i, c] = acc
        outs.append(out)
    outs.append((X.astype(np.float64) + A.astype(np.float64) @ W.T.astype(np.float64))
                .astype(F32))
    return outs


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), power=st.booleans())
def test_resets_on_boxes_across_a_power_of_two_hold_every_order(seed, power):
    """x − relu(c·x)/c and x + relu(−c·x)/c on boxes straddling a power of two (c a power of
    two, or not with ``power`` off): the enclosure holds every float32 evaluation of the
    test's own, and for powers of two it is 0 where the unit is surely on, up to the float64
    midpoint's own rounding."""
    rng = np.random.default_rng(seed)
    D = 3
    e = int(rng.integers(-3, 8))
    Xm = (2.0 ** e * (1 + rng.uniform(-2.0 ** -12, 2.0 ** -12, (6, D)))).astype(F32)
    Xm *= rng.choice([-1, 1], (6, D)).astype(F32)
    Xr = np.full_like(Xm, 2.0 ** (e - 14), dtype=float)
    c = 2.0 ** int(rng.integers(-2, 3)) * (1 if power else 1 + 2.0 ** -9)
    U = np.zeros((2, D))
    U[0, 0], U[1, 1] = c, -c
    W = np.zeros((D, 2))
    W[0, 0], W[1, 1] = -1 / c, 1 / c
    b = np.zeros(2)
    w = Weights({"eta": 1.0, "U": U, "b": b, "W": W}, FMT)
    mid, rad = ff_box(Xm.astype(float), Xr, w, FMT)
    for shift in (-1, 0, 1):  # points of the box: its midpoints and ends, in float32 inside it
        X = (Xm.astype(float) + shift * Xr).astype(F32)
        X = np.where(np.abs(X - Xm.astype(float)) > Xr, np.nextafter(X, Xm), X)
        for out in _ff_runs(X, U.astype(F32), b.astype(F32), w.W.astype(F32), 3, seed):
            assert (np.abs(out.astype(float) - mid) <= rad).all(), (out, mid, rad)
    on = np.abs(Xm[:, :2]) - Xr[:, :2] > 0
    signs = np.stack([Xm[:, 0] > 0, Xm[:, 1] < 0], axis=1)
    if power:  # no rounding of x's size: x − x is exactly 0 in every order
        assert (rad[:, :2][on & signs] <= 2.0 ** -40 * np.abs(Xm[:, :2][on & signs])).all()
        assert (mid[:, :2][on & signs] == 0).all()


def test_a_wide_space_few_targets_keeps_the_bound_with_a_floor():
    """Two sequences of one token in d = 12, coordinates of both signs: the exact-zero data
    reset (two units a coordinate) took 12 blocks against 2Σm + 3N = 10; the build falls back
    to one unit a coordinate, to a dyadic floor below the data, and stays exact."""
    rng = np.random.default_rng(5)
    data = ef.Dataset.from_arrays([rng.integers(-20, 20, (1, 12)).astype(float) for _ in range(2)],
                                  [rng.integers(-20, 20, (1, 12)).astype(float) for _ in range(2)])
    assert 0 in [1 if (c >= 0).all() else -1 if (c <= 0).all() else 0
                 for c in np.vstack(data.floats()[0]).T]  # a coordinate of both signs
    model = _softmax(data, exact=True)
    assert model.n_blocks <= 2 * data.total_m + 3 * data.N
    assert not model.record.keyed["snaps"]
    assert ef.verify(model, data).verdict() == "PROVED EXACT"


def test_the_float64_enclosures_decide_a_model_of_many_snap_groups():
    """A float64 softmax build at width 16 (381 moves, groups of 5): a pair that clears its
    snap coordinate has J = 0, which the enclosures charged J's float64 rounding, so each
    later pair reading that coordinate at a moved row was undecided and doubled the radius;
    the bound passed the limit and the ball pass decided. J's exact entries now carry no
    rounding and the enclosures decide, within the limit, as the ball pass does."""
    data = builtin.shared_pool(100, 4, 20, 8, 3, seed=0)
    model = _softmax(data, exact=False, width=16)
    assert model.record.keyed["snaps"]
    report = ef.verify(model, data)
    assert report.ok and report.arithmetic == "enclosures"


def test_many_heads_writing_one_code_are_counted_per_coordinate():
    """The vocabulary family at width 64 with 16 heads: its collapse writes each code through
    two entries of V, and charging every output the D + 2H roundings of the widest one left
    it UNDECIDED (a bound of 10²⁷: the codes' radii passed the snaps' margin). Counted per
    coordinate it is proved, and the test's own passes agree (three of them, one per value
    map: every column in an order of its own, TransformerLens's reversed, FMA on ρ/η's)."""
    data = builtin.vocabulary(60, 40, 8, 3, 8)
    model = _softmax(data, width=64, heads=16)
    verdict = prove_runtime(model, data, "float32")
    assert verdict.verdict == "PROVED FAITHFUL IN float32", verdict.table()
    for p in (Pass("columns", seed=5), Pass("rev", lens=True, value="after"),
              Pass(fma=True, lens=True, value="before")):
        assert pass_error(model, data, p) <= TOL, (p.order, p.fma, p.lens, p.value)
