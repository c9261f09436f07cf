"""Causal float64 enclosures through rank-one hardmax heads (evaluate/causal_radius.py,
docs/numerics.md#enclosures): wherever a radius is finite the exact causal pass lies within it,
on random models with ties, near-ties and non-finite values, and on keyed causal builds, whose
verdict they decide without an exact pass; a moved weight is never accepted. Causal passes
pool equal points before their first attention layer (docs/numerics.md#pooled-rows).
"""

from __future__ import annotations

import copy
import math
from dataclasses import replace
from fractions import Fraction

import numpy as np
import pytest
from conftest import conflict_data, dense_pass
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st
from test_enclosure import float_coordinates, head, random_ffs, transformer, values, vectors

import exactformer as ef
from exactformer.evaluate import enclose, forward_causal
from exactformer.evaluate.arithmetic import Arithmetic
from exactformer.evaluate.causal_radius import causal_rank_one, prefix_candidates
from exactformer.evaluate.state import CausalState
from exactformer.model import FF, SA, Block, Transformer
from exactformer.numbers import to_fraction_array
from exactformer.verification.float_twin import float_twin


def causal(model: Transformer, positions=None) -> Transformer:
    return Transformer(d=model.d, attention="hardmax", blocks=model.blocks, exact=False,
                       causal=True, positions=positions)


def assert_contains(model, xs) -> int:
    """Every finite radius of the causal enclosure covers the exact causal pass (the stored
    floats evaluated exactly on the float inputs); returns how many radii were finite."""
    mids, rads = enclose(model, xs, None)
    ref = forward_causal(model, [np.asarray(x, dtype=float) for x in xs], "exact")
    finite = 0
    for m, r, e in zip(mids, rads, ref, strict=True):
        for mi, ri, ei in zip(m.flat, r.flat, e.flat, strict=True):
            if math.isfinite(ri) and math.isfinite(mi):
                finite += 1
                assert abs(Fraction(mi) - ei) <= Fraction(ri), (mi, ri, ei)
    return finite


@st.composite
def rank_one_sas(draw, d: int, extreme: bool):
    """ρ ∈ {0, 1, other}, one or two heads, mostly rank one (α = 0, tracked) and sometimes with
    an α·I part (then the enclosure passes the blocks up to that layer exactly), V = β·I + p·qᵀ;
    keys often take few values (ties within a prefix)."""
    heads = []
    for _ in range(draw(st.integers(1, 2))):
        a = draw(st.one_of(vectors(d, extreme), st.just([1.0] + [0.0] * (d - 1))))
        alpha = draw(st.sampled_from([0.0, 0.0, 0.0, 1.0, -0.5]))
        heads.append(head(alpha, a, draw(vectors(d, extreme)),
                          draw(st.sampled_from([0.0, 0.0, 1.0, -0.5])),
                          draw(vectors(d, extreme)), draw(vectors(d, extreme))))
    return SA(draw(st.sampled_from([0.0, 1.0, 1.0, 0.5])), heads=heads)


@st.composite
def causal_inputs(draw, d: int):
    """1 to 3 sequences of 1 to 6 tokens drawn with repetition from a small pool (ties), some
    an ulp apart, at a random scale."""
    scale = 2.0 ** draw(st.sampled_from([-200, -30, 0, 0, 0, 30, 200]))
    pool = draw(st.lists(st.tuples(*[st.integers(-4, 4)] * d), min_size=1, max_size=4))
    pool = [np.array(p, dtype=float) * scale for p in pool]
    if draw(st.booleans()):
        pool.append(np.nextafter(pool[0], math.inf))
    return [np.array([pool[i] for i in draw(st.lists(st.integers(0, len(pool) - 1),
                                                      min_size=1, max_size=6))])
            for _ in range(draw(st.integers(1, 3)))]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(d=st.integers(2, 3), data=st.data())
def test_random_causal_models_are_enclosed(d, data):
    """Random causal float64 models (dense FFs, hats, rank-one heads with ties, ρ = 0,
    2^±300 and 10^16 magnitudes, stored positions or none) on random sequences with repeated
    tokens: wherever the radius is finite, the exact causal pass lies within it (finite
    parameters: the exact pass has no inf)."""
    extreme = False
    xs = data.draw(causal_inputs(d))
    near = list(float_coordinates(xs))
    blocks = [Block(data.draw(st.none() | random_ffs(d, extreme, near)),
                    data.draw(st.none() | rank_one_sas(d, extreme)))
              for _ in range(data.draw(st.integers(1, 3)))]
    positions = data.draw(st.none() | st.just(None) |
                          st.lists(vectors(d, False), min_size=6, max_size=6).map(np.array))
    model = causal(transformer(blocks, d), positions)
    checked = assert_contains(model, xs)
    event("all radii finite" if checked == sum(x.size for x in xs) else
          "some radii infinite" if checked else "no finite radius")


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 7), data=st.data())
def test_prefix_candidates_hold_every_exact_argmax(n, data):
    """For keys and queries known to within their radii, every exact argmax of every prefix
    (largest key for a positive query, smallest for a negative one, all for 0) is a
    candidate: exact keys drawn anywhere in their intervals, ties and nan included."""
    k = np.array(data.draw(st.lists(st.sampled_from([0.0, 1.0, 1.0, 2.0, -1.0, math.nan]),
                                    min_size=n, max_size=n)))
    k_rad = np.array(data.draw(st.lists(st.sampled_from([0.0, 0.0, 0.5, 1.0, math.inf]),
                                        min_size=n, max_size=n)))
    q = np.array(data.draw(st.lists(st.sampled_from([-1.0, 0.0, 1.0, 0.25]),
                                    min_size=n, max_size=n)))
    q_rad = np.array(data.draw(st.lists(st.sampled_from([0.0, 0.5]), min_size=n,
                                        max_size=n)))
    cand = prefix_candidates(q, q_rad, k, k_rad)
    assert not cand[np.triu_indices(n, 1)].any()  # never a later row
    known = np.isfinite(k) & np.isfinite(k_rad)
    exact_k = np.where(known, k, 0.0) + np.array(
        [data.draw(st.sampled_from([-1, 0, 1])) * (r if math.isfinite(r) else 7.0) for r in k_rad])
    for i in range(n):
        exact_q = q[i] + data.draw(st.sampled_from([-1, 0, 1])) * q_rad[i]
        pre = exact_k[: i + 1]
        best = np.arange(i + 1) if exact_q == 0 else \
            np.flatnonzero(pre == (pre.max() if exact_q > 0 else pre.min()))
        assert cand[i, best].all(), (i, best, cand[i])


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 6), data=st.data())
def test_causal_averages_lie_within_their_radii(n, data):
    """The hull radius covers the exact average of every exact argmax set the boxes allow
    (carriers anywhere in their boxes, every subset of tied keys averaged)."""
    k = np.array(data.draw(st.lists(st.sampled_from([0.0, 1.0, 2.0]), min_size=n, max_size=n)))
    C = np.array(data.draw(st.lists(st.lists(values(False), min_size=2, max_size=2),
                                    min_size=n, max_size=n)))
    C_rad = np.array(data.draw(st.lists(st.lists(st.sampled_from([0.0, 0.0, 1e-3]),
                                                 min_size=2, max_size=2),
                                        min_size=n, max_size=n)))
    q = np.array(data.draw(st.lists(st.sampled_from([-1.0, 0.0, 1.0]), min_size=n,
                                    max_size=n)))
    avg, rad = causal_rank_one(q, np.zeros(n), k, np.zeros(n), C, C_rad)
    for i in range(n):
        pre = k[: i + 1]
        best = np.arange(i + 1) if q[i] == 0 else \
            np.flatnonzero(pre == (pre.max() if q[i] > 0 else pre.min()))
        for sign, c in ((-1, 0), (0, 0), (1, 0), (-1, 1), (1, 1)):
            if not (math.isfinite(rad[i, c]) and math.isfinite(avg[i, c])):
                continue
            exact = sum(Fraction(C[l, c]) + sign * Fraction(C_rad[l, c]) for l in best)
            assert abs(exact / len(best) - Fraction(avg[i, c])) <= Fraction(rad[i, c])


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("width", [4, 16])
def test_keyed_causal_builds_are_enclosed_and_decided_without_an_exact_pass(seed, width):
    """A float64 keyed causal model: its separation heads are tracked (no exact prefix), the
    exact pass lies within every radius, and verify decides every sequence by enclosures."""
    data = conflict_data(seed)
    model = ef.compile(data, causal=True, keys=True, width=width, exact=False)
    assert any(b.mixes() for b in model.blocks)
    assert assert_contains(model, data.floats()[0]) == sum(x.size for x in data.floats()[0]) \
        * model.d // data.d
    report = ef.verify(model, data)
    assert report.ok and report.arithmetic == "float64 enclosures"


def moved_weights(model: Transformer):
    """Copies of ``model`` with one attention value weight or one FF output weight moved by
    a little (1/64 of its size, or 1/64 where it is 0)."""
    for i, b in enumerate(model.blocks):
        if b.mixes():
            for h, hd in enumerate(b.sa.heads):
                for c in np.flatnonzero(hd.V.p)[:1]:
                    yield f"block {i} head {h} p[{c}]", _with(model, i, ("p", h, c))
        elif b.ff is not None and b.ff.W.any():
            r, c = np.argwhere(b.ff.W != 0)[0]
            yield f"block {i} W[{r},{c}]", _with(model, i, ("W", r, c))


def _with(model: Transformer, i: int, where) -> Transformer:
    moved = copy.deepcopy(model)
    blk = moved.blocks[i]
    if where[0] == "p":
        p = blk.sa.heads[where[1]].V.p
        p[where[2]] += abs(p[where[2]]) / 64 or 1 / 64
    else:
        W = blk.ff.W
        W[where[1], where[2]] += abs(W[where[1], where[2]]) / 64 or 1 / 64
    return moved


def test_a_moved_weight_is_never_accepted():
    """Every attention value weight and (first) FF output weight of a keyed causal model,
    moved by 1/64 of itself: verify never says OK where the exact pass misses a target, and
    says OK only where the exact pass hits every target within the tolerance."""
    data = conflict_data(3, n=8, length=5)
    model = ef.compile(data, causal=True, keys=True, width=4, exact=False)
    xs, ys = data.fractions()
    pad = [Fraction(0)] * (model.d - data.d)
    scale = float(data.coordinate_scale())
    rejected = 0
    for where, moved in moved_weights(model):
        outs = forward_causal(moved, xs, "exact")
        worst = max(float(sum((a - b) ** 2 for a, b in zip(o[i], list(y[i]) + pad,
                                                           strict=True))) ** 0.5
                    for o, y, k in zip(outs, ys, data.known, strict=True)
                    for i in np.flatnonzero(k))
        ok = ef.verify(moved, data).ok
        assert not ok or worst <= 1e-9 * scale, where
        rejected += not ok
    assert rejected


def test_a_causal_pass_pools_equal_points_and_gives_every_token_back():
    """Before the first attention layer equal (token, position) points of different sequences
    are one row (CausalState.pool); unpooling gives every token its own row in input order."""
    a, b = np.array([[1.0, 2.0], [3.0, 4.0]]), np.array([[1.0, 2.0], [5.0, 6.0], [3.0, 4.0]])
    st = CausalState([a, b], Arithmetic("float"))
    st.pool()
    assert len(st.P) == 3
    st.unpool()
    assert len(st.P) == 5
    for got, x in zip(st.outputs(), [a, b], strict=True):
        assert np.array_equal(got, x)


@pytest.mark.parametrize("seed", [4, 5])
def test_pooled_causal_pass_matches_the_dense_reference(seed):
    """A rational keyed causal model on sequences sharing (token, position) points: the exact
    causal pass, pooled before its first attention layer, gives every token the output of
    the dense reference pass run on its sequence alone."""
    data = conflict_data(seed)
    model = ef.compile(data, causal=True, keys=True, width=4)
    xs, _ = data.fractions()
    for x, out in zip(xs, forward_causal(model, xs, "exact"), strict=True):
        ref = dense_pass(model, np.asarray(x, dtype=object), object,
                         lambda v: np.asarray(v, dtype=object))[-1]
        assert (out == ref).all()


# ------------------------------------------------------------------------------ rational models
def rational(model: Transformer) -> Transformer:
    """The same model with every parameter a Fraction (the float64 values, unrounded)."""
    return replace(model, blocks=[b.converted(Fraction, to_fraction_array)
                                  for b in model.blocks], exact=True)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(d=st.integers(2, 3), data=st.data(), nudge=st.sampled_from([None, 2, 70, "round"]))
def test_rational_verdicts_by_enclosure_agree_with_the_exact_pass(d, data, nudge):
    """Random rational causal models with float64 parameters, targets their own exact outputs,
    one of them moved by 2^-2 or 2^-70 of its size or rounded to float64 (or none): verify
    proves the data exactly when the exact pass finds every output equal to its target, and
    never otherwise, whichever sequences the radius-0 enclosure decided."""
    xs = data.draw(causal_inputs(d))
    blocks = [Block(data.draw(st.none() | random_ffs(d, False, list(float_coordinates(xs)))),
                    data.draw(st.none() | rank_one_sas(d, False)))
              for _ in range(data.draw(st.integers(1, 3)))]
    model = rational(causal(transformer(blocks, d)))
    exact_xs = [to_fraction_array(x) for x in xs]
    outs = [list(map(list, y)) for y in forward_causal(model, exact_xs, "exact")]
    ys = copy.deepcopy(outs)
    y = ys[0][-1]
    if nudge == "round":  # the float64 nearest the exact output (a float target)
        y[0] = Fraction(float(y[0])) if abs(y[0]) < 2 ** 1000 else y[0]
    elif nudge is not None:
        y[0] += (abs(y[0]) or 1) / 2 ** nudge
    try:
        dataset = ef.CausalDataset.from_arrays(exact_xs, ys)
    except ef.DatasetError:
        assume(False)  # the moved target breaks an equal prefix's, or is not finite
    report = ef.verify(model, dataset)
    equal = ys == outs
    assert report.proved == equal, (report.arithmetic, report.exact_equal)
    event(report.arithmetic)


def test_rational_keyed_causal_builds_are_proved_by_the_enclosure():
    """A rational keyed causal build with integer data: every sequence proved equal by
    radius-0 enclosures, without the exact pass; a target moved by 2^-60 is not."""
    data = conflict_data(6)
    model = ef.compile(data, causal=True, keys=True, width=4)
    assert model.exact and float_twin(model) is not None
    report = ef.verify(model, data)
    assert report.proved and report.arithmetic == "float64 enclosures (radius 0)"
    xs, ys = data.fractions()
    j = next(j for j, k in enumerate(data.known) if k.any())
    i = int(np.flatnonzero(data.known[j])[-1])
    moved = [y.copy() for y in ys]
    moved[j][i, 0] += Fraction(1, 2 ** 60)
    targets = [[list(y[t]) if k[t] else None for t in range(len(k))]
               for y, k in zip(moved, data.known, strict=True)]
    try:
        nudged = ef.CausalDataset.from_arrays(xs, targets)
    except ef.DatasetError:
        pytest.skip("the moved target breaks an equal prefix's")
    report = ef.verify(model, nudged)
    assert not report.ok and report.first_failure is not None


def test_a_parameter_off_the_float64_grid_sends_the_model_to_the_exact_pass():
    """A rational parameter that no float64 holds (1/3): no float twin, the exact pass."""
    data = conflict_data(6)
    model = ef.compile(data, causal=True, keys=True, width=4)
    blk = model.blocks[0]
    U = blk.ff.U.copy()
    U[0, 0] += Fraction(1, 3 * 2 ** 80)
    odd = replace(model, blocks=[replace(blk, ff=replace(blk.ff, U=U)), *model.blocks[1:]])
    assert float_twin(odd) is None
    assert ef.verify(odd, data).arithmetic == "exact"


def test_a_target_equal_to_the_rounded_output_is_not_proved():
    """relu(fl(0.1)·3) is no float64: the enclosure's float output equals the target
    fl(3·fl(0.1)) but its radius is not 0, so the exact pass decides, and finds them unequal."""
    ff = FF(Fraction(0), to_fraction_array([[0.1, 0.0]]), to_fraction_array([0.0]),
            to_fraction_array([[1.0], [0.0]]))
    model = Transformer(d=2, attention="hardmax", blocks=[Block(ff, None)], exact=True,
                        causal=True)
    exact = Fraction(0.1) * 3
    assert Fraction(float(exact)) != exact
    data = ef.CausalDataset.from_arrays([[[Fraction(3), Fraction(0)]]],
                                        [[[Fraction(float(exact)), Fraction(0)]]])
    report = ef.verify(model, data)
    assert not report.ok and not report.proved


def test_inputs_off_the_float64_grid_are_not_enclosed():
    """An input 1/3 is no float64: the enclosure would run on fl(1/3) and prove the target
    fl(1/3) that the exact model (here the identity) does not output."""
    ff = FF(Fraction(1), to_fraction_array([[0.0, 0.0]]), to_fraction_array([0.0]),
            to_fraction_array([[0.0], [0.0]]))
    model = Transformer(d=2, attention="hardmax", blocks=[Block(ff, None)], exact=True,
                        causal=True)
    third = Fraction(1, 3)
    data = ef.CausalDataset.from_arrays([[[third, Fraction(0)]]],
                                        [[[Fraction(float(third)), Fraction(0)]]])
    report = ef.verify(model, data)
    assert not report.ok and report.arithmetic == "exact"


def test_a_scale_beyond_float64_is_read_as_inf():
    """An exact data scale past float64's range (targets that are a model's own huge exact
    outputs, found by the test above) made the report's relative clearance raise
    OverflowError; it reads as inf, so a finite value relative to it is 0."""
    from exactformer.distance import relative
    assert relative(1.0, Fraction(10) ** 400) == 0.0
    assert relative(0.0, Fraction(10) ** 400) == 0.0


def test_float_below_a_limit_beyond_float64():
    """The largest float64 at most a limit: the limit's own float where it is one, the float
    just below where it rounds up, and float64's largest where the limit is beyond its range
    (safe_float reads such a limit as inf)."""
    from fractions import Fraction

    from exactformer.numbers import float_below

    assert float_below(Fraction(1, 2)) == 0.5
    third = float_below(Fraction(1, 3))
    assert Fraction(third) <= Fraction(1, 3) < Fraction(np.nextafter(third, np.inf))
    assert float_below(Fraction(10) ** 400) == np.finfo(np.float64).max
