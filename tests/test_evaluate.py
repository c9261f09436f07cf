"""The evaluator: the hardmax tie rule, the ridge-window fast path against a plain per-token
reference, and agreement of the exact, float64 and mpmath arithmetics."""

from __future__ import annotations

from fractions import Fraction
from unittest.mock import patch

import mpmath
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import exactformer as ef
from exactformer.construct.gadgets import ff_from_units, hat_units, snap_units
from exactformer.evaluate import PassStats, compaction, ridge_window
from exactformer.evaluate.compaction import distinct_within, float_row_groups
from exactformer.evaluate.state import SortedProjection
from exactformer.model import FF, SA, Block, ScoreMatrix, Transformer, ValueMatrix

SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
SLOW = settings(SETTINGS, max_examples=20)  # whole random models through exact passes: ~0.3 s each


def F(*values):
    """An object array of Fractions (nested lists allowed)."""
    a = np.asarray(values if len(values) != 1 else values[0], dtype=object)
    out = np.empty(a.shape, dtype=object)
    out.flat[:] = [Fraction(v) for v in a.flat]
    return out


def scores(alpha, a, c):
    return ScoreMatrix(Fraction(alpha), F(a), F(c))


def values(beta, p, q):
    return ValueMatrix(Fraction(beta), F(p), F(q))


def model_of(d, *blocks, attention="hardmax"):
    return Transformer(d=d, attention=attention, blocks=list(blocks), exact=True)


def rows(a):
    return [tuple(Fraction(v) for v in r) for r in np.asarray(a, dtype=object)]


# ------------------------------------------------------------------------------ reference
def ref_ff(ff, x):
    d, w = ff.W.shape
    h = [max(Fraction(0), sum((ff.U[i, j] * x[j] for j in range(d)), Fraction(0)) + ff.b[i])
         for i in range(w)]
    return [ff.eta * x[k] + sum((ff.W[k, i] * h[i] for i in range(w)), Fraction(0))
            for k in range(d)]


def dot(a, b):
    return sum((p * q for p, q in zip(a, b, strict=True)), Fraction(0))


def ref_sa(sa, X):
    """Hardmax over token indices: ties average over every index in the argmax set."""
    a, c = list(sa.A.a), list(sa.A.c)
    out = []
    for xi in X:
        s = [sa.A.alpha * dot(xi, xl) + dot(c, xi) * dot(a, xl) for xl in X]
        best = max(s)
        C = [l for l, v in enumerate(s) if v == best]
        avg = [sum((X[l][k] for l in C), Fraction(0)) / len(C) for k in range(len(xi))]
        qy = dot(sa.V.q, avg)
        out.append([sa.rho * xi[k] + sa.V.beta * avg[k] + sa.V.p[k] * qy for k in range(len(xi))])
    return out


def ref_forward(model, inputs):
    """A plain per-token forward pass: no multisets, no ridge windows, no sorted index."""
    outs = []
    for X in inputs:
        X = [[Fraction(v) for v in row] for row in X]
        for blk in model.blocks:
            if blk.ff is not None:
                X = [ref_ff(blk.ff, x) for x in X]
            if blk.sa is not None:
                X = ref_sa(blk.sa, X)
        outs.append([tuple(x) for x in X])
    return outs


# ------------------------------------------------------------------------------ tie rule
def attend(A, V=None, rho=0):
    """SA with A = (s, a, c) and V = (s, p, q) given as tuples."""
    d = len(A[1])
    V = V or (1, [0] * d, [0] * d)
    return SA(Fraction(rho), scores(*A), values(*V))


ARITHMETICS = ["exact", "float", "mp"]


def run_all(model, X):
    """Outputs of one sequence in every arithmetic, as lists of float tuples, plus exact."""
    (exact,) = ef.forward(model, [F(X)], "exact")
    for ar in ("float", "mp"):
        (out,) = ef.forward(model, [F(X) if ar == "mp" else np.asarray(X, float)], ar)
        np.testing.assert_allclose(np.asarray(out, float), np.asarray(exact, float),
                                   rtol=1e-12, atol=1e-12)
    return rows(exact)


def test_tie_averages_over_the_argmax_set():
    # s_il = u_i·u_l: queries with u > 0 pick the largest u (two tokens tie); a query with u = 0
    # scores every token 0 and averages all three
    m = model_of(2, Block(None, attend((0, [1, 0], [1, 0]))))
    out = run_all(m, [[1, 0], [1, 1], [0, 5]])
    h = Fraction(1, 2)
    assert out == [(1, h), (1, h), (Fraction(2, 3), 2)]


def test_tie_counts_equal_tokens_with_multiplicity():
    # all scores 0: every token averages the whole sequence, equal tokens counted each time
    m = model_of(2, Block(None, attend((0, [0, 0], [0, 0]))))
    out = run_all(m, [[1, 0], [1, 0], [2, 0]])
    assert out == [(Fraction(4, 3), 0)] * 3  # not (3/2, 0), the average of the distinct points


def test_multiplicity_created_by_a_layer():
    # a non-residual FF sends (1, 0) and (1, 3) to the same point; the tie then counts it twice
    ff = FF(Fraction(0), F([[1, 0]]), F([0]), F([[1], [0]]))
    m = model_of(2, Block(ff, attend((0, [0, 0], [0, 0]))))
    out = run_all(m, [[1, 0], [1, 3], [2, 0]])
    assert out == [(Fraction(4, 3), 0)] * 3


def test_partial_tie_with_multiplicity():
    # u_i > 0 for every query: the argmax set is the three tokens with u = 2, one point twice
    m = model_of(2, Block(None, attend((0, [1, 0], [1, 0]))))
    out = run_all(m, [[2, 0], [2, 0], [2, 1], [1, 0]])
    assert out == [(2, Fraction(1, 3))] * 4


def test_multiplicity_created_by_a_ridge_window():
    # a hat (ridge window) moves (0, 0) onto (3, 0), where a token already is; the two rows
    # are then one point with multiplicity 2 in the following tie
    ff = ff_from_units(hat_units(F([1, 0]), Fraction(0), Fraction(0), Fraction(1), F([3, 0])),
                       Fraction(1), 2, True)
    assert ridge_window(ff) is not None
    m = model_of(2, Block(ff, attend((0, [0, 0], [0, 0]))))
    out = run_all(m, [[0, 0], [3, 0], [3, 3]])
    assert out == [(3, 1)] * 3
    assert ref_forward(m, [F([[0, 0], [3, 0], [3, 3]])])[0] == out


def test_negative_queries_pick_the_smallest_key_and_v_is_rank_one():
    # ρ = 1, V = e2·e1ᵀ: every token adds (0, first coordinate of what it attends to)
    sa = attend((0, [1, 0], [1, 0]), V=(0, [0, 1], [1, 0]), rho=1)
    out = run_all(model_of(2, Block(None, sa)), [[1, 0], [-1, 0], [3, 1]])
    assert out == [(1, 3), (-1, -1), (3, 4)]


def test_scores_use_alpha_and_the_rank_one_part():
    # A = I + a·cᵀ with a = e1, c = e2: s_il = <x_i, x_l> + x_i[1]·x_l[0]
    sa = attend((1, [1, 0], [0, 1]))
    X = [[1, 0], [0, 1], [-2, 1]]
    # query 0: s = (1, 0, -2) -> token 0; query 1: s = (0+1, 1+0, 1-2) -> tie of 0 and 1
    # query 2: s = (-2+1, 1+0, 5-2) -> token 2
    out = run_all(model_of(2, Block(None, sa)), X)
    h = Fraction(1, 2)
    assert out == [(1, 0), (h, h), (-2, 1)]


def test_identity_layers_and_length_preservation():
    m = model_of(3, Block(None, None), Block(None, attend((1, [0] * 3, [0] * 3), V=(0, [0] * 3,
                                                                                   [0] * 3),
                                                           rho=1)))
    X = F([[1, 2, 3], [1, 2, 3], [0, 0, "1/7"]])
    (out,) = ef.forward(m, [X], "exact")
    assert out.shape == (3, 3) and rows(out) == rows(X)
    assert rows(ef.predict(m, X)) == rows(X[[0, 2]])


def test_snapshots():
    sa = attend((0, [1, 0], [1, 0]))
    m = model_of(2, Block(None, sa), Block(None, sa))
    X = [F([[1, 0], [0, 2]]), F([[5, 5]])]
    outs, snaps = ef.forward(m, X, "exact", snapshots={0, 1, 2})
    assert [rows(a) for a in snaps[0]] == [rows(x) for x in X]
    assert [rows(a) for a in snaps[2]] == [rows(o) for o in outs]
    assert rows(snaps[1][0]) == [(1, 0), (Fraction(1, 2), 1)]  # u = 0 ties over both
    assert rows(outs[0]) == [(1, 0), (1, 0)]


def test_unknown_arithmetic():
    with pytest.raises(ValueError, match="arithmetic"):
        ef.forward(model_of(2), [F([[1, 0]])], "decimal")


# ------------------------------------------------------------------------------ ridge windows
def hat_ff(f, c, delta, D, plateau=True):
    return ff_from_units(hat_units(F(f), Fraction(0), Fraction(c), Fraction(delta), F(D),
                                   plateau=plateau), Fraction(1), len(f), True)


def window_along(r, f) -> tuple:
    """The window of ``r`` in t = f·x: layers are stored balanced, so r.f = k·f, k > 0."""
    i = next(i for i, v in enumerate(f) if v)
    k = r.f[i] / Fraction(f[i])
    assert k > 0 and list(r.f) == [k * Fraction(v) for v in f]
    return r.lo / k, r.hi / k


def test_ridge_window_detection():
    r = ridge_window(hat_ff([1, 2], 3, "1/2", [1, 1]))
    assert r is not None and window_along(r, [1, 2]) == (Fraction(5, 2), Fraction(7, 2))
    r = ridge_window(hat_ff([0, -3], 1, 1, [2, 0], plateau=False))
    assert r is not None and window_along(r, [0, -3]) == (0, 2)
    e = F([1, 0])
    snap = ff_from_units(snap_units(F([1, 0]), Fraction(0), e, Fraction(0), Fraction(1),
                                    Fraction(2), Fraction(3), F([5, 5])), Fraction(1), 2, True)
    r = ridge_window(snap)
    assert r is not None and sorted(window_along(r, [1, 0])) == [0, 3]


def test_ridge_window_rejections():
    hat = hat_ff([1, 0], 0, 1, [1, 1])
    assert ridge_window(FF(Fraction(0), hat.U, hat.b, hat.W)) is None  # not residual
    ramp = FF(Fraction(1), F([[1, 1]]), F([0]), F([[1], [0]]))
    assert ridge_window(ramp) is None  # never switches off on the right
    two_dirs = FF(Fraction(1), F([[1, 0], [0, 1], [1, 0]]), F([1, 0, -1]),
                  F([[1, 0, 1], [0, 0, 0]]))
    assert ridge_window(two_dirs) is None
    shift = FF(Fraction(1), np.vstack([hat.U, F([[0, 0]])]), np.concatenate([hat.b, F([1])]),
               np.hstack([hat.W, F([[1], [0]])]))
    assert ridge_window(shift) is None  # a constant shift everywhere
    dead = FF(Fraction(1), np.vstack([hat.U, F([[0, 0]])]), np.concatenate([hat.b, F([-1])]),
              np.hstack([hat.W, F([[1], [0]])]))
    assert ridge_window(dead) is not None  # a unit that never fires changes nothing
    X = [F([[0, 0], [5, 1], ["1/2", 3]])]
    for ff in (ramp, two_dirs, shift, dead):
        m = model_of(2, Block(ff, None))
        assert [rows(o) for o in ef.forward(m, X, "exact")] == ref_forward(m, X)


def fracs(lo=-4, hi=4, den=8):
    return st.fractions(min_value=lo, max_value=hi, max_denominator=den)


def vectors(d, nonzero=False, **kw):
    v = st.lists(fracs(**kw), min_size=d, max_size=d)
    return v.filter(any) if nonzero else v


POW2 = [Fraction(1, 4), Fraction(1, 2), Fraction(1), Fraction(2)]


def dyadics(lo=-4, hi=4, den=8):
    return st.integers(lo * den, hi * den).map(lambda k: Fraction(k, den))


@st.composite
def ridge_ffs(draw, d, max_gadgets=3, dead=None, dyadic=False):
    """Residual FFs whose units all read multiples of one direction and vanish outside a window
    (sums of hats and snaps with non-zero moves), sometimes with a dead unit. ``dyadic``: every
    parameter is a binary fraction with few bits, so float64 holds them and their products."""
    num = dyadics if dyadic else fracs

    def vec(nonzero=False):
        v = st.lists(num(), min_size=d, max_size=d)
        return F(draw(v.filter(any) if nonzero else v))

    f = vec(nonzero=True)
    units = []
    for _ in range(draw(st.integers(1, max_gadgets))):
        k = Fraction(draw(st.sampled_from([1, -1, 2, Fraction(-1, 2) if dyadic
                                           else Fraction(-1, 3)])))
        c = draw(num())
        kind = draw(st.sampled_from(["hat", "hat3", "snap"]))
        if kind == "snap":
            gaps = [draw(st.sampled_from(POW2) if dyadic else fracs(Fraction(1, 8), 2))
                    for _ in range(3)]
            cs = [c, c + gaps[0], c + gaps[0] + gaps[1], c + sum(gaps)]
            units += snap_units(f * k, Fraction(0), vec(nonzero=True), *cs, vec())
        else:
            delta = draw(st.sampled_from(POW2) if dyadic else fracs(Fraction(1, 8), 3))
            units += hat_units(f * k, Fraction(0), c, delta, vec(nonzero=True),
                               plateau=kind == "hat")
    ff = ff_from_units(units, Fraction(1), d, True)
    if draw(st.booleans()) if dead is None else dead:
        # a unit reading nothing with b <= 0 never fires: still a ridge window
        ff = FF(ff.eta, np.vstack([ff.U, F([[0] * d])]),
                np.concatenate([ff.b, F([-draw(num(0, 2))])]),
                np.hstack([ff.W, vec().reshape(d, 1)]))
    return ff


@st.composite
def dense_ffs(draw, d):
    w = draw(st.integers(1, 4))
    eta = Fraction(draw(st.sampled_from([0, 1, Fraction(1, 2)])))
    return FF(eta, F([draw(vectors(d)) for _ in range(w)]), F(draw(vectors(w))),
              F([draw(vectors(w)) for _ in range(d)]))


@st.composite
def almost_ridge_ffs(draw, d):
    """Ridge-like FFs that do not vanish outside their breakpoints: a window with one output
    weight changed (a slope remains), or with a step added (flat but non-zero on one side)."""
    ff = draw(ridge_ffs(d))
    W, U, b = ff.W.copy(), ff.U, ff.b
    if draw(st.booleans()):
        i = draw(st.integers(0, ff.width - 1))
        W[draw(st.integers(0, d - 1)), i] += draw(fracs(1, 2))
    else:  # D·(relu(t − c1) − relu(t − c2)): zero slope at both ends, D·(c2 − c1) on the right
        nz = next(i for i in range(ff.width) if any(U[i]))
        k = Fraction(draw(st.sampled_from([1, -1, 2])))
        c1 = draw(fracs())
        c2 = c1 + draw(fracs(Fraction(1, 4), 3))
        D = F(draw(vectors(d, nonzero=True)))
        U = np.vstack([U, [U[nz] * k, U[nz] * k]])
        b = np.concatenate([b, F([-c1 * k, -c2 * k])])
        W = np.hstack([W, np.stack([D, -D], axis=1)])
    return FF(ff.eta, U, b, W)


@st.composite
def sas(draw, d):
    return SA(Fraction(draw(st.sampled_from([0, 1, Fraction(1, 2)]))),
              ScoreMatrix(Fraction(draw(st.sampled_from([0, 1, -1, Fraction(1, 3)]))),
                      F(draw(vectors(d))), F(draw(vectors(d)))),
              ValueMatrix(Fraction(draw(st.sampled_from([0, 1, Fraction(1, 2)]))),
                      F(draw(vectors(d))), F(draw(vectors(d)))))


@st.composite
def models(draw, d=None, max_blocks=5):
    d = draw(st.integers(2, 4)) if d is None else d
    blocks = []
    for _ in range(draw(st.integers(1, max_blocks))):
        kind = draw(st.sampled_from(["ridge", "ridge", "dense", "almost", "none"]))
        ff = None if kind == "none" else draw({"ridge": ridge_ffs, "dense": dense_ffs,
                                               "almost": almost_ridge_ffs}[kind](d))
        sa = draw(st.one_of(st.none(), sas(d)))
        blocks.append(Block(ff, sa))
    return model_of(d, *blocks)


@st.composite
def inputs_for(draw, d, max_len=6):
    """1–3 sequences over one small pool of tokens: tokens are shared between sequences and
    may repeat inside a sequence (multiplicities)."""
    pool = draw(st.lists(vectors(d, lo=-3, hi=3, den=4), min_size=1, max_size=5))
    seqs = []
    for _ in range(draw(st.integers(1, 3))):
        seqs.append(F(draw(st.lists(st.sampled_from(pool), min_size=1, max_size=max_len))))
    return seqs


@SLOW
@given(data=st.data())
def test_fast_path_equals_reference(data):
    model = data.draw(models())
    X = data.draw(inputs_for(model.d))
    got = ef.forward(model, X, "exact")
    want = ref_forward(model, X)
    for g, w, x in zip(got, want, X, strict=True):
        assert g.shape == x.shape
        assert rows(g) == w  # token by token, exactly


@SLOW
@given(data=st.data())
def test_rows_pooled_before_attention_equal_reference(data):
    """Up to the first attention layer a pass merges equal rows of different sequences
    (RowState.pool); every snapshot, in exact and float arithmetic, and the enclosure's
    radii, must still be each sequence's own, token by token, against a per-token pass."""
    d = data.draw(st.integers(2, 3))
    prefix = [Block(data.draw(data.draw(st.sampled_from([ridge_ffs, dense_ffs,
                                                               almost_ridge_ffs]))(d)),
                    None) for _ in range(data.draw(st.integers(1, 3)))]
    rest = data.draw(models(d, max_blocks=3)).blocks
    sa = data.draw(sas(d))
    model = model_of(d, *prefix, Block(None, sa), *rest)
    X = data.draw(inputs_for(d))
    want = {i: ref_forward(model_of(d, *model.blocks[:i]), X) if i else
            [rows(x) for x in X] for i in range(model.n_blocks + 1)}
    every = set(range(model.n_blocks + 1))
    for arithmetic in ("exact", "float"):
        _, snaps = ef.forward(model, X, arithmetic, snapshots=every)
        for i in every:
            got = [[tuple(Fraction(v) for v in r) for r in s] for s in snaps[i]]
            if arithmetic == "exact":
                assert got == want[i], i
            elif i <= len(prefix):  # after the attention a float argmax may break a tie
                # the exact one keeps (or make one): only the exact pass is compared there
                assert all(np.allclose(np.array(g, float), np.array(w, float), atol=1e-9)
                           for g, w in zip(got, want[i], strict=True) if np.isfinite(
                               np.array(g, float)).all()), i
    fm = model.to_float()
    outs, radii = ef.evaluate.enclose(fm, [np.asarray(x, float) for x in X], None)
    twin = model_of(d, *(b.converted(Fraction, lambda a: np.vectorize(Fraction, otypes=[
        object])(a)) for b in fm.blocks))  # the float model's own numbers, exactly
    exact = ref_forward(twin, [[[Fraction(float(v)) for v in r] for r in x] for x in X])
    for o, r, w in zip(outs, radii, exact, strict=True):
        for row, rad, tok in zip(o, r, w, strict=True):
            assert all(abs(Fraction(float(m)) - v) <= Fraction(float(e)) for m, e, v in
                       zip(row, rad, tok, strict=True) if np.isfinite(e))


@SLOW
@given(data=st.data())
def test_ridge_only_models_equal_reference(data):
    d = data.draw(st.integers(2, 3))
    blocks, gadgets = [], []
    for _ in range(data.draw(st.integers(1, 6))):
        single = data.draw(st.booleans())
        ff = data.draw(ridge_ffs(d, max_gadgets=1) if single else ridge_ffs(d))
        blocks.append(Block(ff, None))
        if single:
            gadgets.append(ff)
    if data.draw(st.booleans()):
        blocks.insert(data.draw(st.integers(0, len(blocks))), Block(None, data.draw(sas(d))))
    model = model_of(d, *blocks)
    # one hat or snap with a non-zero move is always recognised, so the fast path is exercised
    assert all(ridge_window(ff) is not None for ff in gadgets)
    X = data.draw(inputs_for(d, max_len=8))
    assert [rows(g) for g in ef.forward(model, X, "exact")] == ref_forward(model, X)


@SETTINGS
@given(data=st.data())
def test_float_ridge_path_is_exact_on_binary_fractions(data):
    # with few-bit binary fractions everywhere, float64 arithmetic makes no rounding error, so
    # the float pass (ridge windows detected on float parameters) must equal the exact reference
    d = data.draw(st.integers(2, 3))
    blocks = [Block(data.draw(ridge_ffs(d, max_gadgets=2, dyadic=True)), None)
              for _ in range(data.draw(st.integers(1, 5)))]
    model = model_of(d, *blocks).to_float()
    pool = data.draw(st.lists(st.lists(dyadics(-3, 3, 4), min_size=d, max_size=d),
                              min_size=1, max_size=6))
    X = [F(data.draw(st.lists(st.sampled_from(pool), min_size=1, max_size=8)))
         for _ in range(data.draw(st.integers(1, 3)))]
    got = ef.forward(model, [np.asarray(x, float) for x in X], "float")
    want = ref_forward(model_of(d, *blocks), X)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == np.float64
        assert [tuple(Fraction(v) for v in r) for r in g.tolist()] == w


def test_many_tokens_through_many_windows():
    # enough moved rows to force the sorted index to be rebuilt, windows on two directions
    rng = np.random.default_rng(0)
    d, n = 2, 150
    X = [F(rng.integers(-40, 41, size=(n, d)).tolist()),
         F(rng.integers(-40, 41, size=(n // 3, d)).tolist())]
    blocks = []
    for k in range(12):
        f = [1, 0] if k % 3 else [1, -2]
        c = Fraction(int(rng.integers(-30, 31)))
        delta = Fraction(int(rng.integers(5, 60)))
        D = F(rng.integers(-5, 6, size=d).tolist())
        blocks.append(Block(hat_ff(f, c, delta, D, plateau=bool(k % 2)), None))
    blocks.insert(6, Block(None, attend((0, [1, 0], [1, 0]), V=(0, [0, 1], [1, 0]), rho=1)))
    model = model_of(d, *blocks)
    assert [rows(g) for g in ef.forward(model, X, "exact")] == ref_forward(model, X)


# ------------------------------------------------------------------------------ arithmetics
@SLOW
@given(data=st.data())
def test_exact_float_mp_agree(data):
    model = data.draw(models())
    X = data.draw(inputs_for(model.d))
    stats = PassStats()
    exact, snaps = ef.forward(model, X, "exact", stats=stats,
                              snapshots=set(range(model.n_blocks + 1)))
    # hardmax is discontinuous at ties: compare only where the exact pass is clear of them
    assume(stats.hardmax_ties == 0)
    assume(stats.hardmax_margin is None or stats.hardmax_margin > 1e-6)
    # rounding errors scale with the largest coordinate seen anywhere in the pass
    scale = max(1.0, max(float(abs(v)) for outs in snaps.values() for o in outs for v in o.flat))
    floats = ef.forward(model.to_float(), [np.asarray(x, float) for x in X], "float")
    for e, f in zip(exact, floats, strict=True):
        assert f.dtype == np.float64
        np.testing.assert_allclose(f, np.asarray(e, float), rtol=0, atol=1e-9 * scale)
    mp = ef.forward(model, X, "mp", dps=40)
    with mpmath.workdps(40):
        for e, m in zip(exact, mp, strict=True):
            err = max(abs(a - mpmath.mpf(b.numerator) / b.denominator)
                      for a, b in zip(m.flat, e.flat, strict=True))
            assert err <= mpmath.mpf(10) ** -30 * scale


# ------------------------------------------------------------------------------ verify helpers
def unpruned_softmax(X, alpha, a, c, tau, dps):
    """Every row's softmax average over every key at ``dps`` digits (no key dropped)."""
    with mpmath.workdps(dps):
        def m(v):
            v = Fraction(v)
            return mpmath.mpf(v.numerator) / v.denominator
        Xm = [[m(v) for v in r] for r in X]
        out = []
        for xi in Xm:
            s = [m(alpha) * sum(p * q for p, q in zip(xi, xl, strict=True))
                 + sum(m(u) * v for u, v in zip(c, xi, strict=True))
                 * sum(m(u) * v for u, v in zip(a, xl, strict=True)) for xl in Xm]
            w = [mpmath.exp((v - max(s)) / m(tau)) for v in s]
            out.append([sum(wl * xl[k] for wl, xl in zip(w, Xm, strict=True)) / sum(w)
                        for k in range(len(xi))])
        return out


@settings(max_examples=30, deadline=None)
@given(keys=st.lists(st.integers(-10 ** 6, 10 ** 6), min_size=2, max_size=8, unique=True),
       key_exp=st.integers(-12, 12), query_exp=st.integers(0, 30),
       tau_exp=st.integers(-3, 3), alpha=st.sampled_from([0, 1, Fraction(-1, 3)]))
def test_pruned_softmax_rows_match_unpruned_200_digits(keys, key_exp, query_exp, tau_exp,
                                                       alpha):
    """Sharp softmax rows with scores up to ~1e42: the 50-digit pass, which drops keys whose
    weights cannot matter, agrees with an unpruned 200-digit evaluation to 50 digits."""
    e = Fraction(10) ** key_exp
    X = [[k * e, Fraction(1)] for k in keys]
    a, c = [1, 0], [0, Fraction(10) ** query_exp]
    tau = Fraction(10) ** tau_exp
    sa = SA(Fraction(0), scores(alpha, a, c), values(1, [0, 0], [0, 0]))
    model = Transformer(d=2, attention="softmax", blocks=[Block(None, sa)], tau=tau)
    (got,) = ef.forward(model, [F(X)], "mp", dps=50)
    want = unpruned_softmax(X, alpha, a, c, tau, 200)
    scale = max(abs(v) for r in X for v in r)
    with mpmath.workdps(200):
        err = max(abs(g - w) for gr, wr in zip(got, want, strict=True)
                  for g, w in zip(gr, wr, strict=True))
        assert err <= mpmath.mpf(10) ** -45 * (mpmath.mpf(scale.numerator) / scale.denominator)


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_dense_reference_pass_agrees_with_the_reference(data):
    """The independent float64 pass of ``verify`` (no multisets, no ridge windows) equals the
    exact per-token reference up to float rounding; binary-fraction parameters keep hardmax
    argmax sets free of rounding."""
    d = data.draw(st.integers(2, 3))
    blocks = [Block(data.draw(ridge_ffs(d, max_gadgets=2, dyadic=True)), None)
              for _ in range(data.draw(st.integers(1, 3)))]
    dy = st.lists(dyadics(), min_size=d, max_size=d)
    blocks.append(Block(None, SA(Fraction(data.draw(st.sampled_from([0, 1]))),
                                 scores(data.draw(st.sampled_from([0, 1])), data.draw(dy),
                                        data.draw(dy)),
                                 values(1, data.draw(dy), data.draw(dy)))))
    blocks += [Block(data.draw(ridge_ffs(d, max_gadgets=2, dyadic=True)), None)
               for _ in range(data.draw(st.integers(0, 2)))]
    model = model_of(d, *blocks)
    pool = data.draw(st.lists(st.lists(dyadics(-3, 3, 4), min_size=d, max_size=d),
                              min_size=1, max_size=6, unique_by=tuple))
    X = [F(data.draw(st.permutations(pool))) for _ in range(data.draw(st.integers(1, 3)))]
    peaks: dict = {}
    got = ef.evaluate.dense_forward(model, [np.asarray(x, float) for x in X], peaks=peaks)
    for g, w in zip(got, ref_forward(model, X), strict=True):
        np.testing.assert_allclose(g, np.asarray(w, dtype=float), rtol=1e-12, atol=1e-9)
    want = ref_peaks(model, X)  # the stretches run on distinct rows: the same peaks
    assert peaks.keys() == want.keys()
    for key, top in want.items():
        assert abs(peaks[key] - float(top)) <= 1e-12 * float(top) + 1e-9, key


def ref_peaks(model, inputs) -> dict:
    """The largest |value| of every intermediate (block, part), token by token, exactly."""
    peaks: dict = {}

    def note(k, part, values):
        peaks[k, part] = max([peaks.get((k, part), Fraction(0)), *map(abs, values)])

    for X in inputs:
        X = [[Fraction(v) for v in row] for row in X]
        for k, blk in enumerate(model.blocks):
            if blk.ff is not None:
                ff = blk.ff
                note(k, "FF pre-activation", [dot(ff.U[i], x) + ff.b[i] for x in X
                                              for i in range(ff.width)])
                X = [ref_ff(ff, x) for x in X]
                note(k, "FF output", [v for x in X for v in x])
            if blk.sa is not None and not blk.sa.is_identity():
                A = blk.sa.A
                note(k, "scores", [A.alpha * dot(xi, xl) + dot(A.c, xi) * dot(A.a, xl)
                                   for xi in X for xl in X])
                X = ref_sa(blk.sa, X)
            note(k, "state", [v for x in X for v in x])
    return peaks


@SETTINGS
@given(t=st.lists(st.sampled_from([-1.0, 0.0, 0.5, 1.0, 2.0, np.nan, np.inf]), min_size=1,
                  max_size=30),
       moves=st.lists(st.lists(st.tuples(st.integers(0, 29),
                                         st.sampled_from([-2.0, 0.25, 0.5, 3.0, np.nan])),
                               max_size=12), max_size=6),
       window=st.tuples(st.sampled_from([-1.5, 0.0, 0.4]), st.sampled_from([0.6, 1.0, 2.5])),
       exact=st.booleans())
def test_sorted_projection_under_moves(t, moves, window, exact):
    """Moving rows and folding them back in (a merge, not a new sort) keeps a sorted
    permutation, and the rows found in a window are those a scan finds."""
    if exact:
        t = [v for v in t if np.isfinite(v)] or [0.0]
        moves = [[(r, v) for r, v in m if np.isfinite(v)] for m in moves]
    arr = np.array([Fraction(v) for v in t], dtype=object) if exact else np.array(t)
    sp = SortedProjection(arr.copy())
    for step in moves:
        rows = np.array(sorted({r % len(t) for r, _ in step}), dtype=np.int64)
        new = {r % len(t): v for r, v in step}
        vals = [Fraction(new[r]) if exact else new[r] for r in rows.tolist()]
        sp.update(rows, np.array(vals, dtype=object if exact else float))
        lo, hi = window
        found, gap = sp.rows_in(lo, hi)  # the first query scans, later ones use the order
        assert sorted(found.tolist()) == [i for i, v in enumerate(sp.t) if lo < v < hi]
        outside = [lo - v if v <= lo else v - hi for v in sp.t.tolist()
                   if not lo < v < hi and not (not exact and np.isnan(v))]
        assert gap == (min(outside) if outside else None)
        sp.refresh()
        assert sorted(sp.order.tolist()) == list(range(len(t)))
        s = [float(v) for v in sp.t[sp.order]]
        finite = [v for v in s if not np.isnan(v)]
        assert finite == sorted(finite) and s[:len(finite)] == finite  # nan last


@SETTINGS
@given(rows=st.lists(st.tuples(st.integers(0, 2),
                               st.lists(st.sampled_from([0.0, -0.0, 1.0, 2.5, np.nan, np.inf]),
                                        min_size=2, max_size=2)), min_size=1, max_size=25),
       collide=st.booleans())
def test_float_compaction_groups(rows, collide):
    """Compaction of a float64 state merges exactly the rows equal in sequence and bits (±0
    alike), keeps the groups in sequence order, and stays correct when every hash collides
    (then equal rows may stay apart, never unequal ones together)."""
    rows = sorted(rows, key=lambda r: r[0])
    seq = np.array([s for s, _ in rows])
    P = np.asfortranarray(np.array([p for _, p in rows], dtype=float))
    key = [(s, tuple((np.array(p) + 0.0).view(np.uint64).tolist())) for s, p in rows]
    if collide:
        with patch.object(compaction, "mix64", lambda z: z * np.uint64(0)):
            first, inv = float_row_groups(seq, [P])
    else:
        first, inv = float_row_groups(seq, [P])
    assert all(key[r] == key[first[inv[r]]] for r in range(len(rows)))
    assert (np.diff(seq[first]) >= 0).all()
    if not collide:
        assert len(first) == len(set(key))


@SETTINGS
@given(rows=st.lists(st.tuples(st.integers(0, 3),
                               st.lists(st.sampled_from([0.0, -0.0, 1.0, 2.5, np.nan, -7.0]),
                                        min_size=3, max_size=3)), min_size=1, max_size=40),
       chunk=st.integers(1, 7))
def test_float_compaction_hashes_in_chunks_like_at_once(rows, chunk):
    """Compaction hashes the rows compaction.HASH_CHUNK at a time (for the cache): any chunk
    size gives the same groups in the same order."""
    rows = sorted(rows, key=lambda r: r[0])
    seq = np.array([s for s, _ in rows])
    P = np.asfortranarray(np.array([p for _, p in rows], dtype=float))
    ref = float_row_groups(seq, [P, np.abs(P)])
    with patch.object(compaction, "HASH_CHUNK", chunk):
        got = float_row_groups(seq, [P, np.abs(P)])
    assert all(np.array_equal(a, b) for a, b in zip(ref, got, strict=True))


@SETTINGS
@given(rows=st.lists(st.tuples(st.integers(0, 5),
                               st.sampled_from([0.0, -0.0, 1.0, 1.0 + 2.0 ** -52, 2.5, np.nan,
                                                -7.0, 2.0 ** -1074, 1e300])),
                     min_size=0, max_size=30))
def test_distinct_within_never_misses_a_repeat(rows):
    """The pre-test that lets a compaction keep its rows says "distinct" only when no two
    rows of one sequence hold the same value (−0.0 and 0.0 counted equal, NaN equal to
    itself), however close the values (1 and 1 + 2^-52 differ only in the bits it keeps
    out); without ties in the bits it keeps it says so."""
    rows = sorted(rows, key=lambda r: r[0])
    seq = np.array([s for s, _ in rows], dtype=np.int64)
    col = np.array([v for _, v in rows], dtype=float)
    values = [(s, "nan" if np.isnan(v) else v + 0.0) for s, v in rows]
    repeats = len(set(values)) < len(values)
    got = distinct_within(seq, col)
    assert not (got and repeats)
    shift = max(int(seq.max(initial=0)).bit_length(), 1)
    kept = [(s, int((np.float64(v) + 0.0).view(np.uint64)) >> shift) for s, v in rows]
    assert got == (len(set(kept)) == len(kept))


@pytest.mark.parametrize("writes", [False, True])
def test_dense_pass_shows_an_overflow_wherever_the_plain_pass_does(writes):
    """A unit that overflows (relu(inf)) times a zero output weight is nan in a plain float64
    pass; the dense reference, which skips the columns a residual FF does not write, must
    still show it, not hand back a finite row."""
    W = np.array([[1.0 if writes else 0.0], [0.0]])
    ff = FF(1.0, np.array([[1e200, 0.0]]), np.array([0.0]), W)
    model = Transformer(d=2, attention="hardmax", blocks=[Block(ff, None)], exact=False)
    x = np.array([[1e200, 1.0]])
    with np.errstate(all="ignore"):
        plain = x + np.maximum(x @ ff.U.T + ff.b, 0.0) @ ff.W.T
        got = ef.evaluate.dense_forward(model, [x])[0]
    assert np.array_equal(np.isnan(got), np.isnan(plain)) and np.isnan(got).any()
    assert ef.evaluate.dense_forward(model, []) == []
