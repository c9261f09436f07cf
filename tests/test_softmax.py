"""Softmax construction (docs/softmax.md): exact on the data to 50 digits, τ*, bad τ."""

import dataclasses
import functools
import json
from fractions import Fraction

import numpy as np
import pytest
from conftest import paper
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import exactformer as ef
from exactformer.cli import main
from exactformer.construct.softmax import TemperatureError
from exactformer.data import builtin
from exactformer.modelio import model_from_dict, model_to_dict

SETTINGS = settings(max_examples=20, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


@st.composite
def pooled(draw):
    """Random data over a small shared pool: forces separation rounds and shared maxima."""
    d = draw(st.integers(2, 5))
    pool_size = draw(st.integers(2, 7))
    coords = st.integers(-4, 4)
    pool = draw(st.lists(st.tuples(*[coords] * d), min_size=pool_size, max_size=pool_size,
                         unique=True))
    subsets = draw(st.lists(st.sets(st.integers(0, pool_size - 1), min_size=1), min_size=1,
                            max_size=7, unique_by=frozenset))
    xs, ys = [], []
    for s in subsets:
        xs.append([list(pool[i]) for i in sorted(s)])
        m = draw(st.integers(1, len(s)))
        ys.append([list(t) for t in draw(st.lists(st.tuples(*[coords] * d), min_size=m,
                                                  max_size=m, unique=True))])
    return ef.Dataset.from_arrays(xs, ys)


def _check(model, data, digits=50):
    report = ef.verify(model, data, digits=digits)
    assert report.ok, report.table()
    assert max(report.extra["hausdorff_mp"]) <= 10.0 ** -(digits - 10) * data.coordinate_scale()
    R = model.meta["R"]
    assert R <= data.N - 1
    assert model.n_blocks <= R + max(1, data.total_m - data.N) + 1 + data.total_m
    assert model.n_blocks < 2 * data.total_m + 3 * data.N  # the paper's softmax bound
    assert model.max_width() <= 4
    return report


@SETTINGS
@given(pooled(), st.integers(0, 3))
def test_softmax_interpolates_random_pooled_data(data, seed):
    model = paper(data, attention="softmax", seed=seed)
    assert model.attention == "softmax" and model.tau == 1
    assert all(isinstance(v, Fraction) for v in model.parameters())
    _check(model, data)


@pytest.mark.parametrize("data", [
    builtin.nested(6, 3, seed=1), builtin.interior(5, 2, seed=2),
    builtin.one_token_apart(5, 3, seed=3), builtin.shared_maximum(7, 2, seed=4),
    builtin.shared_pool(6, 2, 4, 4, m_equals_n=True, seed=5),
    ef.Dataset.from_arrays([[[1, 2], [3, 4]]], [[[0, 0], [5, 5]]]),  # N = 1, m = n
], ids=["nested", "interior", "one-token-apart", "shared-max", "m=n", "N=1"])
def test_softmax_adversarial_families(data):
    _check(paper(data, attention="softmax"), data)


def test_output_equals_targets_to_40_digits_relative():
    data = builtin.demo()
    model = paper(data, attention="softmax")
    xs, ys = data.fractions()
    outs = ef.forward(model, xs, "mp", dps=50)
    scale = data.coordinate_scale()
    for out, y in zip(outs, ys, strict=True):
        # every output token is within 1e-40 of some target, and every target is hit
        d = np.array([[max(abs(float(a - b)) for a, b in zip(o, t, strict=True)) for t in y]
                      for o in out])
        assert d.min(axis=1).max() < 1e-40 * scale
        assert d.min(axis=0).max() < 1e-40 * scale


def test_tau_star_reported_and_too_large_tau_is_refused():
    data = builtin.demo()
    model = paper(data, attention="softmax")
    tau_star = model.meta["tau_star"]
    assert isinstance(tau_star, float) and tau_star > 0
    with pytest.raises(TemperatureError, match="largest workable"):
        paper(data, attention="softmax", tau=2 * tau_star)


def test_explicit_temperature_below_tau_star():
    data = builtin.demo()
    tau = Fraction(1, 64)
    model = paper(data, attention="softmax", tau=tau)
    assert model.tau == tau and model.meta["folded"] is False
    _check(model, data)


def test_wrong_temperature_fails_verification():
    data = builtin.nested(5, 3, seed=7)
    model = paper(data, attention="softmax")
    assert ef.verify(model, data).ok
    assert not ef.verify(model, data, tau=model.tau * 50).ok


def test_softmax_json_round_trip_keeps_temperature_and_parameters():
    data = builtin.interior(4, 2, seed=9)
    model = paper(data, attention="softmax")
    doc = model_to_dict(model)
    assert doc["attention"] == "softmax" and Fraction(doc["tau"]) == model.tau
    again = model_from_dict(doc)
    assert again.parameters() == model.parameters() and again.tau == model.tau
    assert model_to_dict(again) == doc


def test_cli_builds_and_verifies_softmax(tmp_path):
    data = tmp_path / "data.json"
    data.write_text(json.dumps(builtin.demo().to_json_dict()))
    out = tmp_path / "m.json"
    assert main(["build", str(data), "-o", str(out), "--attention", "softmax",
                 "--construction", "paper"]) == 0
    assert main(["verify", str(out), str(data)]) == 0
    bad = tmp_path / "bad.json"  # above τ*: the paper's construction refuses it
    assert main(["build", str(data), "-o", str(bad), "--attention", "softmax",
                 "--tau", "1000", "--construction", "paper"]) == 2
    assert not bad.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.json", "m.json"]


def test_float64_softmax_is_judged_by_the_float_tolerance():
    data = builtin.uniform(12, 5, 2, 3, seed=3)
    model = paper(data, attention="softmax", exact=False)
    assert not model.exact
    report = ef.verify(model, data)
    assert report.ok and report.tolerance == 1e-9
    assert max(report.extra["hausdorff_mp"]) <= 1e-9 * data.coordinate_scale()
    strict = ef.verify(model, data, tolerance=1e-30)  # rounded snaps are not flat to 30 digits
    assert not strict.ok


def test_tokens_far_below_float64_resolution_are_simulated_at_their_precision():
    """Coordinates near 10^6 with tokens 10^-9 apart (relative spacing 10^-15): the
    simulation runs at the digits the data need, and the model is proved exact."""
    from exactformer.construct.softmax import simulation_digits
    from exactformer.verification.certify import prove

    base, eps = Fraction(10 ** 6), Fraction(1, 10 ** 9)
    xs = [[[base, base], [base + eps, base]], [[base + eps, base], [base, base + eps]],
          [[base, base + 2 * eps]]]
    data = ef.Dataset.from_arrays(xs, [[[1, 2]], [[3, 4], [5, 6]], [[0, 0]]])
    assert simulation_digits(data.fractions()[0]) >= 35
    model = paper(data, attention="softmax")
    assert prove(model, data).proved
    assert ef.verify(model, data).ok


@functools.cache
def _pool_and_tau_star():
    data = builtin.shared_pool(4, 2, 4, 3, 2, seed=3)
    return data, paper(data, attention="softmax").record.tau_star


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.floats(0.01, 0.99))
def test_every_temperature_below_tau_star_builds(fraction):
    data, tau_star = _pool_and_tau_star()
    tau = Fraction(tau_star * fraction).limit_denominator(10 ** 9) if np.isfinite(tau_star) \
        else Fraction(fraction * 100).limit_denominator(1000)
    model = paper(data, attention="softmax", tau=tau)
    assert model.tau == tau
    _check(model, data)


@pytest.mark.parametrize("tau", ["-1", "0", "1/0", "nan", "inf", "abc"])
def test_bad_temperature_is_refused_before_any_search(tau, monkeypatch):
    import exactformer.construct.softmax as sm

    def no_search(*args, **kwargs):
        raise AssertionError("the tau* search ran for a bad tau")

    monkeypatch.setattr(sm, "find_tau_star", no_search)
    with pytest.raises(ValueError, match="tau"):
        paper(builtin.demo(), attention="softmax", tau=tau)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), exact=st.booleans())
def test_ball_pass_from_the_exact_prefix_is_the_pass_from_the_inputs(data, exact):
    """The ball pass starts at the first attention layer that mixes tokens, from the exact
    pass's rows there (verification/bound.exact_prefix): every output token must be the one
    the ball pass computes from the inputs, form and value (an exact point the same point, a
    ball the same ball)."""
    from conftest import datasets

    from exactformer.verification.balls import Layers, Run, as_ball
    from exactformer.verification.bound import exact_prefix
    ds = data.draw(datasets(max_pool=5))
    model = ef.compile(ds, attention="softmax", exact=exact)
    xs, _ = ds.padded(model.d).fractions()
    start, rows = exact_prefix(model, xs)
    assert start == next((i for i, b in enumerate(model.blocks) if b.mixes()), len(model.blocks))
    layers = Layers(model)
    whole, prefixed = Run(layers, 64).outputs(xs), Run(layers, 64).outputs(rows, start)
    for a, b in zip(whole, prefixed, strict=True):
        for s, t in zip(a, b, strict=True):
            assert type(s) is type(t)
            u, v = as_ball(s), as_ball(t)
            assert all(u[i, 0].mid() == v[i, 0].mid() and u[i, 0].rad() == v[i, 0].rad()
                       for i in range(u.nrows()))


def test_a_model_without_a_temperature_is_verified_at_one():
    """A softmax model built by hand with no τ (the field's default) is read at τ = 1 by
    every pass; verify used to stop on float(None) while writing its report. Its verdict and
    error bound are those of the same model with τ = 1 given explicitly."""
    data = builtin.shared_pool(4, 2, 4, 3, 2, seed=1)
    model = ef.compile(data, attention="softmax", exact=False)
    none, one = (ef.verify(dataclasses.replace(model, tau=t), data) for t in (None, 1))
    assert none.verdict() == one.verdict()
    assert none.hausdorff_float64 == one.hausdorff_float64
    assert none.extra["temperature τ (τ* of the geometry)"].startswith("1 ")
