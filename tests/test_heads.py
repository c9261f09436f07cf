"""Wider layers and several heads (docs/heads.md): exactness, block counts, the format.

Every build is checked in exact rational arithmetic (output sets compared with ``==``); the
block-count targets are checked against the width-4 build of the same data.
"""

from __future__ import annotations

import copy
import json
from fractions import Fraction

import numpy as np
import pytest
from conftest import assert_interpolates_exactly, datasets, make_dataset, paper, token_set
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import exactformer as ef
from exactformer.cli import main
from exactformer.data import builtin
from exactformer.evaluate import dense_forward
from exactformer.model import SA, Block, Head, ScoreMatrix, Transformer, ValueMatrix
from exactformer.modelio import ModelFormatError, model_from_dict, model_to_dict
from exactformer.verification.certify import prove

SETTINGS = settings(max_examples=12, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
widths = st.sampled_from([8, 12, 16, 32])


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@given(data=datasets(max_pool=8), width=widths, heads=st.integers(1, 4),
       seed=st.integers(0, 2**31 - 1))
@example(data=make_dataset([[[0, 0]]], [[[0, 0]]]), width=8, heads=1, seed=0)
@SETTINGS
def test_wide_hardmax_is_exact_and_shallower(data, width, heads, seed):
    k = width // 4
    narrow = paper(data, seed=seed)
    wide = paper(data, seed=seed, width=width, heads=heads)
    assert_interpolates_exactly(wide, data)
    report = ef.verify(wide, data)
    assert report.ok and report.exact_equal == [True] * data.N
    assert prove(wide, data).proved
    L4, R = narrow.n_blocks, narrow.meta["R"]
    assert wide.n_blocks <= R + ceil_div(L4 - R, k) + 3
    assert wide.n_blocks == report.blocks_design
    k_used = max(1, wide.max_width() // 4)  # k_used < k when no phase fills a layer
    assert report.blocks_width_target == wide.meta["R"] + ceil_div(
        report.blocks_width4 - wide.meta["R"], k_used)
    assert wide.max_width() <= width and wide.max_heads() <= min(heads, data.d - 1) or R == 0
    assert wide.n_params() <= 1.15 * narrow.n_params() + 4 * (2 * data.d + 1) * k


@given(data=datasets(max_pool=8, rational=False), width=widths, heads=st.integers(1, 3))
@settings(SETTINGS, max_examples=10)
def test_wide_float64_build_interpolates(data, width, heads):
    model = paper(data, exact=False, width=width, heads=heads)
    assert not model.exact
    report = ef.verify(model, data)
    assert report.ok, report.max_hausdorff_float64


def test_width_one_is_todays_model():
    data = builtin.vocabulary(20, 6, 3, 2, 3, seed=1)
    a, b = paper(data), paper(data, width=4)
    assert model_to_dict(a) == model_to_dict(b)


@pytest.mark.parametrize("heads", [0, -1, 1.5, True])
def test_heads_must_be_a_positive_integer(heads):
    data = make_dataset([[[0, 1]], [[1, 0]]], [[[2, 2]], [[3, 3]]])
    with pytest.raises(ValueError, match="heads must be"):
        paper(data, heads=heads, width=8)


@pytest.mark.parametrize("width", [0, 3, 6, -4, 4.0, True])
def test_width_must_be_a_multiple_of_four(width):
    data = make_dataset([[[0, 1]], [[1, 0]]], [[[2, 2]], [[3, 3]]])
    with pytest.raises(ValueError, match="multiple of 4"):
        paper(data, width=width)


@given(data=datasets(max_pool=6),
       width=st.sampled_from([8, 16]), heads=st.integers(1, 3))
@settings(SETTINGS, max_examples=4)
def test_wide_softmax_is_proved(data, width, heads):
    narrow = paper(data, attention="softmax")
    wide = paper(data, attention="softmax", width=width, heads=heads)
    proof = prove(wide, data)
    assert proof.proved, proof.reason
    report = ef.verify(wide, data)
    assert report.ok and wide.n_blocks == report.blocks_design
    L4, R = narrow.n_blocks, narrow.meta["R"]
    assert wide.n_blocks <= R + ceil_div(L4 - R, width // 4) + 3


def test_multi_head_softmax_proof_can_fail():
    """The ball proof sums the heads: dropping one head's value breaks a proved model."""
    data = builtin.vocabulary(12, 6, 4, 2, 4, seed=5)
    model = paper(data, attention="softmax", width=16, heads=3)
    assert model.max_heads() > 1 and prove(model, data).proved
    blk = next(b for b in model.blocks if b.sa is not None and len(b.sa.heads) > 1)
    blk.sa.heads[-1].V.p = blk.sa.heads[-1].V.p * 0
    assert not prove(model, data).proved


def test_many_shared_tokens_need_fewer_rounds():
    """Sequences over a small pool: a round with k tests at rising heights splits a class k+1
    ways, so R_k < R."""
    rng = np.random.default_rng(3)
    pool = rng.integers(-9, 10, size=(10, 2))
    pool = np.unique(pool, axis=0)
    sets = {tuple(sorted(rng.choice(len(pool), size=3, replace=False))) for _ in range(60)}
    xs = [pool[list(s)] for s in sets]
    ys = [np.array([[i, 100]]) for i in range(len(xs))]
    data = make_dataset(xs, ys)
    R = paper(data).meta["R"]
    Rk = paper(data, width=16).meta["R"]
    assert Rk < R
    assert_interpolates_exactly(paper(data, width=16), data)


def test_heads_read_tests_on_free_coordinates():
    """With d − 1 ≥ 2 channels a round also lifts tests onto free coordinates, each read by its
    own head: fewer rounds than one channel, still exact, and the file says /2."""
    data = builtin.vocabulary(30, 8, 4, 2, 5, seed=2)
    one = paper(data, width=16)
    many = paper(data, width=16, heads=4)
    assert many.meta["R"] < one.meta["R"] and many.max_heads() > 1
    assert any(x.get("channel") for x in many.meta["lifts"])
    assert_interpolates_exactly(many, data)
    doc = model_to_dict(many)
    assert doc["format"] == "exactformer.model/2"
    back = model_from_dict(json.loads(json.dumps(doc)))
    assert_interpolates_exactly(back, data)
    assert back.record.lifts == many.record.lifts


# ------------------------------------------------------------------------------ several heads
def two_head_model(exact: bool = True):
    """One block, two hardmax heads: head 1 adds the sequence max of x₁ to x₂, head 2 adds the
    sequence min of x₁ to x₃."""
    F = Fraction
    e = [np.array([F(int(i == k)) for i in range(3)], dtype=object) for k in range(3)]
    h1 = Head(ScoreMatrix(F(0), e[0], e[0]), ValueMatrix(F(0), e[1], e[0]))
    h2 = Head(ScoreMatrix(F(0), -e[0], e[0]), ValueMatrix(F(0), e[2], e[0]))
    model = Transformer(d=3, attention="hardmax",
                        blocks=[Block(None, SA(F(1), heads=[h1, h2]))])
    return model if exact else model.to_float()


def test_two_heads_sum_their_values():
    model = two_head_model()
    X = np.array([[Fraction(v) for v in r] for r in [[1, 0, 0], [3, 0, 0], [2, 0, 0]]],
                 dtype=object)
    (out,) = ef.forward(model, [X], arithmetic="exact")
    assert token_set(out) == token_set([[1, 3, 1], [3, 3, 1], [2, 3, 1]])
    (outf,) = ef.forward(model, [X.astype(float)], arithmetic="float")
    assert np.array_equal(outf, out.astype(float))
    (outm,) = ef.forward(model, [X], arithmetic="mp")
    assert np.array_equal(outm.astype(float), out.astype(float))


def test_dense_pass_sums_heads():
    """The independent dense evaluator reads every head of a layer, as forward does."""
    model = two_head_model(exact=False)
    X = np.array([[1.0, 0, 0], [3.0, 0, 0], [2.0, 0, 0]])
    (dense,) = dense_forward(model, [X])
    (fast,) = ef.forward(model, [X], arithmetic="float")
    assert np.array_equal(dense, fast)


def test_causal_pass_sums_heads():
    model = two_head_model()
    model.causal = True
    X = np.array([[Fraction(v) for v in r] for r in [[2, 0, 0], [3, 0, 0], [1, 0, 0]]],
                 dtype=object)
    (out,) = ef.forward(model, [X], arithmetic="exact")
    assert out.tolist() == [[2, 2, 2], [3, 3, 2], [1, 3, 1]]


def test_one_head_accessors_refuse_several_heads():
    sa = two_head_model().blocks[0].sa
    with pytest.raises(ValueError, match="2 heads"):
        _ = sa.A
    assert sa.n_params() == 2 * 2 * (2 * 3 + 1) + 1
    with pytest.raises(ValueError, match="either A and V"):
        SA(Fraction(1))


def test_format_round_trip_with_heads():
    model = two_head_model()
    doc = model_to_dict(model)
    assert doc["format"] == "exactformer.model/2"
    assert "A" not in doc["blocks"][0]["sa"] and len(doc["blocks"][0]["sa"]["heads"]) == 2
    back = model_from_dict(json.loads(json.dumps(doc)))
    assert model_to_dict(back) == doc
    fdoc = model_to_dict(model.to_float())
    assert model_to_dict(model_from_dict(fdoc)) == fdoc


def test_one_head_files_stay_format_one():
    data = make_dataset([[[0, 1], [1, 1]], [[1, 0], [1, 1]]], [[[2, 2]], [[3, 3]]])
    doc = model_to_dict(paper(data, width=8))
    assert doc["format"] == "exactformer.model/1"
    assert all(b["sa"] is None or "heads" not in b["sa"] for b in doc["blocks"])


@pytest.mark.parametrize("change, words", [
    (lambda d: d.update(format="exactformer.model/1"), ["heads", "model/2"]),
    (lambda d: d["blocks"][0]["sa"].update(heads=[]), ["heads", "non-empty"]),
    (lambda d: d["blocks"][0]["sa"].update(heads=[3]), ["heads[0]", "object"]),
    (lambda d: d["blocks"][0]["sa"].update(A={}), ["single"]),
    (lambda d: d["blocks"][0]["sa"]["heads"][1]["V"].update(p=["1"]),
     ["blocks[0].sa.heads[1].V.p", "3 numbers"]),
])
def test_malformed_heads_are_refused(change, words):
    doc = copy.deepcopy(model_to_dict(two_head_model()))
    change(doc)
    with pytest.raises(ModelFormatError) as e:
        model_from_dict(doc)
    assert all(w in str(e.value) for w in words), str(e.value)


def test_cli_build_width_and_info(tmp_path, capsys):
    data = make_dataset([[[0, 1], [1, 1]], [[1, 0], [1, 1]], [[2, 0]]],
                        [[[2, 2], [0, 3]], [[3, 3]], [[5, 5]]])
    path = tmp_path / "d.json"
    path.write_text(json.dumps(data.to_json_dict()))
    out = tmp_path / "m.json"
    assert main(["build", str(path), "-o", str(out), "--width", "8", "--heads", "2"]) == 0
    assert "width 8" in capsys.readouterr().out
    assert main(["verify", str(out), str(path)]) == 0
    assert main(["info", str(out)]) == 0
    assert "max attention heads" in capsys.readouterr().out
    assert main(["build", str(path), "-o", str(tmp_path / "x.json"), "--width", "6"]) == 2


# ------------------------------------------------------------------------------ torch layouts
@pytest.mark.parametrize("attention", ["hardmax", "softmax"])
@pytest.mark.parametrize("layout", ["native", "rho-eta"])
def test_torch_layouts_carry_every_head(tmp_path, attention, layout):
    et = pytest.importorskip("exactformer.export")
    data = builtin.vocabulary(12, 6, 4, 2, 4, seed=5)
    model = paper(data, attention=attention, width=16, heads=3)
    assert model.max_heads() > 1
    assert et.max_error(et.convert(model, layout), data) < 1e-9
    path = tmp_path / "m.safetensors"
    et.export(model, path, layout=layout)
    assert et.max_error(et.load_torch(path), data) < 1e-9
    one = copy.deepcopy(model)  # dropping a head's value must show: the heads are really used
    blk = next(b for b in one.blocks if b.sa is not None and len(b.sa.heads) > 1)
    blk.sa.heads[-1].V.p = blk.sa.heads[-1].V.p * 0
    assert et.max_error(et.convert(one, layout), data) > 1e-3


def test_native_file_with_stacked_heads_is_checked(tmp_path):
    et = pytest.importorskip("exactformer.export")
    model = two_head_model()
    config = et.native_config(model)
    assert config["blocks"][0]["sa"] == {"heads": 2}
    tensors = et.native_tensors(model)
    assert tuple(tensors["blocks.0.sa.a"].shape) == (2, 3)
    back = et.native_model(tensors, config)
    assert [len(b.sa.heads) for b in back.blocks] == [2]
    config["blocks"][0]["sa"] = {"heads": 1}
    with pytest.raises(ValueError, match="heads"):
        et.native_model(tensors, config)


def test_plot_title_names_width_and_heads(tmp_path):
    pytest.importorskip("matplotlib")
    from exactformer.tools import plot
    data = builtin.vocabulary(10, 6, 4, 2, 4, seed=1)
    model = paper(data, width=16, heads=3)
    fig = plot.plot_phases(model, data, tmp_path / "p.png")
    assert f"width 16, {model.max_heads()} heads" in fig._suptitle.get_text()
    assert (tmp_path / "p.png").stat().st_size > 0
