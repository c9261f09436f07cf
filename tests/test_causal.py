"""Causal (decoder) mode: data rules, the construction, ordered verification, generation, format.

The backbone is a hypothesis strategy of causal data with what text has: repeated tokens,
shared prefixes, permuted prefixes and unconstrained (null) positions.
"""

from __future__ import annotations

import itertools
import json
import math
from fractions import Fraction

import numpy as np
import pytest
from conftest import conflict_data, paper
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import exactformer as ef
from exactformer.cli import main
from exactformer.construct.gadgets import ff_from_units, hat_units
from exactformer.data import DatasetError
from exactformer.data.causal import CausalDataset, load_dataset
from exactformer.evaluate import forward_causal
from exactformer.model import FF, Block
from exactformer.modelio import ModelFormatError, model_from_dict, model_to_dict
from exactformer.numbers import as_number_array, num, unit
from exactformer.tools.decode import Decoder, generate


@st.composite
def causal_data(draw, max_len=7, null_rate=0.2):
    """Sequences over a small token pool (so tokens repeat), some extending or permuting
    others; the target of a position is a function of its ordered prefix, sometimes null."""
    d = draw(st.integers(2, 4))
    coord = st.integers(-3, 3)
    pool = draw(st.lists(st.tuples(*[coord] * d), min_size=2, max_size=5, unique=True))
    tok = st.sampled_from(range(len(pool)))
    seqs = [draw(st.lists(tok, min_size=1, max_size=max_len))]
    for _ in range(draw(st.integers(0, 4))):
        base = draw(st.sampled_from(seqs))
        kind = draw(st.sampled_from(["fresh", "extend", "permute"]))
        if kind == "fresh":
            seqs.append(draw(st.lists(tok, min_size=1, max_size=max_len)))
        elif kind == "extend":
            cut = draw(st.integers(0, len(base)))
            seqs.append(base[:cut] + draw(st.lists(tok, min_size=1, max_size=3)))
        else:
            seqs.append(list(draw(st.permutations(base))))
    targets_pool = pool + draw(st.lists(st.tuples(*[coord] * d), min_size=1, max_size=3))
    by_prefix: dict[tuple, tuple] = {}
    ys = []
    for s in seqs:
        row = []
        for i in range(len(s)):
            if draw(st.floats(0, 1)) < null_rate:
                row.append(None)
                continue
            key = tuple(s[: i + 1])
            if key not in by_prefix:
                by_prefix[key] = draw(st.sampled_from(targets_pool))
            row.append(list(by_prefix[key]))
        ys.append(row)
    xs = [[list(pool[t]) for t in s] for s in seqs]
    return CausalDataset.from_arrays(xs, ys)


@st.composite
def conflicting_data(draw, null_rate=0.2):
    """Many sequences of one length over two or three tokens in R^3 or R^4: the same token at
    the same position after different prefixes, with different targets, so separation needs
    several rounds (where width and heads matter)."""
    d = draw(st.integers(3, 4))
    coord = st.integers(-3, 3)
    pool = draw(st.lists(st.tuples(*[coord] * d), min_size=2, max_size=3, unique=True))
    outs = draw(st.lists(st.tuples(*[coord] * d), min_size=2, max_size=4))
    n = draw(st.integers(2, 6))
    seqs = draw(st.lists(st.lists(st.sampled_from(range(len(pool))), min_size=n, max_size=n),
                         min_size=3, max_size=12))
    by_prefix: dict[tuple, tuple] = {}
    ys = [[None if draw(st.floats(0, 1)) < null_rate else
           list(by_prefix.setdefault(tuple(s[: i + 1]), draw(st.sampled_from(outs))))
           for i in range(n)] for s in seqs]
    return CausalDataset.from_arrays([[list(pool[t]) for t in s] for s in seqs], ys)


def exact_mismatches(model, data) -> list[tuple[int, int]]:
    """Constrained positions whose exact output is not == its target (zero-padded to the
    model's width: keyed models own coordinates beyond the data's)."""
    xs, ys = data.padded(model.d).fractions()
    outs = forward_causal(model, xs, "exact")
    return [(j, int(i)) for j, (o, y, k) in enumerate(zip(outs, ys, data.known, strict=True))
            for i in np.flatnonzero(k) if tuple(o[i]) != tuple(y[i])]


def max_error(model, data, arithmetic="float", dps=50) -> float:
    data = data.padded(model.d)
    xs, ys = data.fractions() if arithmetic == "mp" else data.floats()
    outs = forward_causal(model, xs, arithmetic, dps=dps)
    errs = [float(np.sqrt(float(sum((a - b) ** 2 for a, b in zip(o[i], y[i], strict=True)))))
            for o, y, k in zip(outs, ys, data.known, strict=True) for i in np.flatnonzero(k)]
    return max(errs, default=0.0)


def text_data(texts: list[str], alphabet: str, d: int = 3) -> tuple[CausalDataset, np.ndarray]:
    """Each text's characters as vectors; the target at every position is the next character
    (null at the last)."""
    vocab = np.array([[k - 2, (5 * k) % 7 - 3, (3 * k) % 5 - 2][:d] for k in range(len(alphabet))])
    vec = {c: [int(v) for v in vocab[k]] for k, c in enumerate(alphabet)}
    xs = [[vec[c] for c in t] for t in texts]
    ys = [[vec[c] for c in t[1:]] + [None] for t in texts]
    return CausalDataset.from_arrays(xs, ys), vocab


# ------------------------------------------------------------------------------ construction
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(causal_data())
def test_hardmax_rational_is_exact_position_by_position(data):
    model = paper(data, causal=True, seed=1)
    assert model.causal and model.exact and model.positions is not None
    assert exact_mismatches(model, data) == []
    report = ef.verify(model, data)
    assert report.ok and all(report.exact_equal) and report.first_failure is None
    R, moves = model.record.R, model.record.moves
    assert model.n_blocks <= R + moves + 2 and moves <= data.constrained
    per_block = 4 * (2 * data.d + 1) + 1 + 2 * (2 * data.d + 1) + 1
    assert model.n_params() <= (R + data.constrained + 2) * per_block
    assert model.max_width() <= 4


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(causal_data())
def test_hardmax_float64_is_accurate(data):
    model = paper(data, causal=True, exact=False, seed=2)
    assert not model.exact
    assert max_error(model, data) <= 1e-9 * data.coordinate_scale()
    assert ef.verify(model, data).ok


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(causal_data(max_len=5))
def test_softmax_within_50_digits(data):
    model = paper(data, attention="softmax", causal=True, seed=3)
    assert model.attention == "softmax" and model.causal
    assert max_error(model, data, "mp", 50) <= 1e-40 * data.coordinate_scale()
    assert model.n_blocks <= model.record.R + model.record.moves + 2
    assert ef.verify(model, data).ok


def test_softmax_float_parameters_and_explicit_tau():
    data, _ = text_data(["abcab", "cabba", "bacab"], "abc")
    model = paper(data, attention="softmax", exact=False, causal=True)
    assert ef.verify(model, data).ok and model.record.R > 0
    fixed = paper(data, attention="softmax", causal=True, tau="1/1024")
    assert fixed.tau == Fraction(1, 1024) and not fixed.record.folded
    assert ef.verify(fixed, data).ok


def test_order_matters_and_repeats_are_told_apart():
    """(a,b,c) and (b,a,c) end at one token with different targets; 'aaaa' repeats a token
    with a different target at every position."""
    a, b, c, y1, y2, y3 = [1, 0], [0, 1], [1, 1], [2, 0], [0, 2], [3, 3]
    data = CausalDataset.from_arrays(
        [[a, b, c], [b, a, c], [a, a, a, a]],
        [[None, None, y1], [None, None, y2], [y1, y2, y3, y1]])
    model = paper(data, seed=0)
    assert model.record.R >= 1
    assert exact_mismatches(model, data) == []


def test_outputs_depend_on_the_prefix_only():
    data, _ = text_data(["abcabca", "cabbac"], "abc")
    model = paper(data)
    xs = data.fractions()[0]
    full = forward_causal(model, xs, "exact")
    for i in range(1, len(xs[0]) + 1):
        (part,) = forward_causal(model, [xs[0][:i]], "exact")
        assert [tuple(r) for r in part] == [tuple(r) for r in full[0][:i]]


def test_verify_names_the_first_failing_position():
    data, _ = text_data(["abcab", "bacba"], "abc")
    model = paper(data)
    last = model.blocks[-1].ff
    last.W = last.W * Fraction(1, 2)  # the last hat now moves its state halfway
    report = ef.verify(model, data)
    assert not report.ok and report.first_failure is not None
    j, i = report.first_failure
    assert data.known[j][i] and not report.exact_equal[j]
    assert "FAILED" in report.table() and f"sequence {j}, position {i}" in report.table()


def test_a_causal_model_is_verified_on_causal_data_only():
    data, _ = text_data(["abc"], "abc")
    model = paper(data)
    with pytest.raises(ValueError, match="causal"):
        ef.verify(model, ef.Dataset.from_arrays([[[1, 0]]], [[[0, 1]]]))
    with pytest.raises(TypeError, match="CausalDataset"):
        paper(ef.Dataset.from_arrays([[[1, 0]]], [[[0, 1]]]), causal=True)


# ------------------------------------------------------------------------------ data rules
@pytest.mark.parametrize("inputs, targets, message", [
    ([[[1, 0], [0, 1]]], [[[1, 1]]], r"sequence 0: 1 targets for 2 input tokens"),
    ([[[1, 0]]], [[[1, 1, 1]]], r"sequence 0, position 0: the target must be null or a token"),
    ([[[1, 0]], [[1, 0, 0]]], [[None], [None]], r"sequence 1, token 0: has 3|dimension"),
    ([[[1, 0]]], [[[float("nan"), 1.0]]], r"sequence 0, position 0: .*not finite"),
    ([[[1.0, float("inf")]]], [[None]], r"sequence 0, token 0: .*not finite"),
    ([[[1]]], [[None]], r"d >= 2"),
    ([], [], r"empty"),
    ([[[1, 0], [0, 1]], [[1, 0], [0, 1], [1, 1]]], [[None, [2, 2]], [None, [3, 3], None]],
     r"\(sequence 0, position 1\) and \(sequence 1, position 1\): equal ordered prefixes"),
])
def test_validation_errors_name_sequence_and_position(inputs, targets, message):
    with pytest.raises(DatasetError, match=message):
        CausalDataset.from_arrays(inputs, targets)


def test_nulls_and_permuted_prefixes_are_not_contradictions():
    data = CausalDataset.from_arrays(
        [[[1, 0], [0, 1]], [[1, 0], [0, 1]], [[0, 1], [1, 0]]],
        [[None, [2, 2]], [[5, 5], None], [None, [3, 3]]])
    assert data.constrained == 3 and data.lengths == [2, 2, 2]


def test_files_json_and_npz(tmp_path):
    data, _ = text_data(["abca", "bcab"], "abc")
    path = tmp_path / "d.json"
    path.write_text(json.dumps(data.to_json_dict()))
    back = load_dataset(path)
    assert isinstance(back, CausalDataset) and back.lengths == data.lengths
    assert [k.tolist() for k in back.known] == [k.tolist() for k in data.known]
    flat_y = np.concatenate(data.floats()[1])
    flat_y[~np.concatenate(data.known)] = np.nan
    np.savez(tmp_path / "d.npz", causal=True, inputs=np.concatenate(data.floats()[0]),
             input_lengths=data.lengths, targets=flat_y, target_mask=np.concatenate(data.known))
    npz = load_dataset(tmp_path / "d.npz")
    assert isinstance(npz, CausalDataset)
    assert all(np.array_equal(a[k], b[k]) for a, b, k in
               zip(npz.floats()[1], data.floats()[1], data.known, strict=True))
    plain = tmp_path / "p.json"
    plain.write_text(json.dumps({"inputs": [[[1, 0]]], "targets": [[[0, 1]]]}))
    assert isinstance(load_dataset(plain), ef.Dataset)
    assert isinstance(load_dataset(plain, causal=False), ef.Dataset)


# ------------------------------------------------------------------------------ generation
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.text("abcd", min_size=2, max_size=9), min_size=1, max_size=4, unique=True),
       st.booleans())
def test_generation_reproduces_training_texts(texts, exact):
    texts = [f"{k}{t}" for k, t in enumerate(texts)]  # a distinct first character each
    alphabet = "".join(sorted(set("".join(texts))))
    data, vocab = text_data(texts, alphabet)
    model = paper(data, exact=exact)
    for j, t in enumerate(texts):
        out = generate(model, data.inputs[j][:1], len(t) - 1, vocabulary=vocab)
        got = "".join(alphabet[int(np.flatnonzero((vocab == np.asarray(r, float)).all(1))[0])]
                      for r in out)
        assert got == t[1:]


def assert_decoder_matches_the_full_pass(model, data):
    """Every sequence fed token by token to a :class:`Decoder` gives the outputs of
    ``forward_causal``: == in exact arithmetic (hardmax), within 1e-9 in float64 (softmax)."""
    arithmetic = "exact" if model.attention == "hardmax" else "float"
    xs = data.fractions()[0] if arithmetic == "exact" else data.floats()[0]
    for x, o in zip(xs, forward_causal(model, xs, arithmetic), strict=True):
        dec = Decoder(model, arithmetic)
        got = np.array([dec.push(t) for t in x])
        if arithmetic == "exact":
            assert [tuple(r) for r in got] == [tuple(r) for r in o]
        else:
            assert np.abs(got - o).max() <= 1e-9


def test_decoder_matches_the_full_pass():
    data, _ = text_data(["abcab", "cabba", "bacab"], "abc")
    for kw in ({}, {"attention": "softmax"}):
        model = paper(data, **kw)
        assert_decoder_matches_the_full_pass(model, data)


def test_generation_errors():
    data, vocab = text_data(["abc"], "abc")
    model = paper(data)
    with pytest.raises(ValueError, match="beyond the model's 3 stored positions"):
        generate(model, data.inputs[0], 2)
    D = model.d
    with pytest.raises(ValueError, match=f"d = {D + 1}, more than the model's width d_model = {D}"):
        generate(model, [list(range(D + 1))], 1)
    with pytest.raises(ValueError, match="n×d with n >= 1"):
        generate(model, [], 1)
    set_model = paper(ef.Dataset.from_arrays([[[1, 0, 0]]], [[[0, 1, 0]]]))
    with pytest.raises(ValueError, match="causal"):
        generate(set_model, [[1, 0, 0]], 1)


# ------------------------------------------------------------------------------ format
def test_format_round_trip(tmp_path):
    data, _ = text_data(["abcab", "bacba"], "abc")
    for exact in (True, False):
        model = paper(data, exact=exact)
        doc = model_to_dict(model)
        assert doc["format"] == "exactformer.model/2" and doc["causal"] is True
        assert len(doc["positions"]) == 5 and all(len(r) == 3 for r in doc["positions"])
        ef.save_model(model, tmp_path / "m.json")
        back = ef.load_model(tmp_path / "m.json")
        assert back.causal and model_to_dict(back) == doc
        assert back.positions.dtype == model.positions.dtype
        assert ef.verify(back, data).ok
    plain = paper(ef.Dataset.from_arrays([[[1, 0]]], [[[0, 1]]]))
    assert model_to_dict(plain)["format"] == "exactformer.model/1"


def test_format_rules():
    data, _ = text_data(["abc"], "abc")
    doc = model_to_dict(paper(data))
    for key in ("causal", "positions"):
        bad = {**doc, "format": "exactformer.model/1"}
        bad.pop("positions" if key == "causal" else "causal")
        with pytest.raises(ModelFormatError, match=f'"{key}" is not part of'):
            model_from_dict(bad)
    with pytest.raises(ModelFormatError, match="causal"):
        model_from_dict({**doc, "causal": "yes"})
    with pytest.raises(ModelFormatError, match=r"positions\[1\]"):
        model_from_dict({**doc, "positions": [["0"] * len(doc["positions"][0]), ["1", "2"]]})
    no_causal = {k: v for k, v in doc.items() if k != "causal"}
    assert not model_from_dict(no_causal).causal


def test_positions_without_causal_shift_a_set_model():
    model = paper(ef.Dataset.from_arrays([[[1, 0], [0, 1]]], [[[5, 5]]]))
    shifted = model_from_dict({**model_to_dict(model), "format": "exactformer.model/2",
                               "positions": [["0", "0"], ["0", "0"]]})
    assert [tuple(r) for r in ef.predict(shifted, [[1, 0], [0, 1]])] == [(5, 5)]
    with pytest.raises(ValueError, match="sequence 0 has 3 tokens"):
        ef.forward(shifted, [np.array([[1, 0], [0, 1], [2, 2]])])


# ------------------------------------------------------------------------------ CLI
def test_cli_build_verify_generate(tmp_path, capsys):
    data, vocab = text_data(["abcab", "bacba"], "abc")
    (tmp_path / "d.json").write_text(json.dumps(data.to_json_dict()))
    (tmp_path / "v.json").write_text(json.dumps({c: [int(v) for v in vocab[k]]
                                                 for k, c in enumerate("abc")}))
    m = str(tmp_path / "m.json")
    assert main(["build", str(tmp_path / "d.json"), "-o", m]) == 0
    assert "causal hardmax" in capsys.readouterr().out
    assert main(["verify", m, str(tmp_path / "d.json")]) == 0
    assert "EXACT" in capsys.readouterr().out
    assert main(["generate", m, "--prompt", "b", "--vocabulary", str(tmp_path / "v.json")]) == 0
    assert capsys.readouterr().out.strip() == "acba"
    assert main(["generate", m, "--prompt", "[[9, 9, 9]]", "--steps", "1"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 1
    assert main(["generate", m, "--prompt", "z", "--vocabulary", str(tmp_path / "v.json")]) == 2
    assert "prompt item 0" in capsys.readouterr().err
    assert main(["info", m]) == 0
    assert "stored positions" in capsys.readouterr().out
    plain = tmp_path / "p.json"
    plain.write_text(json.dumps({"inputs": data.to_json_dict()["inputs"],
                                 "targets": data.to_json_dict()["targets"]}))
    assert main(["build", str(plain), "-o", m, "--causal", "--float"]) == 0
    assert main(["verify", m, str(plain)]) == 0


# ------------------------------------------------------------------------------ example
def test_recite_example_small():
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parent.parent / "examples" / "recite.py"
    spec = importlib.util.spec_from_file_location("recite", path)
    recite = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recite)
    assert len(recite.PASSAGE) >= 2000
    rows = recite.main(chars=150)
    assert [r["label"] for r in rows] == ["passage", "shared openings"]
    assert all(r["verified"] and r["recited"] for r in rows)
    assert rows[0]["R_c"] == 0 and rows[1]["R_c"] >= 1
    assert rows[0]["L"] <= rows[0]["characters"] - 1 + 2


# ------------------------------------------------------------------------------ torch
@pytest.mark.parametrize("attention", ["hardmax", "softmax"])
def test_torch_layouts_apply_the_causal_mask_and_positions(tmp_path, attention):
    et = pytest.importorskip("exactformer.export")
    data, _ = text_data(["abcab", "cabba", "bac"], "abc")
    model = paper(data, attention=attention)
    assert model.record.R > 0  # attention layers that the mask matters for
    ref = forward_causal(model, data.floats()[0], "float")
    for layout in et.LAYOUTS:
        module = et.convert(model, layout)
        outs = et.apply(module, data.floats()[0])  # padded batch: sequences of 5, 5 and 3
        for o, r, k in zip(outs, ref, data.known, strict=True):
            assert np.abs(o[k] - r[k]).max() <= 1e-9
        assert et.max_error(module, data) <= 1e-9
        et.export(model, tmp_path / f"{layout}.safetensors", layout=layout)
        config = json.loads((tmp_path / f"{layout}.config.json").read_text())
        assert config["causal"] is True and config["positions"] == 5
        again = et.apply(et.load_torch(tmp_path / f"{layout}.safetensors"), data.floats()[0])
        assert all(np.abs(a - o).max() <= 1e-9 for a, o in zip(again, outs, strict=True))
        with pytest.raises(ValueError, match="stores 5 positions"):
            et.apply(module, [np.zeros((6, 3))])
    verdict = et.float32_verdict(model, data)
    assert verdict.interpolates


def test_torch_causal_mask_hides_later_tokens():
    torch = pytest.importorskip("torch")
    et = pytest.importorskip("exactformer.export")
    S = torch.tensor([[[1.0, 5.0], [1.0, 5.0]]])
    w = et.attention_weights(S, None, "hardmax", None, causal=True)
    assert w.tolist() == [[[1.0, 0.0], [0.0, 1.0]]]
    assert et.attention_weights(S, None, "hardmax", None).tolist() == [[[0.0, 1.0], [0.0, 1.0]]]


def test_no_constrained_position_gives_an_empty_interpolation():
    data = CausalDataset.from_arrays([[[1, 0], [0, 1]], [[0, 1], [0, 1]]], [[None, None]] * 2)
    assert data.constrained == 0
    for attention in ("hardmax", "softmax"):
        model = paper(data, attention=attention)
        assert model.record.moves == 0 and ef.verify(model, data).ok


@pytest.mark.parametrize("causal", [False, True])
def test_positions_are_added_exactly_in_an_exact_pass(causal):
    """A float64 model's positions are converted exactly before they meet Fraction inputs."""
    model = ef.Transformer(d=2, attention="hardmax", blocks=[], exact=False, causal=causal,
                           positions=np.array([[0.25, 0.0], [0.5, 0.1]]))
    x = np.array([[Fraction(1, 3), Fraction(0)], [Fraction(0), Fraction(1, 3)]], dtype=object)
    (out,) = ef.forward(model, [x], "exact")
    assert [tuple(r) for r in out] == [(Fraction(7, 12), 0), (Fraction(1, 2),
                                                              Fraction(1, 3) + Fraction(0.1))]


def test_the_causal_record_is_type_checked_on_load():
    data, _ = text_data(["abcab", "bacba"], "abc")
    doc = model_to_dict(paper(data, attention="softmax"))
    rec = model_from_dict(doc).record
    assert rec.kind == "causal-softmax" and rec.constrained == data.constrained
    assert rec.stored_positions == 5 and len(rec.snap_windows) == rec.moves
    with pytest.raises(ModelFormatError, match=r"meta.moves"):
        model_from_dict({**doc, "meta": {**doc["meta"], "moves": -1}})
    with pytest.raises(ModelFormatError, match=r"meta.snap_windows\[0\]"):
        model_from_dict({**doc, "meta": {**doc["meta"], "snap_windows": [["1", "2"]]}})
    with pytest.raises(ModelFormatError, match=r"meta.lifts\[0\].position"):
        model_from_dict({**doc, "meta": {**doc["meta"], "lifts": [
            {"round": 1, "sequence": 0, "position": "x", "from": "1", "to": "2",
             "lambda": "1"}]}})


def _float_causal(blocks):
    return ef.Transformer(d=2, attention="hardmax", blocks=blocks, exact=False, causal=True)


def test_float_causal_verdict_rests_on_the_exact_pass():
    """x ↦ (x + 10^16) − 10^16 is the identity exactly but sends x = 1 to 0 in float64: with
    0 as the target a float64 pass says it is met; the exact pass of the stored floats says no."""
    up = FF(1.0, np.zeros((1, 2)), np.array([1e16]), np.array([[1.0], [0.0]]))
    down = FF(1.0, np.zeros((1, 2)), np.array([1e16]), np.array([[-1.0], [0.0]]))
    data = CausalDataset.from_arrays([[[1.0, 0.0], [4.0, 1.0]]], [[[0.0, 0.0], [4.0, 1.0]]])
    report = ef.verify(_float_causal([Block(up, None), Block(down, None)]), data)
    assert report.errors_float64[0] == 0.0
    assert not report.ok and not report.proved and report.first_failure == (0, 0)


def test_causal_tolerance_is_relative_to_the_data_scale():
    """The identity model on data at 1e-10 whose targets are 1e-10 away: not a pass."""
    data = CausalDataset.from_arrays([[[1e-10, 0.0], [0.0, 1e-10]]],
                                     [[[2e-10, 0.0], None]])
    report = ef.verify(_float_causal([]), data)
    assert not report.ok and report.coordinate_scale == 2e-10


# ------------------------------------------------------------------------------ width and heads
def wide(data, k: int, heads: int, **kw):
    """``compile(data, width=4k, heads=heads)`` with its shape checked: L = R_c + ⌈moves/k⌉
    (+ 1 projection for softmax when anything is snapped), or ⌈moves/4k⌉ with position keys
    (one unit per move), FF width ≤ 4k, at most min(heads, d − 1) heads (docs/causal.md)."""
    model = paper(data, causal=True, width=4 * k, heads=heads, **kw)
    rec = model.record
    projection = int(model.attention == "softmax" and rec.moves > 0)
    if rec.position_code is not None:
        assert model.n_blocks == math.ceil(rec.moves / (4 * k)) and rec.R == 0
    else:
        assert model.n_blocks == rec.R + math.ceil(rec.moves / k) + projection
    assert rec.moves <= data.constrained
    assert model.max_width() <= 4 * k
    assert model.max_heads() <= max(1, min(heads, data.d - 1))
    assert ef.verify(model, data).blocks_design == model.n_blocks  # the report's bound agrees
    return model


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(causal_data(), conflicting_data()), st.integers(1, 4), st.integers(1, 3))
def test_wide_hardmax_rational_is_proved_position_by_position(data, k, heads):
    model = wide(data, k, heads, seed=1)
    assert exact_mismatches(model, data) == []
    report = ef.verify(model, data)
    assert report.ok and report.proved


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(causal_data(max_len=5), conflicting_data()), st.integers(1, 3),
       st.integers(1, 3), st.booleans())
def test_wide_float64_and_softmax_are_accurate(data, k, heads, softmax):
    if softmax:
        model = wide(data, k, heads, attention="softmax", seed=3)
        assert max_error(model, data, "mp", 50) <= 1e-40 * data.coordinate_scale()
    else:
        model = wide(data, k, heads, exact=False, seed=2)
        assert max_error(model, data) <= 1e-9 * data.coordinate_scale()
    assert ef.verify(model, data).ok


def test_channels_put_several_tests_in_one_round():
    data = conflict_data()
    narrow = wide(data, 1, 1)
    model = wide(data, 4, 3)
    assert model.max_heads() >= 2 and any(x.channel for x in model.record.lifts)
    assert model.record.R < narrow.record.R and 2 * model.n_blocks < narrow.n_blocks
    assert ef.verify(model, data).proved
    doc = model_to_dict(model)
    assert any("channel" in x for x in doc["meta"]["lifts"])
    again = model_from_dict(json.loads(json.dumps(doc)))
    assert again.record.lifts == model.record.lifts and ef.verify(again, data).proved
    soft = wide(data, 4, 3, attention="softmax", exact=False)
    assert soft.max_heads() >= 2 and ef.verify(soft, data).ok


def test_width_and_heads_are_checked_for_causal_data():
    data = CausalDataset.from_arrays([[[0, 1], [1, 0]]], [[[2, 2], [3, 3]]])
    with pytest.raises(ValueError, match="multiple of 4"):
        paper(data, width=6)
    with pytest.raises(ValueError, match="heads must be"):
        paper(data, heads=0)
    assert ef.verify(wide(data, 2, 5), data).proved  # d = 2: one channel, one head


def test_decoder_matches_the_full_pass_on_wide_multi_head_models():
    data = conflict_data(seed=4, n=6)
    for kw in ({}, {"attention": "softmax"}):
        model = wide(data, 3, 3, **kw)
        assert model.max_heads() >= 2 and model.max_width() > 4
        assert_decoder_matches_the_full_pass(model, data)


@pytest.mark.parametrize("exact", [True, False])
def test_decoder_applies_a_wide_layer_from_its_input(exact):
    """One layer of two hats on e1: t = 1 goes to t = 3, inside the second hat's window, which
    must not move it again (both hats read the layer's input); t = 2 lies between the windows
    and stays exactly where it is, also in float64, where the first hat's four active ReLUs
    would not cancel exactly (its move has a non-dyadic coordinate)."""
    e1, z, half = unit(2, 0, exact), num(0, exact), num(Fraction(1, 2), exact)
    units = (hat_units(e1, z, num(1, exact), half, as_number_array([2, Fraction(1, 10)], exact))
             + hat_units(e1, z, num(3, exact), half, e1 * 5))
    model = ef.Transformer(d=2, attention="hardmax", exact=exact, causal=True,
                           blocks=[Block(ff_from_units(units, num(1, exact), 2, exact), None)])
    arithmetic = "exact" if exact else "float"
    xs = [np.array([[1, 0], [2, 0]])]
    (full,) = forward_causal(model, xs, arithmetic)
    dec = Decoder(model, arithmetic)
    got = [tuple(dec.push(x)) for x in xs[0]]
    assert got == [tuple(r) for r in full]
    assert got[0][0] == 3 and got[1] == (2, 0)


def test_generation_with_a_multi_head_model():
    """Eight texts 'xyzc' + two letters over x, y, z ∈ {a, b}: what follows the c depends on the
    whole prefix, so separation needs several tests, here on two channels."""
    texts = ["".join(p) + "c" + "abcab"[i % 5] + "c"
             for i, p in enumerate(itertools.product("ab", repeat=3))]
    _, vocab = text_data(["abc"], "abc")
    vec = {c: vocab[k].tolist() for k, c in enumerate("abc")}
    data = CausalDataset.from_arrays([[vec[c] for c in t] for t in texts],
                                     [[None] * 3 + [vec[c] for c in t[4:]] + [None]
                                      for t in texts])
    model = wide(data, 2, 2)
    assert model.max_heads() == 2
    for j, t in enumerate(texts):
        out = generate(model, data.inputs[j][:4], 2, vocabulary=vocab)
        assert ["abc"[int(np.flatnonzero((vocab == np.asarray(r, float)).all(1))[0])]
                for r in out] == list(t[4:])


def test_cli_builds_a_wide_causal_model(tmp_path, capsys):
    data = conflict_data(n=6)
    (tmp_path / "d.json").write_text(json.dumps(data.to_json_dict()))
    m = str(tmp_path / "m.json")
    assert main(["build", str(tmp_path / "d.json"), "-o", m, "--width", "8", "--heads", "2"]) == 0
    assert "width 8" in capsys.readouterr().out
    assert main(["verify", m, str(tmp_path / "d.json")]) == 0
    assert "EXACT" in capsys.readouterr().out


@pytest.mark.parametrize("attention", ["hardmax", "softmax"])
def test_torch_round_trip_of_a_wide_multi_head_causal_model(tmp_path, attention):
    et = pytest.importorskip("exactformer.export")
    data = conflict_data(seed=3, n=6)
    model = wide(data, 4, 3, attention=attention)
    assert model.max_heads() >= 2
    ref = forward_causal(model, data.floats()[0], "float")
    for layout in et.LAYOUTS:
        module = et.convert(model, layout)
        outs = et.apply(module, data.floats()[0])
        for o, r, k in zip(outs, ref, data.known, strict=True):
            assert np.abs(o[k] - r[k]).max() <= 1e-9
        et.export(model, tmp_path / f"{layout}.safetensors", layout=layout)
        again = et.apply(et.load_torch(tmp_path / f"{layout}.safetensors"), data.floats()[0])
        assert all(np.abs(a - o).max() <= 1e-9 for a, o in zip(again, outs, strict=True))
