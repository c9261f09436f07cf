"""The float64 enclosures behind ``verify`` never enclose too little.

``evaluate.enclose`` runs a float64 model in float64 and carries, per coordinate, a radius r
with |exact − float| ≤ r; ``verify`` accepts a pair without an exact pass when the enclosure
alone bounds its Hausdorff error by the limit (docs/verification.md). A radius that is too
small is a wrong OK, so every test here checks the radii against an exact evaluation written
in this file: Fractions, dense (every token, every layer, every head, A = α·I + a·cᵀ and
V = β·I + p·qᵀ as d×d matrices, hardmax averaging the exact argmax set), with no multisets,
ridge windows or float pre-filters.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from conftest import datasets, make_dataset, paper
from conftest import hausdorff as float_hausdorff
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

import exactformer as ef
from exactformer import distance
from exactformer.construct.generic import ConstructionError
from exactformer.evaluate import enclose, enclosure, layers
from exactformer.model import FF, SA, Block, Head, ScoreMatrix, Transformer, ValueMatrix
from exactformer.verification import decide

TOLERANCE = 1e-9  # verify's default


# ------------------------------------------------------------------------------ reference
def exact(v) -> Fraction:
    """The exact value of a stored number; inf and nan have none (ValueError/OverflowError)."""
    return v if isinstance(v, Fraction) else Fraction(float(v))


def sparse(matrix) -> list[list[tuple[int, Fraction]]]:
    """Rows of ``matrix`` as (column, exact value) pairs of their nonzero entries."""
    return [[(j, exact(v)) for j, v in enumerate(row) if v != 0] for row in matrix]


def dense(s, u, v) -> list[list[tuple[int, Fraction]]]:
    """s·I + u·vᵀ as a sparse d×d matrix of exact values."""
    d = len(u)
    rows = [[exact(s) * (i == j) + exact(u[i]) * exact(v[j]) for j in range(d)]
            for i in range(d)]
    return sparse(rows)


def apply(M, x) -> list[Fraction]:
    return [sum((m * x[j] for j, m in row), Fraction(0)) for row in M]


def exact_block(blk):
    """A block's parameters as exact values: (η, U, b, Wᵀ) or None, (ρ, [(A, V)]) or None.
    Identity attention layers (ρ = 1, every V = 0) change nothing and are left out."""
    ff = None if blk.ff is None else (exact(blk.ff.eta), sparse(blk.ff.U),
                                      [exact(v) for v in blk.ff.b], sparse(blk.ff.W))
    sa = None
    if blk.sa is not None and not blk.sa.is_identity():
        sa = (exact(blk.sa.rho), [(dense(h.A.alpha, h.A.a, h.A.c),
                                   dense(h.V.beta, h.V.p, h.V.q)) for h in blk.sa.heads])
    return ff, sa


def ref_sequence(blocks, X: list[list[Fraction]]) -> list[list[Fraction]]:
    """One sequence through every block, token by token, in exact arithmetic."""
    for ff, sa in blocks:
        if ff is not None:
            eta, U, b, W = ff
            X = [[eta * x[k] + v for k, v in enumerate(
                apply(W, [max(Fraction(0), z + bk) for z, bk in zip(apply(U, x), b,
                                                                   strict=True)]))]
                 for x in X]
        if sa is not None:
            rho, heads = sa
            out = [[rho * v for v in x] for x in X]
            for A, V in heads:
                for i, x in enumerate(X):
                    Ax = apply(A, x)
                    S = [sum((s * t for s, t in zip(Ax, y, strict=True)), Fraction(0))
                         for y in X]
                    hit = [X[l] for l, s in enumerate(S) if s == max(S)]
                    mean = [sum(col, Fraction(0)) / len(hit) for col in zip(*hit, strict=True)]
                    out[i] = [o + v for o, v in zip(out[i], apply(V, mean), strict=True)]
            X = out
    return X


def ref_forward(model: Transformer, xs) -> list[list[list[Fraction]]]:
    """The exact evaluation of the model's stored numbers on the exact inputs ``xs``."""
    blocks = [exact_block(b) for b in model.blocks]
    return [ref_sequence(blocks, [[exact(v) for v in row] for row in x]) for x in xs]


def hausdorff_sq(out, target) -> Fraction:
    D = [[sum(((u - exact(v)) ** 2 for u, v in zip(a, b, strict=True)), Fraction(0))
          for b in target] for a in out]
    return max(max(min(r) for r in D), max(min(c) for c in zip(*D, strict=True)))


# ------------------------------------------------------------------------------ checks
def assert_contains(mids, rads, ref) -> int:
    """Every coordinate with a finite radius: the float value is finite and the exact value
    lies within the radius. Returns how many coordinates had a finite radius."""
    checked = 0
    for j, (mid, rad, out) in enumerate(zip(mids, rads, ref, strict=True)):
        assert mid.shape == rad.shape == (len(out), len(out[0]))
        assert (rad >= 0).all(), f"sequence {j}: negative radius"
        for t, (m_row, r_row, e_row) in enumerate(zip(mid, rad, out, strict=True)):
            for k, (m, r, e) in enumerate(zip(m_row, r_row, e_row, strict=True)):
                if not math.isfinite(r):
                    continue
                checked += 1
                assert math.isfinite(m), f"sequence {j} token {t} coordinate {k}: float {m} " \
                                         f"with finite radius {r}"
                miss = abs(e - Fraction(float(m)))
                assert miss <= Fraction(float(r)), (
                    f"sequence {j} token {t} coordinate {k}: exact {float(e)!r}, float "
                    f"{m!r}, radius {r!r} < miss {float(miss)!r}")
    return checked


def enclose_exact_inputs(model, xs_exact):
    """The enclosure of exact inputs: their float images with radii from float_radius."""
    xs_f = [np.array([[float(v) for v in row] for row in x]) for x in xs_exact]
    radii = [enclosure.float_radius(np.array(x, dtype=object), f)
             for x, f in zip(xs_exact, xs_f, strict=True)]
    return enclose(model, xs_f, radii)


def check_containment(model, xs_exact) -> int:
    mids, rads = enclose_exact_inputs(model, xs_exact)
    return assert_contains(mids, rads, ref_forward(model, xs_exact))


def misses(model, data) -> bool:
    """Whether some pair's exact squared Hausdorff error exceeds (tolerance × scale)²."""
    xs, ys = data.fractions()
    scale = max(abs(v) for a in xs + ys for v in a.flat)
    limit = Fraction(TOLERANCE) * scale
    outs = ref_forward(model, xs)
    return any(hausdorff_sq(o, y) > limit * limit for o, y in zip(outs, ys, strict=True))


def assert_verdict_is_exact(model, data) -> str:
    """``verify`` says OK exactly when the exact evaluation fits every pair (non-finite float
    outputs fail on their own). Returns a line saying what decided."""
    report = ef.verify(model, data)
    miss = misses(model, data)
    if miss:
        assert not report.ok, f"wrong OK: {report.extra}"
    elif not report.nonfinite_pairs:
        assert report.ok, f"wrong FAILED: {report.extra}"
    return (f"verify {report.verdict()}, reference {'misses' if miss else 'fits'}, "
            f"{report.extra.get('decided by', '')}")


# ------------------------------------------------------------------------------ models
def transformer(blocks, d=2) -> Transformer:
    return Transformer(d=d, attention="hardmax", blocks=blocks, exact=False)


def ff(eta, U, b, W) -> FF:
    return FF(float(eta), np.array(U, dtype=float), np.array(b, dtype=float),
              np.array(W, dtype=float))


def hat(f, w, a, delta, slope=1.0) -> FF:
    """The 3-ReLU hat slope·(relu(t − a) − 2 relu(t − a − δ) + relu(t − a − 2δ))·w on
    t = f·x: zero outside (a, a + 2δ), height slope·δ·|w| at a + δ (docs/gadgets.md)."""
    f = np.asarray(f, dtype=float)
    U = np.array([slope * f] * 3)
    b = -slope * np.array([a, a + delta, a + 2 * delta])
    W = np.outer(np.asarray(w, dtype=float), [1.0, -2.0, 1.0])
    return FF(1.0, U, b, W)


def head(alpha, a, c, beta, p, q) -> Head:
    return Head(ScoreMatrix(float(alpha), np.array(a, dtype=float), np.array(c, dtype=float)),
                ValueMatrix(float(beta), np.array(p, dtype=float), np.array(q, dtype=float)))


# ------------------------------------------------------------------------------ constructed
DATA = st.one_of(datasets(N=None, max_pool=5), datasets(d=2, max_pool=5),
                 datasets(m_equals_n=True, max_pool=4), datasets(N=1),
                 datasets(single_token=True, max_pool=4))


def compiled(data, width: int, heads: int) -> Transformer:
    try:
        return paper(data, exact=False, seed=0, width=width, heads=heads)
    except (ConstructionError, ef.DatasetError):
        assume(False)  # data the float64 construction refuses (docs/verification.md)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=DATA, shape=st.sampled_from([(4, 1), (8, 2)]))
def test_constructed_models_are_enclosed(data, shape):
    """A float64 construction (width 4 or 8 with two heads) on random data, rational inputs
    included: every token's exact output lies within the enclosure of its float output."""
    model = compiled(data, *shape)
    xs, _ = data.fractions()
    event(f"{'rational' if data.exact else 'float'} data, width {shape[0]}")
    assert check_containment(model, xs) == data.total_n * data.d
    report = ef.verify(model, data)
    assert report.ok and not report.proved
    event(report.extra["decided by"])


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=DATA, shape=st.sampled_from([(4, 1), (8, 2)]), which=st.integers(0, 10 ** 6))
def test_constructed_models_fail_a_nudged_target(data, shape, which):
    """The same targets with one coordinate moved by 10⁻⁶ × scale: FAILED, whichever path
    decides it."""
    model = compiled(data, *shape)
    xs, ys = data.fractions()
    scale = max(abs(v) for a in xs + ys for v in a.flat)
    assume(scale > 0)
    j = which % data.N
    y = ys[j].copy()
    y[0, 0] += scale / 10 ** 6
    try:
        nudged = make_dataset(xs, [y if i == j else t for i, t in enumerate(ys)])
    except ef.DatasetError:
        assume(False)  # the nudge made two targets equal
    assert misses(model, nudged)
    assert not ef.verify(model, nudged).ok


# ------------------------------------------------------------------------------ random models
@st.composite
def values(draw, extreme: bool = True):
    """One float parameter: small integers and dyadics, arbitrary floats, powers of two up to
    2^±300, 10^16-style magnitudes that cancel, and (``extreme``) inf and nan."""
    kinds = ["int", "int", "float", "dyadic", "third", "power", "big"]
    kind = draw(st.sampled_from(kinds + (["special"] if extreme else [])))
    sign = draw(st.sampled_from([1.0, -1.0]))
    if kind == "int":
        return float(draw(st.integers(-3, 3)))
    if kind == "float":
        return draw(st.floats(-4, 4, allow_nan=False, allow_infinity=False))
    if kind == "dyadic":
        return sign * draw(st.integers(1, 7)) / 2.0 ** draw(st.integers(0, 6))
    if kind == "third":
        return sign / draw(st.sampled_from([3.0, 7.0, 10.0]))
    if kind == "power":
        return sign * 2.0 ** draw(st.sampled_from([-300, -299, -60, -53, -30, 30, 53, 299, 300]))
    if kind == "big":
        return sign * draw(st.sampled_from([1e16, 1e16 + 2, 2.0 ** 53 + 2, 1e-16]))
    return draw(st.sampled_from([math.inf, -math.inf, math.nan]))


def vectors(d: int, extreme: bool):
    zero = st.just([0.0] * d)
    return st.one_of(zero, st.lists(values(extreme), min_size=d, max_size=d))


@st.composite
def random_ffs(draw, d: int, extreme: bool, near: list[float]):
    """A dense FF with random units, or a 3-ReLU hat (unit or sloped, power-of-two or
    arbitrary slope) on a coordinate direction, starting at a random point or within a few
    ulps of ``near`` (the inputs' float coordinates), where rounding decides the side."""
    if draw(st.booleans()):
        w = draw(st.integers(1, 3))
        U = [draw(vectors(d, extreme)) for _ in range(w)]
        W = [draw(vectors(w, extreme)) for _ in range(d)]
        eta = draw(st.sampled_from([0.0, 1.0, 1.0, 0.5, -2.0]))
        return ff(eta, U, draw(st.lists(values(extreme), min_size=w, max_size=w)), W)
    k = draw(st.integers(0, d - 1))
    f = np.eye(d)[k] * draw(st.sampled_from([1.0, -1.0, 0.5]))
    slope = draw(st.sampled_from([1.0, 2.0 ** 20, 2.0 ** 40, 2.0 ** -20, 3.0]))
    if near and draw(st.booleans()):
        a = draw(st.sampled_from(near)) * f[k]
        for _ in range(draw(st.integers(-2, 2))):
            a = float(np.nextafter(a, math.inf))
        a -= draw(st.sampled_from([0.0, 0.0, 1.0, 2.0])) * 2.0 ** draw(st.integers(-40, 1))
    else:
        a = draw(st.integers(-8, 8)) / 4.0
    delta = 2.0 ** draw(st.integers(-40, 1))
    w = draw(st.lists(st.sampled_from([0.0, 1.0, -1.0, 4.0, 2.0 ** 13, 2.0 ** -30]),
                      min_size=d, max_size=d))
    return hat(f, w, a, delta, slope)


@st.composite
def random_sas(draw, d: int, extreme: bool):
    """ρ ∈ {0, 1, other} (ρ = 0 collapses equal points), one or two heads, each rank one
    (α = 0) or with an α·I part, V = β·I + p·qᵀ."""
    heads = []
    for _ in range(draw(st.integers(1, 2))):
        alpha = draw(st.one_of(st.just(0.0), st.just(0.0), values(extreme)))
        beta = draw(st.sampled_from([0.0, 0.0, 1.0, -0.5]))
        heads.append(head(alpha, draw(vectors(d, extreme)), draw(vectors(d, extreme)), beta,
                          draw(vectors(d, extreme)), draw(vectors(d, extreme))))
    return SA(draw(st.sampled_from([0.0, 1.0, 1.0, 0.5])), heads=heads)


@st.composite
def random_models(draw, d: int, extreme: bool = False, near: tuple = ()):
    """One to three random blocks; the FF and the SA of each may be absent (consecutive FFs
    then meet with no attention layer between them)."""
    blocks = []
    for _ in range(draw(st.integers(1, 3))):
        blocks.append(Block(draw(st.none() | random_ffs(d, extreme, list(near))),
                            draw(st.none() | random_sas(d, extreme))))
    return transformer(blocks, d)


@st.composite
def random_inputs(draw, d: int, rational: bool = False):
    """1 to 3 sequences of 1 to 4 distinct tokens from a shared pool, at a random scale;
    exact Fractions (rounded on the way into float64) when ``rational``."""
    scale = Fraction(2) ** draw(st.sampled_from([-200, -30, 0, 0, 0, 30, 200]))
    coord = st.fractions(-4, 4, max_denominator=5) if rational else \
        st.integers(-4, 4).map(Fraction)
    pool = draw(st.lists(st.tuples(*[coord] * d), min_size=1, max_size=5, unique=True))
    sets = draw(st.lists(st.frozensets(st.integers(0, len(pool) - 1), min_size=1, max_size=4),
                         min_size=1, max_size=3, unique=True))
    return [[[v * scale for v in pool[i]] for i in draw(st.permutations(sorted(s)))]
            for s in sets]


def float_coordinates(xs) -> tuple:
    return tuple(sorted({float(v) for x in xs for row in x for v in row}))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(d=st.integers(2, 3), data=st.data(), rational=st.booleans())
def test_random_models_are_enclosed(d, data, rational):
    """Random float64 models (dense FFs, hats with any slope, rank-one and α·I heads, ties,
    ρ = 0, 2^±300 and 10^16 magnitudes) on random inputs: wherever the radius is finite, the
    exact evaluation lies within it."""
    xs = data.draw(random_inputs(d, rational))
    model = data.draw(random_models(d, near=float_coordinates(xs)))
    checked = check_containment(model, xs)
    event("all radii finite" if checked == sum(len(x) for x in xs) * model.d else
          "some radii infinite" if checked else "no finite radius")


def own_targets(model, xs, nudge: Fraction | None):
    """The enclosure's float outputs as a target set per pair (one coordinate of one pair
    moved by ``nudge`` × scale); None when they are no valid float64 data."""
    mids, _ = enclose_exact_inputs(model, xs)
    ys = []
    for mid in mids:
        rows = {tuple(r) for r in mid.tolist()}
        if not all(v == 0 or 2.0 ** -1022 <= abs(v) < math.inf for r in rows for v in r):
            return None
        ys.append([list(r) for r in sorted(rows)])
    if nudge is not None:
        scale = max(max(abs(v) for x in xs for r in x for v in r),
                    max(abs(Fraction(v)) for y in ys for r in y for v in r))
        ys[0][0][0] = Fraction(ys[0][0][0]) + nudge * scale
    return ys


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(d=st.integers(2, 3), data=st.data(), rational=st.booleans(),
       nudge=st.sampled_from([None, Fraction(1, 10 ** 6), Fraction(1, 10 ** 12)]))
def test_verify_agrees_with_the_exact_evaluation(d, data, rational, nudge):
    """Random float64 models, inf and nan parameters included, with targets equal to their
    own float64 outputs or nudged: ``verify`` says OK exactly when the exact evaluation fits
    (a model with inf or nan parameters has no exact evaluation; it may pass only where its
    enclosure is finite, i.e. where its outputs do not depend on them)."""
    xs = data.draw(random_inputs(d, rational))
    model = data.draw(random_models(d, extreme=True, near=float_coordinates(xs)))
    try:
        exact_blocks = [exact_block(b) for b in model.blocks]
    except (ValueError, OverflowError):  # inf or nan where the exact evaluation needs it
        exact_blocks = None
    finite = all(math.isfinite(v) for v in model.parameters())
    try:
        ys = own_targets(model, xs, nudge)
    except ValueError:  # the float64 pass refuses a nan parameter
        assert not finite, "enclose refused a model with finite parameters"
        return
    assume(ys is not None)
    try:
        pairs = make_dataset([[[str(v) for v in r] for r in x] for x in xs],
                             [[[str(Fraction(v)) for v in r] for r in y] for y in ys])
    except ef.DatasetError:
        assume(False)  # equal inputs, or a target outside float64's normal range
    try:
        report = ef.verify(model, pairs)
    except ValueError:  # the exact pass reads every parameter, identity layers' too
        assert not finite, "verify refused a model with finite parameters"
        return
    if exact_blocks is None:  # no exact evaluation: an OK must not depend on the scores
        if report.ok:
            _, rads = enclose_exact_inputs(model, xs)
            assert all(np.isfinite(r).all() for r in rads)
        event(f"inf or nan parameters: verify {report.verdict()}")
        return
    event(assert_verdict_is_exact(model, pairs))


# ------------------------------------------------------------------------------ targeted
def pairs_of(xs, ys):
    """A dataset of exact values, written as strings so that nothing is rounded."""
    return make_dataset([[[str(Fraction(v)) for v in r] for r in x] for x in xs],
                        [[[str(Fraction(v)) for v in r] for r in y] for y in ys])


def assert_decided_exactly(model, xs) -> None:
    """Containment on ``xs``, and ``verify`` right both ways: OK against the exact outputs,
    FAILED against the float64 outputs wherever those differ from them by more than the
    limit (and against the exact outputs nudged by 10⁻⁶ × scale)."""
    assert check_containment(model, xs) > 0
    ref = ref_forward(model, xs)
    exact_sets = [sorted({tuple(r) for r in out}) for out in ref]
    assert ef.verify(model, pairs_of(xs, exact_sets)).ok
    mids, _ = enclose_exact_inputs(model, xs)
    floats = pairs_of(xs, [sorted({tuple(Fraction(v) for v in r) for r in m.tolist()})
                           for m in mids])
    assert ef.verify(model, floats).ok == (not misses(model, floats))
    scale = max(abs(v) for x in xs + exact_sets for r in x for v in r)
    nudged = [[(r[0] + scale / 10 ** 6, *r[1:]) for r in y] for y in exact_sets]
    assert not ef.verify(model, pairs_of(xs, nudged)).ok


E0, E1 = [1.0, 0.0], [0.0, 1.0]
TINY = Fraction(1, 2 ** 60)  # below half an ulp of 1: 1 ± TINY rounds to 1.0


@pytest.mark.parametrize("slope", [1.0, 2.0 ** 20, 3.0])
@pytest.mark.parametrize("where", [0, 1, 2])
@pytest.mark.parametrize("offset", [Fraction(0), TINY, -TINY])
def test_hat_with_a_token_at_a_breakpoint(slope, where, offset):
    """A token exactly at a hat's breakpoint (start, peak, end), or within less than an ulp
    of it on either side (exact inputs that round onto it)."""
    a, delta = 1.0, 0.25
    model = transformer([Block(hat(E0, E1, a, delta, slope))])
    bp = Fraction(a) + where * Fraction(delta) + offset
    assert_decided_exactly(model, [[[bp, Fraction(1, 2)], [Fraction(3), Fraction(1)]]])


@pytest.mark.parametrize("k", [1, 3, 5, 7])
def test_sloped_three_relu_hat(k):
    """A hat of slope 2^40 (the construction's sloped hats): tokens on its flanks, in exact
    arithmetic a third of an ulp of the flank apart, so float64 misplaces them by ~2^-12."""
    a, delta = 1.0, 2.0 ** -30
    model = transformer([Block(hat(E0, E1, a, delta, 2.0 ** 40))])
    x0 = Fraction(a) + k * Fraction(delta) / 4 + Fraction(1, 3 * 2 ** 53)
    assert_decided_exactly(model, [[[x0, Fraction(0)]], [[x0, Fraction(1)]]])


def rank_one_collapse(a, c) -> Transformer:
    """ρ = 0 and V = I: every token becomes the average of its argmax set under the scores
    (c·x_i)(a·x_l)."""
    return transformer([Block(None, SA(0.0, heads=[head(0.0, a, c, 1.0, [0, 0], [0, 0])]))])


def test_keys_within_one_ulp():
    """Two keys that float64 cannot tell apart (both round to 1.0): the float pass averages
    them, the exact evaluation takes the larger one only. The enclosure must hold both."""
    model = rank_one_collapse(E0, E1)
    xs = [[[1 + TINY, Fraction(1)], [1 + TINY / 2, Fraction(3)]]]
    assert_decided_exactly(model, xs)
    assert ref_forward(model, xs) == [[[1 + TINY, Fraction(1)]] * 2]
    floats = [[[1.0, 1.0], [float(np.nextafter(1.0, 2.0)), 3.0]]]  # decided in float64 too
    assert_decided_exactly(model, floats)


@pytest.mark.parametrize("offset", [TINY, -TINY, Fraction(0), Fraction(1, 2 ** 1000)])
def test_query_near_zero(offset):
    """A query c·x that is 0 in float64 but ±tiny exactly (or exactly 0): the exact argmax
    set is the largest key, the smallest, or every key."""
    model = rank_one_collapse(E1, [1.0, -1.0])
    q = [Fraction(1) + offset, Fraction(1)]
    xs = [[q, [Fraction(2), Fraction(5)], [Fraction(-1), Fraction(-4)]]]
    assert_decided_exactly(model, xs)


def test_general_alpha_head_with_near_ties():
    """α·I + a·cᵀ scores whose float values tie while the exact ones do not."""
    model = transformer([Block(None, SA(1.0, heads=[
        head(1.0, E0, E1, -0.5, [1, 0], [0, 1]), head(-2.0, [1, 1], E0, 0.0, [0, 1], [1, 1])]))])
    xs = [[[1 + TINY, Fraction(0)], [Fraction(1), TINY], [Fraction(-1), Fraction(0)]]]
    assert_decided_exactly(model, xs)


@settings(max_examples=50, deadline=None)
@given(v=st.fractions(), e=st.integers(-1060, 1000))
def test_float_radius_bounds_the_rounding(v, e):
    """``float_radius``: 0 exactly for values float64 holds, and a bound on the rounding
    otherwise (subnormals included; inf beyond the range)."""
    x = v * Fraction(2) ** e
    try:
        f = float(x)
    except OverflowError:
        f = math.inf
    (r,) = enclosure.float_radius(np.array([x], dtype=object), np.array([f]))
    if math.isinf(f):
        assert r == math.inf
    else:
        assert (r == 0) == (Fraction(f) == x)
        assert abs(x - Fraction(f)) <= Fraction(float(r))


@pytest.mark.parametrize("exponent", [-200, 0, 200])
@pytest.mark.parametrize("rational", [False, True])
def test_data_at_extreme_scales(exponent, rational):
    """Data at 10^±200 (floats, or exact values that floats only approximate). The float64
    construction refuses such scales, so the model is the rational construction rounded to
    float64: enclosed, and ``verify`` agrees with the exact evaluation, also for a target
    nudged by 10⁻⁶ × scale."""
    s = Fraction(10) ** exponent
    ints = [[[1, 2], [3, -1]], [[3, -1], [0, 4]], [[-2, 2]]]
    targets = [[[5, 5]], [[-1, 0], [2, 2]], [[0, 3]]]
    unit = Fraction(1, 3) if rational else Fraction(1)
    xs = [[[Fraction(float(v * s * unit)) for v in r] for r in x] for x in ints]
    if rational:
        xs = [[[v * s * unit for v in r] for r in x] for x in ints]
    ys = [[[Fraction(float(v * s)) for v in r] for r in y] for y in targets]
    data = pairs_of(xs, ys)
    model = paper(data, exact=True, seed=0).to_float()
    assert check_containment(model, xs) > 0  # at 10^200 some float64 values overflow
    assert_verdict_is_exact(model, data)  # float64 overflows at 10^200: FAILED as non-finite
    scale = max(abs(v) for y in ys for r in y for v in r)
    ys[0][0][0] += scale / 10 ** 6
    nudged = pairs_of(xs, ys)
    assert misses(model, nudged) and not ef.verify(model, nudged).ok


def test_float_pass_exact_but_exact_evaluation_misses():
    """x₀ + 10^16 − 10^16: exactly x₀, but 0 in float64, so the float pass lands on the
    target (0, 10^6) while the exact evaluation misses it by 1 = 10⁻⁶ × scale: FAILED."""
    up = ff(1, [[0, 0]], [1], [[1e16], [0]])
    down = ff(1, [[0, 0]], [1], [[-1e16], [0]])
    model = transformer([Block(up), Block(down)])
    data = pairs_of([[[1, 10 ** 6]]], [[[0, 10 ** 6]]])
    report = ef.verify(model, data)
    assert report.max_hausdorff_float64 == 0.0
    assert not report.ok and report.extra["hausdorff_exact"] == [1.0]
    assert misses(model, data)
    mids, rads = enclose_exact_inputs(model, data.fractions()[0])
    assert mids[0][0, 0] == 0.0 and rads[0][0, 0] >= 1.0
    assert check_containment(model, data.fractions()[0]) == 2


@st.composite
def boxes(draw, rows: int, d: int):
    """``rows`` boxes in R^d: centres from :func:`values` (inf and nan included) and radii
    that are 0, tiny, moderate or inf."""
    mid = np.array([draw(vectors(d, True)) for _ in range(rows)]).reshape(rows, d)
    rad = np.array(draw(st.lists(st.sampled_from([0.0, 0.0, 2.0 ** -1070, 1e-300, 1e-9, 0.5,
                                                  math.inf]), min_size=rows * d,
                                 max_size=rows * d))).reshape(rows, d)
    return mid, rad


@settings(max_examples=150, deadline=None)
@given(data=st.data(), n=st.integers(1, 4), m=st.integers(1, 3), d=st.integers(1, 3))
def test_hausdorff_upper_bounds_every_exact_set(data, n, m, d):
    """The upper bound ``verify`` accepts pairs by is at least the exact Hausdorff distance
    of any points chosen in the boxes (corners and centres, in Fractions), and nan when some
    centre or radius is not finite."""
    (O, o_rad), (Y, y_rad) = data.draw(boxes(n, d)), data.draw(boxes(m, d))
    (h,) = enclosure.hausdorff_upper(O[None], o_rad[None], Y[None], y_rad[None])
    finite = all(np.isfinite(a).all() for a in (O, o_rad, Y, y_rad))
    if not finite:
        assert math.isnan(h)  # nothing known: such a pair is never accepted
        return
    assert 0 <= h < math.inf
    pick = st.sampled_from([-1, 0, 1])
    points = [[[exact(c) + data.draw(pick) * exact(r) for c, r in zip(cs, rs, strict=True)]
               for cs, rs in zip(M, R, strict=True)] for M, R in ((O, o_rad), (Y, y_rad))]
    assert hausdorff_sq(*points) <= exact(h) ** 2


@settings(max_examples=100, deadline=None)
@given(data=st.data(), n=st.integers(1, 4), m=st.integers(1, 3), d=st.integers(1, 17))
def test_exact_targets_take_the_row_radius_once_bit_for_bit(data, n, m, d):
    """With exact targets (radius 0, every float data set) the bound reads |o_rad_i| once per
    row instead of |o_rad_i + 0| for every target: the same float sums, so the same bound to
    the bit as the radius of every (row, target) pair summed in the test."""
    (O, o_rad), (Y, _) = data.draw(boxes(n, d)), data.draw(boxes(m, d))
    y_rad = np.zeros_like(Y)
    (got,) = enclosure.hausdorff_upper(O[None], o_rad[None], Y[None], y_rad[None])
    with np.errstate(over="ignore", invalid="ignore"):
        D = distance.pair_distances(O[None], Y[None])
        R = np.sqrt(((o_rad[None, :, None, :] + y_rad[None, None, :, :]) ** 2).sum(axis=3))
        slack = 1 + (4 * d + 16) * enclosure.U
        h = distance.hausdorff_of(enclosure.up(D * slack + R * slack
                                               + 2 * d * enclosure.FLOOR, 4))[0]
    assert (math.isnan(got) and not math.isfinite(h)) or got == h


def test_pairs_are_stacked_like_one_at_a_time(monkeypatch):
    """``distance.per_pair`` (pairs of equal shapes stacked, in slices) gives what one call
    per pair gives, in the pairs' order, for mixed shapes and non-finite values."""
    rng = np.random.default_rng(0)
    shapes = [(3, 2), (1, 2), (3, 2), (5, 2), (3, 2), (1, 2), (3, 2)]
    outs = [rng.normal(size=s) for s in shapes]
    rads = [np.abs(rng.normal(size=s)) * 1e-12 for s in shapes]
    ys = [rng.normal(size=(1 + j % 2, 2)) for j in range(len(shapes))]
    yrs = [np.zeros_like(y) for y in ys]
    outs[2][1, 0], rads[4][0, 1] = math.nan, math.inf
    monkeypatch.setattr(distance, "STACK_CELLS", 8)  # slices of one or two pairs
    for fn, cols in ((enclosure.hausdorff_upper, (outs, rads, ys, yrs)),
                     (distance.hausdorff_stack, (outs, ys))):
        one = [float(fn(*(c[j][None] for c in cols))[0]) for j in range(len(outs))]
        got = distance.per_pair(fn, *cols)
        assert np.array_equal(got, one, equal_nan=True)
    assert [math.isnan(v) for v in distance.per_pair(enclosure.hausdorff_upper, outs, rads,
                                                   ys, yrs)] == [j in (2, 4) for j in range(7)]
    assert distance.per_pair(distance.hausdorff_stack, outs, ys) == pytest.approx(
        [math.nan if j == 2 else float_hausdorff(o, y)
         for j, (o, y) in enumerate(zip(outs, ys, strict=True))], nan_ok=True)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(datasets(max_pool=6, rational=False), st.sampled_from([(4, 1), (8, 2)]),
       st.integers(1, 7))
def test_attention_written_in_small_chunks_equals_one_chunk(data, shape, chunk):
    """Attention writes its terms in chunks of layers.WRITE_CHUNK rows (for the cache): any
    chunk size gives the same float outputs and radii, bit for bit (separation, ρ = 1, and
    the collapse, ρ = 0, with one or two heads)."""
    try:
        model = paper(data, exact=False, width=shape[0], heads=shape[1])
    except (ConstructionError, ef.DatasetError):
        assume(False)
    xs = data.floats()[0]
    ref = ef.forward(model, xs, "float"), *enclose(model, xs, None)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(layers, "WRITE_CHUNK", chunk)
        got = ef.forward(model, xs, "float"), *enclose(model, xs, None)
    for a, b in zip(ref, got, strict=True):
        assert all(np.array_equal(u, v) for u, v in zip(a, b, strict=True))


# ------------------------------------------------------------------------------ found here
def underflowing_hat() -> Transformer:
    """A ridge window on x₀ whose units are U_k = σ_k·f, W_k = ω_k·w with f = (2^540, 0),
    w = (2^540, 0) and (σ, ω) = (1, 1), (1, −1), (2^-540, 2^-540), (2^-540, −2^-540): on
    0 < x₀ < 2^-60 it adds x₀ − 2^-60 exactly, and every float product W_k·U_k is normal,
    but ω·σ = 2^-1080 of the small units underflows to 0 in float64."""
    p = 2.0 ** 540
    return transformer([Block(ff(1, [[p, 0], [p, 0], [1, 0], [1, 0]],
                                 [0, 2.0 ** -600, 0, -2.0 ** -60], [[p, -p, 1, -1], [0] * 4]))])


def test_gadget_slope_products_that_underflow():
    model = underflowing_hat()
    x = [[[Fraction(1, 2 ** 61), Fraction(0)]]]
    (out,) = ref_forward(model, x)
    assert out == [[Fraction(0), Fraction(0)]]  # x₀ + (x₀ − 2^-60) = 0
    data = pairs_of(x, [[[-Fraction(1, 2 ** 61), 0]]])  # the enclosure's midpoint
    assert misses(model, data)
    assert not ef.verify(model, data).ok
    check_containment(model, x)


def test_gadget_shift_products_that_underflow():
    """Units U = (1, 1, 1, 2)·e₀ kept in their order (not all equal), W = (2^600, −2^600,
    1, −1/2)·e₀: ω = (1, −1, 2^-600, −2^-601). At x₀ = 0 only the third unit is on and adds
    b = 2^-480 exactly, but ω·b = 2^-1080 underflows. Data at 2^-460, so the miss (2^-480) is
    a thousand times the limit while the enclosure's bound (~2^-507) is below it."""
    b0, b3 = -2.0 ** -1000, 2.0 ** -480 - 2.0 ** -452
    big = 2.0 ** 600
    model = transformer([Block(ff(1, [[1, 0]] * 3 + [[2, 0]],
                                  [b0, b0 + 2.0 ** -1052, 2.0 ** -480, 2 * b3],
                                  [[big, -big, 1, -0.5], [0] * 4]))])
    x = [[[Fraction(0), Fraction(1, 2 ** 460)]]]
    (out,) = ref_forward(model, x)
    assert out == [[Fraction(1, 2 ** 480), Fraction(1, 2 ** 460)]]
    data = pairs_of(x, x)
    assert misses(model, data)
    assert not ef.verify(model, data).ok
    check_containment(model, x)


def near_row_then_window() -> Transformer:
    """Three FF blocks with no attention between them. A: a slope-2^40 hat on x₀ starting
    at 1 that moves x₁. B: a hat on x₁ starting 2^-14 above 1/2 that moves x₀ by up to
    2^13·2^-10. C: x₁ ↦ 0 (x₁ − relu(x₁) + relu(−x₁)), so the radius of x₁ disappears."""
    s, lo, dl, k = 2.0 ** 40, 0.5 + 2.0 ** -14, 2.0 ** -10, 2.0 ** 13
    a = ff(1, [[s, 0]] * 3, [-s, -(s + 2.0 ** 20), -(s + 2.0 ** 21)], [[0] * 3, [1, -2, 1]])
    b = ff(1, [[0, 1]] * 3, [-lo, -(lo + dl), -(lo + 2 * dl)], [[k, -2 * k, k], [0] * 3])
    c = ff(1, [[0, 1], [0, -1]], [0, 0], [[0, 0], [-1, 1]])
    return transformer([Block(a), Block(b), Block(c)])


def test_radius_widened_near_a_window_reaches_the_next_window():
    """x₀ = 1 + 10^-16 rounds onto A's start: the float row stays out of A, the exact one
    enters it and x₁ grows by ~1.1e-4 into B, which moves x₀ by 0.4. The float pass sees
    none of it; the radius of x₁ (~2e-3) must reach B."""
    model = near_row_then_window()
    x = [[[1 + Fraction(1, 10 ** 16), Fraction(1, 2)]]]
    (out,) = ref_forward(model, x)
    assert abs(out[0][0] - Fraction(14, 10)) < Fraction(1, 100) and out[0][1] == 0
    data = pairs_of(x, [[[1, 0]]])  # the float64 output, enclosed within 2e-15
    assert misses(model, data)
    assert not ef.verify(model, data).ok
    check_containment(model, x)


def test_positions_of_a_set_to_set_model():
    """A /2 model file may store positions without being causal: verify must judge the
    model with them."""
    from exactformer.modelio import model_from_dict
    model = model_from_dict({"format": "exactformer.model/2", "d": 2, "attention": "hardmax",
                             "number": "float64", "blocks": [], "positions": [["5", "0"]],
                             "meta": {}})
    assert not model.causal
    (out,) = ef.forward(model, [np.array([[1.0, 2.0]])])
    assert out.tolist() == [[6.0, 2.0]]
    assert not ef.verify(model, pairs_of([[[1, 2]]], [[[1, 2]]])).ok


def test_projection_that_overflows_inside_a_window(monkeypatch):
    """f = (MAX, MAX), x = (3/2, −3/2): f·x = 0 exactly, the peak of a hat that adds (1, 0),
    but MAX·3/2 overflows and the float projection is inf − inf. Only the dense independent
    check (skipped for large data) saw the nan; with it skipped, the enclosure decides."""
    big = float(np.finfo(float).max)
    model = transformer([Block(ff(1, [[big, big]] * 3, [1, 0, -1], [[1, -2, 1], [0] * 3]))])
    x = [[[Fraction(3, 2), Fraction(-3, 2)]]]
    (out,) = ref_forward(model, x)
    assert out == [[Fraction(5, 2), Fraction(-3, 2)]]
    data = pairs_of(x, x)  # the float64 pass leaves the token where it was
    assert misses(model, data)
    monkeypatch.setattr(decide, "INDEPENDENT_BUDGET", 0)  # as for data beyond 2e9 operations
    assert not ef.verify(model, data).ok
    check_containment(model, x)


@pytest.mark.parametrize("side", [-1, 1])
def test_a_row_just_outside_a_steep_hat_keeps_a_small_radius(side):
    """Beyond a window the hat's units cancel exactly; the enclosure bounds a nearby row's
    change by the hat's slope times how far its box reaches in (3·2^-40 here, so about
    5·10^-5), not by the units' outputs, which are ~ slope × (distance to the far breakpoints)
    and would give a radius near 10."""
    lo, hi = 1.0, 1.0 + 2.0 ** -20
    half = (hi - lo) / 4
    hat = ff(1, [[1.0, 0.0]] * 4, [-lo, -(lo + half), -(hi - half), -hi],
             [[0.0] * 4, [1 / half, -1 / half, -1 / half, 1 / half]])
    x0 = lo - 2.0 ** -40 if side < 0 else hi + 2.0 ** -40
    model = transformer([Block(hat, None), Block(hat, None)])
    (out,), (rad,) = enclose(model, [np.array([[x0, 0.0]])], [np.array([[2.0 ** -38, 0.0]])])
    assert out.tolist() == [[x0, 0.0]]
    assert 2.0 ** -38 <= rad.max() < 1e-3


def test_a_radius_that_grows_inside_a_run_of_hat_layers():
    """Three hats on one direction are swept as a run: the first rounds the row by half an
    ulp, a 2^12 flank amplifies that, and a 2^40 hat starts 2^-45 beyond the row's float
    position. The windows were widened by the radii at the start of the run, so the row,
    whose radius grew on the way, must be given up rather than miss the last window."""
    e0, e1 = np.array([1.0, 0.0]), np.array([0.0, 1.0])

    def hat(a, delta, w, om):
        return FF(1.0, np.array([e0] * 3), -np.array([a, a + delta, a + 2 * delta]),
                  np.outer(w, om * np.array([1.0, -2.0, 1.0])))

    x0, x1, steep = 1 + 2.0 ** -52, 2 + 2.0 ** -50, 2.0 ** 12
    x2 = x1 + steep * 2.0 ** -30
    last = x2 - 2.0 ** -45
    model = transformer([Block(hat(0.5, 1.0, e0, 2.0)),
                         Block(hat(x1 - 2.0 ** -30, 2.0 ** -20, e0, steep)),
                         Block(hat(last - 2 * 2.0 ** -30, 2.0 ** -30, e1, 2.0 ** 40))])
    xs = [np.array([[x0, 0.0]])]
    (mid,), (rad,) = enclose(model, xs, [np.zeros((1, 2))])
    (exact,) = ef.forward(model, xs, "exact")
    assert float(exact[0][1]) > 0.9  # the last hat does move the exact point
    assert np.all(np.abs(np.array(exact, dtype=float) - mid) <= rad)
    data = ef.Dataset.from_arrays(inputs=[[[x0, 0.0]]], targets=[mid.tolist()])
    assert not ef.verify(model, data).ok


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=DATA)
def test_no_radii_means_exact_inputs(data):
    """``radii=None`` (exact float inputs) encloses exactly as explicit zero radii do."""
    model = compiled(data, 4, 1)
    xs, _ = data.floats()
    a = enclose(model, xs, None)
    b = enclose(model, xs, [np.zeros_like(x) for x in xs])
    for u, v in zip(a[0] + a[1], b[0] + b[1], strict=True):
        assert np.array_equal(u, v)
