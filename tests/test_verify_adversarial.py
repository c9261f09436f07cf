"""``verify`` never says yes wrongly: the cases that once fooled it (underflowing and huge
scores, NaN outputs, a tolerance floored at 1, float models that only work in one evaluator),
and random adversarial model files at every scale checked against an evaluation written here
(dense Fractions for hardmax, mpmath for softmax). See docs/verification.md."""

from __future__ import annotations

import math
from fractions import Fraction

import mpmath
import numpy as np
import pytest
from conftest import paper
from hypothesis import HealthCheck, assume, event, example, given, settings
from hypothesis import strategies as st

import exactformer as ef
from exactformer.construct.generic import ConstructionError
from exactformer.modelio import model_from_dict

FORMAT = "exactformer.model/1"


def model_doc(blocks, d=2, attention="hardmax", number="rational", tau=None) -> dict:
    doc = {"format": FORMAT, "d": d, "attention": attention, "number": number,
           "blocks": blocks, "meta": {}}
    if tau is not None:
        doc["tau"] = tau
    return doc


def attention_block(alpha, a, c, rho="1", beta="1", p=None, q=None, ff=None) -> dict:
    d = len(a)
    return {"ff": ff, "sa": {"rho": rho, "A": {"alpha": alpha, "a": a, "c": c},
                             "V": {"beta": beta, "p": p or ["0"] * d, "q": q or ["0"] * d}}}


def strings(rows) -> list:
    return [[str(v) for v in r] for r in rows]


# ------------------------------------------------------------------------------ independent
def ref_outputs(model, xs, dps=None) -> list[list[list]]:
    """Dense reference pass: Fractions (hardmax) or mpmath at ``dps`` digits (softmax); every
    token, every layer, A and V as d×d matrices, no shortcut of any kind."""
    conv = Fraction if dps is None else (lambda v: mpmath.mpf(Fraction(v).numerator)
                                         / Fraction(v).denominator)
    outs = []
    for x in xs:
        X = [[conv(v) for v in row] for row in x]
        for blk in model.blocks:
            X = ref_block(blk, X, model, conv)
        outs.append(X)
    return outs


def ref_block(blk, X, model, conv):
    def dot(u, v):
        return sum((s * t for s, t in zip(u, v, strict=True)), conv(0))

    def mat(s, u, v):  # s·I + u·vᵀ
        d = len(u)
        return [[conv(s) * (i == j) + conv(u[i]) * conv(v[j]) for j in range(d)]
                for i in range(d)]

    if blk.ff is not None:
        ff = blk.ff
        U = [[conv(v) for v in r] for r in ff.U]
        W = [[conv(v) for v in r] for r in ff.W]
        X = [[conv(ff.eta) * x[k] + sum((W[k][i] * max(conv(0), dot(U[i], x) + conv(ff.b[i]))
                                         for i in range(len(U))), conv(0))
              for k in range(len(x))] for x in X]
    if blk.sa is None or blk.sa.is_identity():
        return X
    A, V = mat(blk.sa.A.alpha, blk.sa.A.a, blk.sa.A.c), mat(blk.sa.V.beta, blk.sa.V.p,
                                                           blk.sa.V.q)
    out = []
    for x in X:
        Ax = [dot(r, x) for r in A]
        S = [dot(Ax, y) for y in X]
        if model.attention == "hardmax":
            wts = [conv(1) if s == max(S) else conv(0) for s in S]
        else:
            tau = conv(model.tau)
            wts = [mpmath.exp((s - max(S)) / tau) for s in S]
        mean = [sum((w * y[k] for w, y in zip(wts, X, strict=True)), conv(0)) / sum(wts)
                for k in range(len(x))]
        out.append([conv(blk.sa.rho) * x[k] + dot(V[k], mean) for k in range(len(x))])
    return out


def ref_hausdorff_sq(out, target, conv):
    D = [[sum(((u - conv(v)) ** 2 for u, v in zip(a, b, strict=True)), conv(0)) for b in target]
         for a in out]
    return max(max(min(r) for r in D), max(min(c) for c in zip(*D, strict=True)))


def ref_limit(data, tolerance) -> Fraction:
    xs, ys = data.fractions()
    return Fraction(tolerance) * max(abs(v) for a in xs + ys for v in a.flat)


# ------------------------------------------------------------------------------ regressions
def test_underflowing_scores_hardmax():
    """Scores below float64's normal range: the float pre-filter once picked key B (its
    rounded products are larger) although A has the larger exact score."""
    s, t = Fraction(1, 2 ** 547), Fraction(1, 2 ** 527)
    q, a, b = [s, s], [Fraction(2, 5) * t, Fraction(2, 5) * t], [Fraction(3, 5) * t, 0]
    model = model_from_dict(model_doc([attention_block("1", ["0", "0"], ["0", "0"])]))
    wrong = [[q[0] + b[0], q[1] + b[1]], [2 * a[0], 2 * a[1]], [2 * b[0], 0]]
    right = [[q[0] + a[0], q[1] + a[1]], *wrong[1:]]
    bad = ef.verify(model, ef.Dataset.from_arrays([strings([q, a, b])], [strings(wrong)]))
    assert not bad.ok and not bad.proved and bad.verdict() == "FAILED"
    good = ef.verify(model, ef.Dataset.from_arrays([strings([q, a, b])], [strings(right)]))
    assert good.ok and good.proved and "PROVED EXACT" in good.table()
    X = np.array([q, a, b], dtype=object)
    assert {tuple(r) for r in ef.predict(model, X)} == {tuple(r) for r in right}


@pytest.mark.parametrize("exponent", [-540, -520, 0, 500, 520, 1000])
@given(ints=st.lists(st.lists(st.integers(-50, 50), min_size=2, max_size=2), min_size=2,
                     max_size=5, unique_by=tuple), alpha=st.sampled_from(["1", "-1", "0"]))
@settings(max_examples=15, deadline=None)
def test_exact_hardmax_at_every_scale(exponent, ints, alpha):
    """Exact passes agree with the dense Fraction reference at scales from 2^-540 to 2^1000,
    where float64 scores underflow, lose precision as subnormals or overflow (data stay in
    float64's normal range, as the data rules require)."""
    e = Fraction(2) ** exponent
    X = [[e * v for v in r] for r in ints]
    model = model_from_dict(model_doc([attention_block(alpha, ["1", "-3/7"], ["2", "1"])]))
    (ref,) = ref_outputs(model, [X])
    (out,) = ef.forward(model, [np.array(X, dtype=object)], "exact")
    assert [list(r) for r in out] == ref
    target = {tuple(r) for r in ref}
    data = ef.Dataset.from_arrays([strings(X)], [strings(sorted(target))])
    assert ef.verify(model, data).proved


HUGE = {  # scores ~1e20: float64 scores once dropped the dominant key of this row
    "keys": ["25000000000000000002327/2500000000000", "12500000000000000953/1250000000",
             "10000000000000001407/1000000000"],
    "query": "1000000000000939/100000",
    "old": ["2.0", "10000000000.0000014070000000000000000000000000000000043534668", "1.0"]}


def huge_softmax():
    model = model_from_dict(model_doc(
        [attention_block("0", ["0", "1", "0"], ["0", "0", HUGE["query"]], rho="0")],
        d=3, attention="softmax", tau="100"))
    X = [[str(i), k, "1"] for i, k in enumerate(HUGE["keys"])]
    return model, X


def test_huge_softmax_scores_are_pruned_at_the_pass_precision():
    model, X = huge_softmax()
    report = ef.verify(model, ef.Dataset.from_arrays([X], [[HUGE["old"]]]))
    assert not report.ok and report.verdict() == "FAILED"
    assert report.extra["hausdorff_mp"][0] > 1e-29  # the 200-digit error is 1.0e-28
    data = ef.Dataset.from_arrays([X], [[HUGE["old"]]])
    with mpmath.workdps(200):
        (ref,) = ref_outputs(model, data.fractions()[0], dps=200)
        (out,) = ef.forward(model, data.fractions()[0], "mp", dps=200)
        assert max(abs(u - v) for r, s in zip(out, ref, strict=True)
                   for u, v in zip(r, s, strict=True)) < mpmath.mpf(10) ** -185
        assert abs(ref[0][0] - 2) > mpmath.mpf("1e-29")


def test_nan_outputs_fail():
    model = model_from_dict(model_doc([{"ff": {"eta": "1", "U": [["1e308", "0"]], "b": ["0"],
                                               "W": [["1"], ["0"]]}, "sa": None}],
                                      number="float64"))
    data = ef.Dataset.from_arrays([[[0.0, 1.0]], [[10.0, 0.0]]], [[[0.0, 1.0]], [[5.0, 5.0]]])
    report = ef.verify(model, data)
    assert not report.ok and report.nonfinite_pairs == [1]
    assert math.isnan(report.max_hausdorff_float64)
    assert report.to_dict()["ok"] is False and "FAILED" in report.table()
    assert "non-finite" in report.table()


def test_tolerance_is_relative_to_the_data_scale():
    identity = model_from_dict(model_doc([], number="float64"))
    data = ef.Dataset.from_arrays([[[1e-10, 0.0], [0.0, 1e-10]], [[2e-10, 0.0]]],
                                  [[[5e-10, 5e-10]], [[-3e-10, 0.0]]])
    report = ef.verify(identity, data)
    assert not report.ok and report.coordinate_scale == 5e-10
    same = ef.Dataset.from_arrays([[[1e-10, 0.0]]], [[[1e-10, 0.0]]])
    assert ef.verify(identity, same).ok


def test_all_zero_data_need_exact_outputs():
    zero = ef.Dataset.from_arrays([[[0.0, 0.0]]], [[[0.0, 0.0]]])
    assert ef.verify(model_from_dict(model_doc([], number="float64")), zero).ok
    shift = {"eta": "1", "U": [["0", "0"]], "b": ["1"], "W": [["1e-300"], ["0"]]}
    report = ef.verify(model_from_dict(model_doc([{"ff": shift, "sa": None}],
                                                 number="float64")), zero)
    assert not report.ok and report.coordinate_scale == 0


def test_float_model_verdict_is_the_exact_evaluation():
    """x₀ + 10^16 − 10^16 is x₀ exactly but 0 in float64 (x₀ = 1 is lost in the rounding):
    the float64 pass lands on the target, the model does not."""
    up = {"eta": "1", "U": [["0", "0"]], "b": ["1"], "W": [["1e16"], ["0"]]}
    down = {"eta": "1", "U": [["0", "0"]], "b": ["1"], "W": [["-1e16"], ["0"]]}
    model = model_from_dict(model_doc([{"ff": up, "sa": None}, {"ff": down, "sa": None}],
                                      number="float64"))
    data = ef.Dataset.from_arrays([[[1.0, 3.0]]], [[[0.0, 3.0]]])
    report = ef.verify(model, data)
    assert report.max_hausdorff_float64 == 0.0  # the fast float64 pass agrees with the data
    assert not report.ok and report.extra["hausdorff_exact"] == [1.0]
    assert "independent" in " ".join(report.extra) or any("torch" in k or "NumPy" in k
                                                           for k in report.extra)


def test_float_tolerance_is_compared_exactly():
    """An error 2^-100 above the limit fails and an error exactly at it passes: float
    rounding of the error cannot decide either."""
    limit = Fraction(1e-9)
    err = limit + Fraction(1, 2 ** 100)
    identity = model_from_dict(model_doc([], number="float64"))
    x, y = Fraction(1), Fraction(1) - err
    data = ef.Dataset.from_arrays([[[str(x), "0"]]], [[[str(y), "0"]]])
    assert not ef.verify(identity, data).ok
    exact = ef.Dataset.from_arrays([[[str(x), "0"]]], [[[str(x - limit), "0"]]])
    assert ef.verify(identity, exact).ok


# ------------------------------------------------------------------------------ proof plumbing
@pytest.fixture(scope="module")
def softmax_case():
    from exactformer.data import builtin
    data = builtin.uniform(N=3, n=3, m=2, d=2, seed=0)
    return paper(data, attention="softmax", exact=True, seed=0), data


def nudged(data, by: Fraction):
    """The data with the first coordinate of pair 0's first target moved by ``by``."""
    xs, ys = data.fractions()
    ys = [y.copy() for y in ys]
    ys[0][0, 0] += by
    return ef.Dataset.from_arrays([x.tolist() for x in xs], [y.tolist() for y in ys])


def test_softmax_verdict_follows_the_ball_bound(softmax_case):
    model, data = softmax_case
    exact = ef.verify(model, data)
    assert exact.proved and exact.verdict() == "PROVED EXACT" and "ball arithmetic" in exact.proof
    close = ef.verify(model, nudged(data, Fraction(1, 10 ** 45)))  # limit: 1e-40 × scale
    assert close.ok and not close.proved and close.verdict() == "OK"
    assert "not proved" in close.proof and close.extra["hausdorff_bound"][0] < 1e-40
    far = ef.verify(model, nudged(data, Fraction(1, 10 ** 30)))
    assert not far.ok and far.verdict() == "FAILED" and far.undecided_pairs == []


def test_hardmax_verdicts_per_model_kind():
    from exactformer.data import builtin
    data = builtin.demo()
    rational = ef.verify(paper(data, exact=True, seed=0), data)
    assert rational.proved and rational.verdict() == "PROVED EXACT"
    floats = ef.verify(paper(data, exact=False, seed=0), data)
    assert floats.ok and not floats.proved and floats.verdict() == "OK"
    assert floats.to_dict()["proved"] is False


# ------------------------------------------------------------------------------ adversarial
SCALES = st.integers(-300, 300).map(lambda k: Fraction(10) ** k)


@st.composite
def numbers(draw, scale, number):
    v = Fraction(draw(st.integers(-9, 9)), draw(st.sampled_from([1, 2, 3, 7]))) * scale
    if number == "float64":
        v = Fraction(float(v)) if draw(st.integers(0, 9)) else Fraction(1e308)
    return v


@st.composite
def adversarial(draw):
    """A small random model file and data at random scales (1e-300…1e300), with targets
    that are its own outputs, perturbed or not."""
    attention = draw(st.sampled_from(["hardmax", "softmax"]))
    number = draw(st.sampled_from(["rational", "float64"]))
    d = 2
    ps, xs_scale = draw(SCALES), draw(SCALES)

    def vec(n, scale=ps):
        return [draw(numbers(scale, number)) for _ in range(n)]

    blocks = []
    for _ in range(draw(st.integers(1, 2))):
        ff = None if draw(st.booleans()) else {
            "eta": str(draw(st.sampled_from([0, 1]))), "U": [[str(v) for v in vec(d)]],
            "b": [str(v) for v in vec(1)], "W": [[str(v)] for v in vec(d)]}
        alpha = str(vec(1)[0])
        blocks.append(attention_block(alpha, [str(v) for v in vec(d)],
                                      [str(v) for v in vec(d)], ff=ff,
                                      rho=str(draw(st.sampled_from([0, 1]))), beta="1"))
    tau = None
    if attention == "softmax":
        tau = str(Fraction(10) ** draw(st.integers(-3, 3)))
    model = model_from_dict(model_doc(blocks, d, attention, number, tau))
    n = draw(st.integers(1, 3))
    X = draw(st.lists(st.tuples(*[st.integers(-20, 20)] * d), min_size=n, max_size=n,
                      unique=True))
    X = [[Fraction(v) * xs_scale for v in r] for r in X]
    if number == "float64":
        X = [[Fraction(float(v)) for v in r] for r in X]
    perturb = draw(st.sampled_from([None, Fraction(1, 10 ** 6), Fraction(1, 10 ** 45)]))
    return model, X, perturb


def targets_from(model, X, perturb):
    """The model's own outputs (as a token set), nudged by ``perturb`` × scale."""
    if model.attention == "hardmax":
        (out,) = ref_outputs(model, [X])
    else:
        with mpmath.workdps(120):
            (out,) = ref_outputs(model, [X], dps=120)
            big = max(abs(v) for r in out for v in r)  # values 1e-100 below it become 0
            out = [[Fraction(mpmath.nstr(v, 80)) if abs(v) > big * mpmath.mpf(10) ** -100
                    else Fraction(0) for v in r] for r in out]
    rows = sorted({tuple(r) for r in out})
    scale = max(abs(v) for r in [*X, *rows] for v in r) or Fraction(1)
    if perturb is not None:
        rows = [(r[0] + perturb * scale, *r[1:]) for r in rows]
    return [[str(v) for v in r] for r in rows]


def independent_misses(model, data, tolerance) -> bool | None:
    """Whether the independent evaluation says some pair misses; None if it cannot tell (two
    high-precision softmax passes disagree)."""
    xs, ys = data.fractions()
    exact = model.attention == "hardmax" and model.exact  # rational hardmax: equal sets
    limit = 0 if exact else ref_limit(data, tolerance)
    if model.attention == "hardmax":
        (out,) = ref_outputs(model, xs)
        return ref_hausdorff_sq(out, ys[0], Fraction) > limit * limit
    errs = []
    for dps in (400, 800):
        with mpmath.workdps(dps):
            (out,) = ref_outputs(model, xs, dps=dps)
            conv = lambda v: mpmath.mpf(v.numerator) / v.denominator  # noqa: E731
            errs.append((mpmath.sqrt(ref_hausdorff_sq(out, ys[0], conv)),
                         conv(limit)))
    with mpmath.workdps(800):
        (e1, lim), (e2, _) = errs
        if abs(e1 - e2) > lim / 100:
            return None
        return e2 > lim


def huge_parameters():
    """Parameters 1e57 and data 1e80: certify once overflowed describing the mismatch."""
    big, ff = "1" + "0" * 57, {"eta": "0", "b": ["0"]}
    blocks = [attention_block("-" + big, ["0", "0"], ["0", "0"], rho="0",
                              ff={**ff, "U": [["0", "2" + big[1:]]], "W": [["-" + big], ["0"]]}),
              attention_block("0", ["0", "0"], ["0", "0"], rho="0",
                              ff={**ff, "U": [["-" + big, "0"]], "W": [["0"], [big]]})]
    model = model_from_dict(model_doc(blocks, attention="softmax", tau="1"))
    return model, [[0, 10 ** 80]], Fraction(1, 10 ** 45)


@example(case=(huge_softmax()[0], huge_softmax()[1], None))
@example(case=huge_parameters())
@given(case=adversarial())
@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
def test_verify_never_says_yes_wrongly(case):
    model, X, perturb = case
    X = [[Fraction(v) for v in r] for r in X]
    try:
        data = ef.Dataset.from_arrays([[[str(v) for v in r] for r in X]],
                                      [targets_from(model, X, perturb)])
    except ef.DatasetError:
        assume(False)  # a nudge made two targets equal
    report = ef.verify(model, data)
    tolerance = report.tolerance
    misses = independent_misses(model, data, tolerance)
    verdict = "undecided" if misses is None else "misses" if misses else "fits"
    event(f"{model.attention} {'rational' if model.exact else 'float64'}: verify "
          f"{report.verdict()}, reference {verdict}")
    if misses:
        assert not report.ok and not report.proved
    if model.attention == "hardmax" and model.exact:  # decidable: both ways
        assert report.ok == (not misses)
    if model.attention == "hardmax" and not model.exact and not report.nonfinite_pairs:
        assert report.ok == (not misses)


# ------------------------------------------------------------------------------ construction
NEAR = [[0.09741625155082811, 0.6880756351461902, 0.46075326388153504],  # token pool
        [0.945998687301501, 0.3827069233677618, 0.5763469329439368],
        [0.9340188528480032, 0.045178074184349964, 0.9761881239207163],
        [0.4145848959677375, 0.6828831762988674, 0.9031155838251314],
        [0.030293157486611877, 0.04465792525380674, 0.2959027419707818],
        [0.9340188528479867, 0.0451780741843546, 0.9761881239205912],  # 2, moved by ~1e-13
        [0.9459986873012766, 0.38270692336811507, 0.5763469329435054]]  # 1, moved by ~1e-13
NEAR_SEQS = [(0, 1, 2), (3, 1, 2), (4, 1, 5), (4, 3, 5), (6, 1, 5), (4, 6, 5)]


def near_duplicates(seed=0):
    rng = np.random.default_rng(seed)
    return ef.Dataset.from_arrays([[NEAR[i] for i in s] for s in NEAR_SEQS],
                                  [rng.random((2, 3)) for _ in NEAR_SEQS])


def test_float_construction_refuses_spacing_it_cannot_resolve():
    """Near-duplicate tokens (relative spacing ~1e-13) beside the token of the leader phase's
    3-ReLU hat: its slope (~1e12) times float64 rounding of its input misplaces the token in
    any evaluator that rounds unlike the construction. The float64 build refuses and points
    to the rational mode, which builds and proves the same data."""
    data = near_duplicates()
    with pytest.raises(ConstructionError, match="cannot resolve.*exact rational"):
        paper(data, exact=False, seed=0)
    assert ef.verify(paper(data, exact=True, seed=0), data).proved


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), digits=st.integers(11, 14))
def test_float_construction_never_emits_a_model_that_misses(seed, digits):
    """Random near-duplicate data: the float64 build refuses, or its model verifies (with the
    exact evaluation of its stored floats)."""
    rng = np.random.default_rng(seed)
    pool = rng.random((7, 3))
    for k in (5, 6):
        pool[k] = pool[rng.integers(0, 5)] * (1 + 10.0 ** -digits * rng.standard_normal(3))
    seqs = {tuple(sorted(rng.choice(7, 3, replace=False))) for _ in range(6)}
    try:
        data = ef.Dataset.from_arrays([pool[list(s)] for s in seqs],
                                      [rng.random((2, 3)) for _ in seqs])
        model = paper(data, exact=False, seed=0)
    except (ConstructionError, ef.DatasetError):
        return
    assert ef.verify(model, data).ok


@pytest.mark.parametrize("causal", [False, True])
def test_cancelling_value_products_are_charged(causal):
    """A head's β·m_c and p_c·(q·m) cancel in float64 to 0 where their exact sum is 2^-24, on
    an exact average (one token) and an exact q·m (radius 0): the write's rounding must be
    charged on the two products, not on their cancelled sum. It was charged on the sum, the
    enclosure bounded the error by about 1e-153, and verify said OK at 10^-9
    (docs/numerics.md#enclosures, attention writes)."""
    p, beta = 2.0 ** 40 * (1 + 2.0 ** -52), -(2.0 ** 80 + 2.0 ** 29)
    block = attention_block("0", ["0", "0"], ["0", "0"], rho="0", beta=repr(beta),
                            p=[repr(p), "0"], q=[repr(p), "0"])
    doc = model_doc([block], number="float64")
    if causal:
        doc.update(format="exactformer.model/2", causal=True)
    model = model_from_dict(doc)
    assert model.blocks[0].sa.V.beta == beta and model.blocks[0].sa.V.p[0] == p
    (out,) = ref_outputs(model, [[[1.0, 0.0]]])
    assert out == [[Fraction(1, 2 ** 24), 0]]  # (the float64 pass writes 0)
    x, y = np.array([[1.0, 0.0]]), np.array([[0.0, 0.0]])
    kind = ef.CausalDataset if causal else ef.Dataset
    data = kind.from_arrays([x], [y])
    assert ref_hausdorff_sq(out, y.tolist(), Fraction) > (Fraction(1e-9) * 1) ** 2
    report = ef.verify(model, data)
    assert not report.ok and not report.proved and report.verdict() == "FAILED"


def test_key_lookup_quiet_test_reads_tiny_scales_exactly():
    """A key layer's quiet test (no unit but the row's own key is on) at a scale g below
    float64's normal range: g = 5·2^-1076 rounds to 2^-1074, and with κ = 2^1000 the float64
    test said κ·g + b ≤ 0 where exactly it is 2^-77 > 0. The exact pass skipped the two units
    that are on, and verify PROVED EXACT a rational model whose output is off by about 2^1000
    (docs/numerics.md#key-layers)."""
    g, kappa, b = Fraction(5, 2 ** 1076), Fraction(2) ** 1000, Fraction(-9, 2 ** 77)

    def ff(eta, U, bias, W):
        return {"eta": str(eta), "U": strings(U), "b": [str(v) for v in bias], "W": strings(W)}

    shrink = ff(0, [[1, 0], [0, 1]], [0, 0], [[g, 0], [0, 1]])  # (1, 0) -> (g, 0)
    key = ff(1, [[kappa, kappa], [kappa, -kappa]], [b, b], [[1, 1], [0, 0]])  # g·(1, 0): key
    grow = ff(0, [[1, 0], [0, 1]], [0, 0], [[1 / g, 0], [0, 1]])  # back to the data's scale
    model = model_from_dict(model_doc([{"ff": f, "sa": None} for f in (shrink, key, grow)]))
    (out,) = ref_outputs(model, [[[1, 0]]])
    assert out == [[1 + Fraction(2) ** 1000 / 5, 0]]  # both units on, each by 2^-77
    data = ef.Dataset.from_arrays([[["1", "0"]]], [[["1", "0"]]])
    report = ef.verify(model, data)
    assert not report.ok and not report.proved and report.verdict() == "FAILED"
