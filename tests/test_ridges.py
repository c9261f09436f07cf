"""The batch recognition of float64 hat layers and the batch run planning against a
straightforward per-layer reference: the same ridge windows (ends, units), the same runs, and
the same outputs and radii of ``enclose`` (docs/numerics.md#ridge-windows)."""

from __future__ import annotations

import math
from fractions import Fraction
from unittest import mock

import numpy as np
from conftest import datasets, paper
from hypothesis import HealthCheck, assume, event, example, given, settings
from hypothesis import strategies as st

import exactformer as ef
import exactformer.evaluate.windows as ridge_windows
from exactformer import evaluate
from exactformer.construct.generic import ConstructionError
from exactformer.evaluate import Arithmetic, Ridge, enclose, enclosure, jobs, runs
from exactformer.model import FF, SA, Block, Head, ScoreMatrix, Transformer, ValueMatrix

FLOAT = Arithmetic("float")


# ------------------------------------------------------------------------------ reference
def ref_hat_groups(ff: FF):
    """Per layer: units sorted by −b (stable) close a hat where their column signs (±w of the
    hat's first column) sum to 0 and Σ ±b is exactly 0. When that fails (hats touching at a
    shared breakpoint can tie there in the wrong order), the units in their own order, each
    hat then sorted by −b and the hats by their largest b, downwards, and the hats closed again
    in that order (a part of a hat whose units cancel, two at one breakpoint, closes as a
    window of its own). An infinite bias makes no hat."""
    U, b, W = ff.U, ff.b, ff.W
    if ff.eta != 1 or U.dtype != float or not U[0].any() or not (U == U[0]).all():
        return None
    if b.dtype != float or W.dtype != float or not np.isfinite(b).all():
        return None
    groups = ref_closing(b, W, np.argsort(-b, kind="stable").tolist())
    if groups is not None:
        return groups
    groups = ref_closing(b, W, list(range(len(b))))
    if groups is None:
        return None
    groups = [sorted(g, key=lambda i: (-b[i], i)) for g in groups]
    order = [i for g in sorted(groups, key=lambda g: -b[g].max()) for i in g]
    return ref_closing(b, W, order)  # in that order a hat may close early: a zero-sum part


def ref_closing(b, W, order):
    """The hats of units taken in ``order``, or None."""
    groups, cur, w, total, terms = [], [], None, 0, []
    for i in order:
        col = W[:, i]
        if not cur:
            w, sign = col, 1
        elif (col == w).all():
            sign = 1
        elif (col == -w).all():
            sign = -1
        else:
            return None
        cur.append(i)
        total += sign
        terms.append(sign * float(b[i]))
        if total == 0 and math.fsum(terms) == 0 and w.any():
            groups.append(cur)
            cur, terms = [], []
    return groups if not cur and groups else None


def ref_ridges(ff: FF | None, params: FF | None = None, ar: Arithmetic = FLOAT):
    """One layer's windows: hats by :func:`ref_hat_groups` with ends −max b, −min b (in the
    pass's arithmetic) and units from ``params``, anything else by the general test."""
    if ff is None:
        return None
    params = ff if params is None else params
    groups = ref_hat_groups(ff)
    if groups is None:
        return ridge_windows._ridge_cuts(ff, params, ar)
    return [(Ridge(ar.array(ff.U[0]), ar.scalar(float(-ff.b[g].max())),
                   ar.scalar(float(-ff.b[g].min()))),
             FF(params.eta, params.U[g], params.b[g], params.W[:, g])) for g in groups]


def ref_form(U, b, W):
    """(f, σ, w, ω) of one window, or None (the gadget test of docs/numerics.md#enclosures)."""
    def moderate(v, e):
        return bool(((v >= 2.0 ** -e) & (v <= 2.0 ** e)).all())

    def split(rows):
        lead = rows[0]
        nz = np.abs(lead[lead != 0])
        if not len(nz) or not moderate(nz, 500):
            return None
        same, flipped = (rows == lead).all(axis=1), (rows == -lead).all(axis=1)
        if (same | flipped).all():
            return lead, np.where(same, 1.0, -1.0)
        j = int(np.flatnonzero(lead)[0])
        with np.errstate(all="ignore"):
            k = rows[:, j] / lead[j]
            if not ((np.frexp(np.abs(k))[0] == 0.5).all() and moderate(np.abs(k), 400)
                    and (rows == k[:, None] * lead).all()):
                return None
        return lead, k
    a, c = split(U), split(W.T)
    if a is None or c is None:
        return None
    with np.errstate(all="ignore"):
        scaled = np.abs(c[1] * b)
    if not ((b == 0) | ((scaled >= 2.0 ** -1000) & (scaled <= 2.0 ** 1000))).all():
        return None
    slopes = np.abs(a[1] * c[1])
    if slopes.max() > 2.0 ** 40 * slopes.min():
        return None
    return a[0], a[1], c[0], c[1]


def ref_plan_runs(blocks, ridges) -> dict:
    """Block by block: a block joins the current run when all its windows are gadgets on
    their ridge's f and its first window has the width and f of the previous block's."""
    found, cur = {}, []

    def close():
        if len(cur) >= 2:
            rows = [(i, *p) for i, parts in cur for p in parts]
            if len({len(r[4]) for r in rows}) != 1:
                rows = []
            found[cur[0][0]] = runs.Run(
                cur[0][0], cur[-1][0] + 1, rows[0][1] if rows else None,
                *(np.array([r[k] for r in rows]) for k in (0, 2, 3, 4, 5, 6, 7)))
        cur.clear()

    for i, (blk, ridge) in enumerate(zip(blocks, ridges, strict=True)):
        parts = None
        if blk.ff is not None and ridge is not None and (blk.sa is None or blk.sa.is_identity()):
            parts = []
            for r, part in ridge:
                form = ref_form(part.U, part.b, part.W)
                if form is None or not np.array_equal(form[0], r.f):
                    parts = None
                    break
                f, sig, w, om = form
                f, lo, hi, sig = ref_unscaled(f, float(r.lo), float(r.hi), sig)
                parts.append((f, lo, hi, sig, part.b, om, w))
        if parts is None or (cur and (len(cur[-1][1][0][3]) != len(parts[0][3])
                                      or not np.array_equal(cur[-1][1][0][0], parts[0][0]))):
            close()
        if parts is not None:
            cur.append((i, parts))
    close()
    return found


def ref_unscaled(f, lo, hi, sig):
    """A window on f·x as the same window on g·x, f = 2^e·g with g's first nonzero entry in
    [1, 2) (layers balanced by a power of two join one run), when every value stays exact."""
    lead = float(f[np.flatnonzero(f)[0]])
    e = math.frexp(abs(lead))[1] - 1
    g = np.array([math.ldexp(v, -e) for v in f])
    new = (math.ldexp(lo, -e), math.ldexp(hi, -e), np.array([math.ldexp(v, e) for v in sig]))
    back = [math.ldexp(v, e) for v in g] == list(f) and math.ldexp(new[0], e) == lo and \
        math.ldexp(new[1], e) == hi and [math.ldexp(v, -e) for v in new[2]] == list(sig)
    return (g, *new) if back else (f, lo, hi, sig)


def ref_ridges_of(ffs, params, ar):
    assert ar.kind == "float" and all(p is f for p, f in zip(params, ffs, strict=True))
    return [ref_ridges(ff) for ff in ffs]


# ------------------------------------------------------------------------------ comparison
def bits(a) -> tuple:
    """Bytes of a float array (signed zeros and NaN payloads included); the values and their
    types for an object array (exact and mpmath passes)."""
    a = np.asarray(a)
    if a.dtype == object:
        return a.shape, [(type(v), v) for v in a.flat]
    return a.dtype.str, a.shape, np.ascontiguousarray(a).tobytes()


def assert_same_ridges(got, want) -> None:
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert (g is None) == (w is None), f"block {i}: window or dense differs"
        if g is None:
            continue
        assert len(g) == len(w), f"block {i}: number of windows"
        for (rg, pg), (rw, pw) in zip(g, w, strict=True):
            assert bits(rg.f) == bits(rw.f), f"block {i}: f"
            assert bits(rg.lo) == bits(rw.lo) and bits(rg.hi) == bits(rw.hi), f"block {i}: ends"
            assert pg.eta == pw.eta
            for k in "UbW":
                assert bits(getattr(pg, k)) == bits(getattr(pw, k)), f"block {i}: units {k}"


def assert_same_runs(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for k, g in got.items():
        w = want[k]
        assert (g.start, g.end) == (w.start, w.end)
        assert (g.f is None) == (w.f is None)
        if g.f is not None:
            assert bits(g.f) == bits(w.f)
        for name in ("layer", "lo", "hi", "sig", "b", "om", "w"):
            assert bits(getattr(g, name)) == bits(getattr(w, name)), f"run {k}: {name}"


def converted(ff: FF | None, ar: Arithmetic) -> FF | None:
    return None if ff is None else ff.converted(ar.scalar, ar.array)


def assert_same_preparation(blocks) -> None:
    ffs = [b.ff for b in blocks]
    got, want = evaluate.ridges_of(ffs, ffs, FLOAT), [ref_ridges(ff) for ff in ffs]
    assert_same_ridges(got, want)
    assert_same_runs(runs.plan_runs(blocks, got), ref_plan_runs(blocks, want))


def assert_same_enclosure(model, xs) -> None:
    """``enclose`` with the batch preparation and with the reference one: bitwise equal."""
    rad = [np.zeros_like(x) for x in xs]
    out, r = enclose(model, xs, rad)
    with mock.patch.object(jobs, "ridges_of", ref_ridges_of), \
            mock.patch.object(runs, "plan_runs", ref_plan_runs):
        ref_out, ref_r = enclose(model, xs, rad)
    for a, b in zip(out + r, ref_out + ref_r, strict=True):
        assert bits(a) == bits(b)


# ------------------------------------------------------------------------------ layers
SCALES = [0.0, 1.0, 3.0, 2.0 ** 60, 1e16, 2.0 ** -30, 2.0 ** -1010, 2.0 ** 1000]


@st.composite
def hats(draw, d: int, f):
    """One hat on t = f·x as (biases, columns): 4 units (w, −w, −w, w: flat top), 3 units
    (w, −2w, w) or 2 units (w, −w at one breakpoint, a window of width 0), at a random place
    and scale; breakpoints may coincide and biases may be −0.0."""
    entries = st.sampled_from([0.0, -0.0, 1.0, -1.0, 0.5, 3.0, 2.0 ** 13, 2.0 ** -520])
    w = np.array(draw(st.lists(entries, min_size=d, max_size=d)))
    if not w.any():
        w[draw(st.integers(0, d - 1))] = 1.0
    w = w * draw(st.sampled_from([1.0, -1.0, 1e5]))
    centre = draw(st.sampled_from(SCALES)) * draw(st.sampled_from([1.0, -1.0]))
    steps = draw(st.lists(st.sampled_from([0.0, 1.0, 0.5, 2.0 ** -20, 2.0]), min_size=3,
                          max_size=3))
    kind = draw(st.sampled_from(["flat", "flat", "three", "pair"]))
    if kind == "pair":
        breaks, omega = [centre, centre], [1.0, -1.0]
    elif kind == "three":
        breaks, omega = [centre, centre + steps[0], centre + 2 * steps[0]], [1.0, -2.0, 1.0]
    else:
        breaks = list(np.cumsum([centre, *steps]))
        omega = [1.0, -1.0, -1.0, 1.0]
    return [-v for v in breaks], [o * w for o in omega]


@st.composite
def hat_layers(draw, d: int, f=None):
    """A layer of one to three hats on one row f, its units shuffled, then (usually) spoiled
    in one way: a column's sign flipped, a bias moved by one ulp, a second direction, a zero
    column, η ≠ 1, a column scaled by 2, a nonfinite value."""
    if f is None:
        f = np.array(draw(st.lists(st.sampled_from([0.0, -0.0, 1.0, -1.0, 0.25, 3.0, 2.0 ** -501]),
                                   min_size=d, max_size=d)))
    b, cols = [], []
    for _ in range(draw(st.integers(1, 3))):
        hb, hc = draw(hats(d, f))
        b += hb
        cols += hc
    h = len(b)
    order = draw(st.permutations(range(h)))
    U = np.array([f] * h, dtype=float)
    b = np.array([b[i] for i in order], dtype=float)
    W = np.array([cols[i] for i in order], dtype=float).T.copy()
    eta = 1.0
    k = draw(st.integers(0, h - 1))
    spoil = draw(st.sampled_from(["none"] * 9 + ["sign", "ulp", "direction", "zero", "eta",
                                                 "double", "nan", "inf", "signed zero"]))
    if spoil == "sign":
        W[:, k] = -W[:, k]
    elif spoil == "ulp":
        b[k] = np.nextafter(b[k], draw(st.sampled_from([math.inf, -math.inf])))
    elif spoil == "direction":
        U[k] = np.roll(f, 1) + 1.0
    elif spoil == "zero":
        W[:, k] = 0.0
    elif spoil == "eta":
        eta = draw(st.sampled_from([0.0, 0.5]))
    elif spoil == "double":
        W[:, k] = 2 * W[:, k]
    elif spoil in ("nan", "inf"):
        which = draw(st.sampled_from(["U", "b", "W"]))
        v = math.nan if spoil == "nan" else -math.inf
        if which == "U":
            U[k, 0] = v
        elif which == "b":
            b[k] = v
        else:
            W[0, k] = v
    elif spoil == "signed zero":
        U[k] = np.where(U[k] == 0, -U[k], U[k])
    return FF(eta, U, b, W)


IDENTITY = SA(1.0, heads=[Head(ScoreMatrix(0.0, np.zeros(2), np.zeros(2)),
                               ValueMatrix(0.0, np.zeros(2), np.zeros(2)))])


def mixing(d: int) -> SA:
    e = np.eye(d)[0]
    return SA(1.0, heads=[Head(ScoreMatrix(0.0, e, e), ValueMatrix(0.0, e, e))])


@st.composite
def hat_stacks(draw, d: int = 2):
    """Several blocks of hat layers, mostly on one shared f (so they form runs), sometimes
    of another width or f, without FF, or with attention between them."""
    f = np.array(draw(st.lists(st.sampled_from([1.0, -1.0, 0.25, 0.0, 2.0 ** 501]), min_size=d,
                               max_size=d)))
    if not f.any():
        f[0] = 1.0
    blocks = []
    for _ in range(draw(st.integers(1, 8))):
        ff = draw(st.one_of(hat_layers(d, f), hat_layers(d, f), hat_layers(d), st.none()))
        sa = draw(st.sampled_from([None, None, None, "identity", "mixing"]))
        blocks.append(Block(ff, {None: None, "identity": IDENTITY, "mixing": mixing(d)}[sa]))
    return blocks


# ------------------------------------------------------------------------------ tests
ENTRIES = [0.0, -0.0, 1.0, -1.0, 3.0, 0.375, 2.0 ** -501, 2.0 ** -499, 2.0 ** 501, math.inf,
           math.nan]
SCALE = [1.0, 1.0, -1.0, 2.0, -0.5, 3.0, 0.0, 2.0 ** -401, 2.0 ** 399, 2.0 ** 40, 2.0 ** -41]


@st.composite
def scaled_rows(draw, h: int, d: int):
    """h rows k_i·lead (k_i from powers of two, ±1, 0, 3), now and then one row of its own."""
    lead = np.array(draw(st.lists(st.sampled_from(ENTRIES), min_size=d, max_size=d)))
    with np.errstate(all="ignore"):  # 0·inf
        rows = np.array([draw(st.sampled_from(SCALE)) * lead for _ in range(h)])
    if draw(st.integers(0, 4)) == 0:
        rows[draw(st.integers(0, h - 1))] = draw(st.lists(st.sampled_from(ENTRIES), min_size=d,
                                                          max_size=d))
    return rows


@st.composite
def windows(draw):
    h, d = draw(st.integers(1, 4)), draw(st.integers(1, 3))
    b = np.array(draw(st.lists(st.sampled_from([0.0, -0.0, 1.0, -3.0, 2.0 ** -1001, 2.0 ** 1001,
                                                2.0 ** -990, 1e16, math.nan]),
                               min_size=h, max_size=h)))
    return draw(scaled_rows(h, d)), b, draw(scaled_rows(h, d)).T.copy()


@settings(max_examples=200, deadline=None)
@given(window=windows())
def test_gadget_forms_as_the_reference(window):
    """The batch gadget test on one window: the same form (bitwise) or the same refusal."""
    with np.errstate(all="ignore"):
        got = enclosure.gadget_form(*window)
    want = ref_form(*window)
    assert (got is None) == (want is None)
    if got is not None:
        assert [bits(a) for a in got] == [bits(a) for a in want]


@settings(max_examples=150, deadline=None)
@given(ff=st.integers(1, 3).flatmap(hat_layers))
@example(ff=FF(1.0, np.ones((4, 1)), np.array([0.0, -1.0, -2.0, -3.0]),
               np.array([[1.0, -1.0, -1.0, 1.0]])))
@example(ff=FF(1.0, np.ones((4, 1)), np.array([1e16, 1e16 - 2, 1e16 - 4, 1e16 - 6]) * -1,
               np.array([[1.0, -1.0, -1.0, 1.0]])))
@example(ff=FF(1.0, np.tile([0.0, 0.0, 1.0], (8, 1)), -np.array([0.0, 1, 1, 2, 0, 1, 0, 1]),
               np.array([[0.0] * 8, [0.0] * 8, [1, -1, -1, 1, 0.5, -0.5, -0.5, 0.5]])))
def test_hat_layers_as_the_reference(ff):
    """One layer, hat or almost hat: the same windows as the per-layer reference."""
    want = ref_ridges(ff)
    event("hats" if ref_hat_groups(ff) else "other window" if want else "dense")
    assert_same_ridges(evaluate.ridges_of([ff], [ff], FLOAT), [want])


def test_hats_are_recognised_and_cut():
    """Two hats with different output columns in one layer become two windows; a flipped sign
    or a bias off by one ulp makes the layer no window at all."""
    b = -np.array([0.0, 1.0, 2.0, 3.0, 10.0, 11.0, 12.0, 13.0])
    W = np.array([[1.0, -1.0, -1.0, 1.0, 0.0, 0.0, 0.0, 0.0],
                  [0.0, 0.0, 0.0, 0.0, 2.0, -2.0, -2.0, 2.0]])
    ff = FF(1.0, np.ones((8, 1)), b, W)
    [got] = evaluate.ridges_of([ff], [ff], FLOAT)
    assert [(r.lo, r.hi) for r, _ in got] == [(0.0, 3.0), (10.0, 13.0)]
    assert [p.W.tolist() for _, p in got] == [W[:, :4].tolist(), W[:, 4:].tolist()]
    flipped = FF(1.0, ff.U, b, W * np.array([1, 1, 1, 1, 1, 1, 1, -1.0]))
    off = FF(1.0, ff.U, np.where(b == -13.0, np.nextafter(-13.0, 0), b), W)
    assert evaluate.ridges_of([flipped, off], [flipped, off], FLOAT) == [None, None]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(blocks=st.integers(1, 3).flatmap(hat_stacks))
def test_runs_as_the_reference(blocks):
    """Stacks of (almost) hat layers: the same windows and the same runs."""
    assert_same_preparation(blocks)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(blocks=st.integers(1, 3).flatmap(hat_stacks), kind=st.sampled_from(["exact", "mp"]))
def test_exact_and_mp_windows_as_the_reference(blocks, kind):
    """The windows of an exact or mpmath pass of a float64 model: ends and units in the pass's
    numbers, the same as the reference's."""
    ar = Arithmetic(kind, 30)
    ffs = [b.ff for b in blocks]
    assume(all(np.isfinite(a).all() for ff in ffs if ff is not None for a in (ff.U, ff.b, ff.W)))
    params = [converted(ff, ar) for ff in ffs]
    assert_same_ridges(evaluate.ridges_of(ffs, params, ar),
                       [ref_ridges(ff, p, ar) for ff, p in zip(ffs, params, strict=True)])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(blocks=hat_stacks(2), xs=st.lists(st.lists(st.tuples(*[st.integers(-12, 4)] * 2),
                                                 min_size=1, max_size=4, unique=True),
                                        min_size=1, max_size=3))
def test_enclosure_of_hat_stacks_as_the_reference(blocks, xs):
    """Hand-made stacks of almost hats: ``enclose`` gives bitwise the same outputs and radii
    with the batch preparation as with the reference one."""
    model = Transformer(d=2, attention="hardmax", blocks=blocks, exact=False)
    assert_same_enclosure(model, [np.array(x, dtype=float) for x in xs])


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=datasets(max_pool=5), shape=st.sampled_from([(4, 1), (8, 2)]),
       rational=st.booleans())
def test_constructed_models_as_the_reference(data, shape, rational):
    """Constructed float64 models (width 4, or 8 with two heads) and rational constructions
    converted with ``to_float()``: the same preparation and the same enclosure."""
    try:
        model = paper(data, exact=rational, seed=0, width=shape[0], heads=shape[1])
    except (ConstructionError, ef.DatasetError):
        assume(False)
    model = model.to_float() if rational else model
    assert_same_preparation(model.blocks)
    xs, _ = data.floats()
    assert_same_enclosure(model, xs)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(-1e3, 1e3, allow_nan=False).filter(lambda v: v != 0), min_size=2,
                max_size=5),
       st.lists(st.sampled_from([1.0, -1.0, 2.0, 0.5, -3.0, 2.0 ** -40, 0.0]), min_size=2,
                max_size=4),
       st.integers(0, 10 ** 6))
def test_direction_scales_finds_every_exact_multiple_and_no_other(f, ks, where):
    """Rows k·f (k a power of two or ±3: k·f exact unless it rounds, which the test avoids
    by keeping only exact products) are one direction with those scales; a row moved by one
    ulp in one entry is none (the float cross-product refutation must not reject the
    first, and the Fractions must reject the second)."""
    f = np.array(f)
    U = np.array([np.array(k) * f for k in ks])
    if not all(Fraction(float(k * v)) == Fraction(k) * Fraction(v) for k in ks for v in f):
        return  # ±3·f rounded: not an exact multiple
    found = ridge_windows.direction_scales(U)
    nz = [k for k in ks if k != 0]
    if not nz:
        assert found is None
        return
    assert found is not None
    first = nz[0]
    assert [Fraction(k) for k in found[1]] == [Fraction(k) / Fraction(first) for k in ks]
    i = [j for j, k in enumerate(ks) if k != 0][-1]
    if i == [j for j, k in enumerate(ks) if k != 0][0]:
        return  # one nonzero row: any change keeps it one direction
    c = where % len(f)
    U[i, c] = np.nextafter(U[i, c], np.inf)
    assert ridge_windows.direction_scales(U) is None
