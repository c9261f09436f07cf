"""certify.prove: softmax models proved exact in ball arithmetic, and never a wrong one."""

import json
from dataclasses import replace
from fractions import Fraction

import mpmath
import numpy as np
import pytest
from conftest import datasets, paper
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import exactformer as ef
from exactformer.data import builtin
from exactformer.model import FF, SA, Block, ScoreMatrix, Transformer, ValueMatrix
from exactformer.modelio import model_from_dict, model_to_dict
from exactformer.verification.certify import prove


def mp_error(model, data, dps=100):
    """Max Hausdorff distance (max-norm) between outputs and targets at ``dps`` digits: an
    evaluation independent of the proof."""
    xs, ys = data.fractions()
    worst = mpmath.mpf(0)
    with mpmath.workdps(dps):
        for out, y in zip(ef.forward(model, xs, "mp", dps=dps), ys, strict=True):
            D = [[max(abs(o - mpmath.mpf(t.numerator) / t.denominator)
                      for o, t in zip(row, yy, strict=True)) for yy in y] for row in out]
            worst = max([worst] + [min(r) for r in D] + [min(c) for c in zip(*D, strict=True)])
    return worst


def assert_proved(model, data):
    proof = prove(model, data)
    assert proof.proved, proof.reason
    assert proof.pairs == [True] * data.N and not proof.refuted
    assert mp_error(model, data) < mpmath.mpf(10) ** -80
    return proof


@pytest.fixture(scope="module")
def demo():
    data = builtin.demo()
    return data, paper(data, attention="softmax")


def first_snap(model) -> int:
    """The first interval snap: the block after the non-residual width-1 projection (found
    from the parameters, as the proof does)."""
    return 1 + max(i for i, b in enumerate(model.blocks)
                   if b.ff is not None and b.ff.eta == 0 and b.ff.width == 1)


def with_bias(model, block: int, unit: int, delta) -> Transformer:
    blocks = list(model.blocks)
    ff = blocks[block].ff
    b = ff.b.copy()
    b[unit] += delta
    blocks[block] = Block(FF(ff.eta, ff.U, b, ff.W), blocks[block].sa)
    return replace(model, blocks=blocks)


# ------------------------------------------------------------------------------ proved
def test_proves_the_demo_softmax_model_at_64_bits(demo):
    data, model = demo
    proof = assert_proved(model, data)
    assert proof.bits == 64 and proof.seconds > 0


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.tuples(st.integers(1, 3), st.integers(2, 4)).flatmap(
    lambda nd: datasets(N=nd[0], d=nd[1], max_pool=4)), st.integers(0, 2))
def test_proves_random_softmax_models(data, seed):
    assert_proved(paper(data, attention="softmax", seed=seed), data)


def test_proof_does_not_read_meta(demo):
    data, model = demo
    doc = model_to_dict(model)
    doc["meta"]["phases"] = {"separation": [0, 1], "snap": [1, 2]}  # a forged record
    doc["meta"]["snap_windows"] = []
    assert model_from_dict(doc).record.phase("snap").start == 1
    assert prove(model_from_dict(doc), data).proved
    assert prove(replace(model, record=None), data).proved


def test_proves_hardmax_models_with_the_exact_pass():
    data = builtin.demo()
    proof = prove(paper(data, attention="hardmax"), data)
    assert proof.proved and proof.bits is None


def _near_breakpoint_model():
    """d = 2, one softmax layer (the second token moves to σ(1)·e1, irrational), then a step of
    two ReLUs whose switch lies 1e-25 below it: 64-bit balls cannot decide its side, 128 can."""
    with mpmath.workdps(60):
        sig = mpmath.e / (1 + mpmath.e)
        t = Fraction(int(mpmath.floor((sig - mpmath.mpf("1e-25")) * 10 ** 40)), 10 ** 40)
    K = Fraction(10) ** 26
    zero = np.array([Fraction(0)] * 2, dtype=object)
    sa = SA(Fraction(0), ScoreMatrix(Fraction(1), zero, zero), ValueMatrix(Fraction(1), zero, zero))
    U = np.array([[K, 0], [K, 0]], dtype=object)
    W = np.array([[Fraction(1), Fraction(-1)]] * 2, dtype=object)
    step = FF(Fraction(0), U, np.array([-K * t, -K * t - 1], dtype=object), W)
    model = Transformer(2, "softmax", [Block(None, sa), Block(step, None)], tau=Fraction(1))
    data = ef.Dataset.from_arrays([[[0, 0], [1, 0]]], [[[0, 0], [1, 1]]])
    return model, data


def test_precision_is_raised_until_every_sign_is_decided():
    model, data = _near_breakpoint_model()
    proof = assert_proved(model, data)
    assert proof.bits == 128
    low = prove(model, data, max_bits=64)
    assert not low.proved and not low.refuted
    assert "undecided" in low.reason and "block 1" in low.reason


# ------------------------------------------------------------------------------ refused
def _number_paths(doc, path=()):
    """Paths to every parameter string of a model document."""
    if isinstance(doc, str):
        return [path]
    items = doc.items() if isinstance(doc, dict) else enumerate(doc or [])
    return [p for k, v in items for p in _number_paths(v, (*path, k))]


def perturbed(doc: dict, path: tuple, delta: Fraction) -> Transformer:
    """The model of the document ``doc`` with the parameter at ``path`` (of its blocks)
    moved by ``delta``."""
    changed = json.loads(json.dumps(doc))
    *parents, last = path
    node = changed["blocks"]
    for key in parents:
        node = node[key]
    node[last] = str(Fraction(node[last]) + delta)
    return model_from_dict(changed)


@pytest.fixture(scope="module")
def small():
    data = ef.Dataset.from_arrays([[[0, 1], [2, 3], [4, 1]], [[2, 3], [5, 5]], [[4, 1]]],
                                  [[[1, 1], [0, 0]], [[7, 7]], [[0, 0]]])
    return data, model_to_dict(paper(data, attention="softmax"))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), st.sampled_from([Fraction(1, 10 ** 30), Fraction(-3, 10 ** 12)]))
def test_a_perturbed_model_is_proved_only_if_it_is_still_exact(small, draw, delta):
    data, doc = small
    model = perturbed(doc, draw.draw(st.sampled_from(_number_paths(doc["blocks"]))), delta)
    if prove(model, data).proved:
        assert mp_error(model, data) < mpmath.mpf(10) ** -80


def test_refuses_a_snap_bias_changed_by_1e_30(demo):
    data, model = demo
    wrong = with_bias(model, first_snap(model), 0, Fraction(1, 10 ** 30))
    assert mp_error(wrong, data) > mpmath.mpf(10) ** -40  # really wrong, independently
    proof = prove(wrong, data)
    assert not proof.proved and proof.refuted and "not exactly a target" in proof.reason


def test_refuses_a_changed_temperature(demo):
    data, model = demo
    wrong = replace(model, tau=model.tau * 64)
    assert mp_error(wrong, data, dps=30) > 1e-3
    assert not prove(wrong, data).proved


def test_refuses_swapped_targets(demo):
    data, model = demo
    xs, ys = data.fractions()
    swapped = ef.Dataset.from_arrays(xs, [ys[1], ys[0]] + ys[2:])
    proof = prove(model, swapped)
    assert proof.refuted and proof.pairs[:2] == [False, False] and all(proof.pairs[2:])
    assert proof.reason.startswith("pair 0")


def test_refuses_other_data(demo):
    _, model = demo
    other = builtin.shared_pool(4, 3, 5, 3, 2, seed=3)
    assert not prove(model, other).proved


def test_refuses_a_wrong_model_file_with_forged_meta(demo):
    data, model = demo
    doc = model_to_dict(with_bias(model, first_snap(model), 1, Fraction(-1, 10 ** 30)))
    doc["meta"] = model_to_dict(model)["meta"] | {"verified": True}
    proof = prove(model_from_dict(doc), data)
    assert not proof.proved and proof.refuted


def test_float64_models_are_not_proved(demo):
    data, _ = demo
    model = paper(data, attention="softmax", exact=False)
    proof = prove(model, data)
    assert not proof.proved and "float64 parameters" in proof.reason


def test_wrong_hardmax_model_is_refuted():
    data = builtin.demo()
    model = paper(data, attention="hardmax")
    xs, ys = data.fractions()
    assert prove(model, ef.Dataset.from_arrays(xs, [ys[1], ys[0]] + ys[2:])).refuted


def test_bad_arguments_raise(demo):
    data, model = demo
    with pytest.raises(ValueError, match="max_bits"):
        prove(model, data, max_bits=32)
    with pytest.raises(ValueError, match="d = 4, more than the model's width d_model = 3"):
        prove(model, builtin.shared_pool(3, 4, 4, 2, seed=1))
