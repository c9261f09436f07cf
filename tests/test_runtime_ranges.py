"""Runtime ranges (docs/numerics.md#runtime-ranges): a model that claims a float32 pass either
is faithful in the test's own dense float32 pass or says at build time which stored number
breaks the claim; ``export --dtype float32`` says so too, never just "exported"."""

from __future__ import annotations

import json
import math
import warnings
from fractions import Fraction

import numpy as np
import pytest
from conftest import dense_pass
from hypothesis import example, given, settings
from hypothesis import strategies as st

import exactformer as ef
from exactformer.cli import main
from exactformer.model import FF, Block
from exactformer.runtime import RuntimeRangeWarning, range_faults

FLOAT32_TINY, FLOAT32_HUGE = 2.0 ** -126, float(np.finfo(np.float32).max)


def scaled_data(rng, scale: Fraction, causal: bool):
    """Four sequences of distinct small integer points times ``scale`` (exact), no token in
    two inputs; causal data: a target or null at each position."""
    grid = np.array([(a, b) for a in range(-3, 4) for b in range(-3, 4)])

    def seq(rows):
        return np.array([[Fraction(int(v)) * scale for v in row] for row in rows], dtype=object)

    def distinct(n):
        return seq(grid[rng.choice(len(grid), n, replace=False)])

    order = rng.permutation(len(grid))
    xs = [seq(grid[order[3 * j:3 * j + 3]]) for j in range(4)]
    if causal:
        ys = [[list(row) if k % 2 == 0 else None for k, row in enumerate(distinct(3))]
              for _ in xs]
        return ef.CausalDataset.from_arrays(xs, ys)
    return ef.Dataset.from_arrays(xs, [distinct(2) for _ in xs])


def float32_error(model, data) -> float:
    """The test's own dense float32 pass: the largest distance of an output from its target
    (set data: Hausdorff; causal: at each constrained position), inf on any nan or inf."""
    xs, ys = data.floats()
    worst = 0.0
    for j, (x, y) in enumerate(zip(xs, ys, strict=True)):
        with np.errstate(all="ignore"):
            o = dense_pass(model, x, np.float32)[-1].astype(float)
        y = np.pad(y, ((0, 0), (0, model.d - y.shape[1])))
        if isinstance(data, ef.CausalDataset):
            k = data.known[j]
            D = np.linalg.norm(o[k] - y[k], axis=1)[None, :]
        else:
            D = np.sqrt(((o[:, None, :] - y[None, :, :]) ** 2).sum(-1))
        if not np.isfinite(D).all():
            return math.inf
        worst = max(worst, float(D.min(axis=1).max()), float(D.min(axis=0).max()))
    return worst


def build(data, attention: str):
    """The keyed model and the RuntimeRangeWarnings its build gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = ef.compile(data, attention=attention, keys=True)
    return model, [str(c.message) for c in caught if c.category is RuntimeRangeWarning]


@settings(max_examples=40, deadline=None)
@given(exponent=st.integers(-30, 30), mantissa=st.sampled_from([1, 3, 7]),
       attention=st.sampled_from(["hardmax", "softmax"]), causal=st.booleans(),
       seed=st.integers(0, 2 ** 32 - 1))
@example(exponent=22, mantissa=3, attention="hardmax", causal=False, seed=0)
@example(exponent=-30, mantissa=1, attention="softmax", causal=True, seed=0)
def test_keyed_models_at_any_scale_are_faithful_in_float32_or_warned(exponent, mantissa,
                                                                     attention, causal, seed):
    scale = Fraction(mantissa) * Fraction(10) ** exponent
    data = scaled_data(np.random.default_rng(seed), scale, causal)
    model, warned = build(data, attention)
    assert warned or float32_error(model.to_float(), data) <= 1e-5 * float(scale) * 4


@pytest.mark.parametrize("attention", ["hardmax", "softmax"])
def test_the_warning_names_the_number_that_leaves_float32(attention):
    """At scale 3e22 the collapse's score matrix is α·I with α near 2^-153, 0 in float32: the
    float32 pass errs by about twice the scale, and the build says which number it is."""
    data = scaled_data(np.random.default_rng(0), Fraction(3 * 10 ** 22), False)
    model, warned = build(data, attention)
    assert float32_error(model.to_float(), data) > 0.5 * 3e22  # the premise
    assert len(warned) == 1 and "float32" in warned[0]
    assert "SA head 0 A.alpha" in warned[0] and "underflows" in warned[0]


def tiny_model(values) -> ef.Transformer:
    """One FF block whose first U row holds ``values`` (the rest zeros)."""
    U = np.array([values, [0] * len(values)], dtype=object)
    ff = FF(Fraction(1), U, np.array([Fraction(0)] * 2, dtype=object),
            np.array([[Fraction(0)] * 2 for _ in values], dtype=object))
    return ef.Transformer(d=len(values), attention="hardmax", blocks=[Block(ff, None)])


@settings(max_examples=50, deadline=None)
@given(st.lists(st.one_of(st.just(0), st.integers(-2000, 2000).map(lambda e: Fraction(2) ** e),
                          st.integers(-2000, 2000).map(lambda e: -Fraction(3) ** e)),
                min_size=1, max_size=4))
def test_range_faults_name_exactly_the_nonzero_numbers_outside_float32(values):
    faults = range_faults(tiny_model(values), "float32")
    outside = [v for v in values if v != 0 and not FLOAT32_TINY <= abs(v) <= FLOAT32_HUGE]
    assert len(faults) == len(outside)
    assert all(f.startswith("block 0 FF U = ") for f in faults)
    for f, v in zip(faults, outside, strict=True):
        assert ("underflows" in f) == (abs(v) < 1)


def keyed_far_model(tmp_path):
    data = scaled_data(np.random.default_rng(0), Fraction(3 * 10 ** 22), False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeRangeWarning)
        model = ef.compile(data, keys=True)
    ef.save_model(model, tmp_path / "m.json")
    (tmp_path / "d.json").write_text(json.dumps(data.to_json_dict()))
    return tmp_path / "m.json", tmp_path / "d.json"


@pytest.mark.parametrize("layout", ["native", "rho-eta"])
def test_export_to_float32_says_the_copy_fails(tmp_path, capsys, layout):
    pytest.importorskip("torch")
    model, _ = keyed_far_model(tmp_path)
    rc = main(["export", str(model), "-o", str(tmp_path / "m.safetensors"), "--layout", layout,
               "--dtype", "float32"])
    out = capsys.readouterr().out
    assert rc == 1 and "float32 copy FAILS" in out and "A.alpha" in out
    rc = main(["export", str(model), "-o", str(tmp_path / "m64.safetensors"), "--layout",
               layout])
    assert rc == 0 and "FAILS" not in capsys.readouterr().out  # float64 holds every number


def test_float32_verdict_fails_on_a_number_outside_float32(tmp_path):
    pytest.importorskip("torch")
    from exactformer import export as et
    model, data = keyed_far_model(tmp_path)
    verdict = et.float32_verdict(ef.load_model(model), ef.Dataset.load(data))
    assert not verdict.interpolates and any("A.alpha" in f for f in verdict.range_faults)


def test_an_intermediate_beyond_float32_is_named():
    """Parameters and data inside float32, but U·x = 10^40: the float32 pass makes inf·0 = nan
    there, and range_faults names the block and the part from a float64 pass on the data."""
    ff = FF(1.0, np.array([[1e20, 0.0]]), np.zeros(1), np.zeros((2, 1)))
    model = ef.Transformer(d=2, attention="hardmax", blocks=[Block(ff, None)], exact=False)
    data = ef.Dataset.from_arrays([np.array([[1e20, 0.0]])], [np.array([[1e20, 0.0]])])
    assert range_faults(model, "float32") == []  # every stored number is inside
    faults = range_faults(model, "float32", data)
    assert faults == ["block 0 FF pre-activation reaches 1e+40 on the data, which overflows "
                      "(inf) in float32"]
    assert float32_error(model, data) == math.inf  # the premise: float32 does fail there
    assert range_faults(model, "float64", data) == []


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), attention=st.sampled_from(["hardmax", "softmax"]))
def test_the_dense_pass_runs_causal_models_with_their_positions(seed, attention):
    """dense_forward (whose peaks range_faults reads) masks causally and adds the positions:
    it agrees with the package's own causal pass."""
    data = scaled_data(np.random.default_rng(seed), Fraction(1), True)
    model = ef.compile(data, attention=attention, keys=True)
    dense = ef.evaluate.dense_forward(model, data.floats()[0])
    fast = ef.forward(model.to_float(), data.floats()[0])
    for a, b in zip(dense, fast, strict=True):
        assert np.allclose(a, b, rtol=0, atol=1e-9)
