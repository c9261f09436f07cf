"""The JSON model format exactformer.model/1: round trips, documented keys, malformed files."""

from __future__ import annotations

import json
import re
from fractions import Fraction

import numpy as np
import pytest
from conftest import datasets, token_set
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import exactformer as ef
from exactformer.data import builtin
from exactformer.model import FF, SA, Block, ScoreMatrix, Transformer, ValueMatrix
from exactformer.modelio import (
    FORMAT,
    NPZ_KEYS,
    ModelFormatError,
    atomic_path,
    load_model,
    model_from_dict,
    model_to_dict,
    save_model,
)
from exactformer.numbers import fmt, fmt_array

SETTINGS = settings(max_examples=25, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def obj(values) -> np.ndarray:
    a = np.asarray(values, dtype=object)
    out = np.empty(a.shape, dtype=object)
    out.flat[:] = [Fraction(v) for v in a.flat]
    return out


def same_number(a, b) -> bool:
    """Equal value and equal type (Fraction stays Fraction, float stays the same float)."""
    if isinstance(a, float) or isinstance(b, float):
        both = isinstance(a, float) and isinstance(b, float)
        return both and a == b and (a == 0 or float(a).hex() == float(b).hex())
    return type(a) is type(b) and a == b


def assert_identical(m1: Transformer, m2: Transformer) -> None:
    """Same structure, parameters (floats bit for bit, -0.0 included) and file content."""
    assert (m1.d, m1.attention, m1.exact, m1.n_blocks) == (m2.d, m2.attention, m2.exact,
                                                           m2.n_blocks)
    assert same_number(m1.tau, m2.tau) if m1.tau is not None else m2.tau is None
    for b1, b2 in zip(m1.blocks, m2.blocks, strict=True):
        assert (b1.ff is None) == (b2.ff is None) and (b1.sa is None) == (b2.sa is None)
        if b1.ff is not None:
            assert b1.ff.U.shape == b2.ff.U.shape and b1.ff.W.shape == b2.ff.W.shape
            assert b1.ff.b.shape == b2.ff.b.shape
    p1, p2 = m1.parameters(), m2.parameters()
    assert len(p1) == len(p2)
    assert all(same_number(a, b) for a, b in zip(p1, p2, strict=True))
    if not m1.exact:
        bits = [np.array(p, dtype=float).view(np.int64) for p in (p1, p2)]
        assert (bits[0] == bits[1]).all()
    assert model_to_dict(m1) == model_to_dict(m2)


def hand_model(d=2, attention="hardmax", exact=True, tau=None) -> Transformer:
    conv = Fraction if exact else float

    def arr(values):
        return obj(values) if exact else np.asarray(values, dtype=float)

    ff = FF(conv(1), arr([[1, -2], [Fraction(3, 7), 0], [0, 1]]), arr([Fraction(-1, 2), 0, 2]),
            arr([[1, 0, Fraction(-5, 3)], [0, 2, 1]]))
    sa = SA(conv(1), ScoreMatrix(conv(Fraction(1, 3)), arr([1, 0]), arr([0, 1])),
            ValueMatrix(conv(0), arr([0, Fraction(1, 9)]), arr([1, 1])))
    blocks = [Block(ff, sa), Block(None, sa), Block(ff, None), Block(None, None)]
    return Transformer(d=d, attention=attention, blocks=blocks, tau=tau, exact=exact)


# ------------------------------------------------------------------------------ round trips
@SETTINGS
@given(ds=datasets(), seed=st.integers(0, 1000))
def test_exact_round_trip_is_identical(tmp_path_factory, ds, seed):
    model = ef.compile(ds, exact=True, seed=seed)
    path = tmp_path_factory.mktemp("rt") / "model.json"
    save_model(model, path)
    back = load_model(path)
    assert_identical(model, back)
    assert back.meta == json.loads(json.dumps(model.meta))
    # and the loaded model still interpolates, exactly
    xs, ys = ds.padded(model.d).fractions()
    for o, y in zip(ef.forward(back, xs, "exact"), ys, strict=True):
        assert token_set(o) == token_set(y)
    save_model(back, path.with_name("again.json"))
    assert path.read_text() == path.with_name("again.json").read_text()


@SETTINGS
@given(ds=datasets(), seed=st.integers(0, 1000))
def test_float64_round_trip_restores_identical_floats(tmp_path_factory, ds, seed):
    model = ef.compile(ds, exact=False, seed=seed)
    path = tmp_path_factory.mktemp("rt") / "model.json"
    save_model(model, path)
    back = load_model(path)
    assert not back.exact
    assert_identical(model, back)
    doc = json.loads(path.read_text())
    assert doc["number"] == "float64"
    # a second trip is byte for byte the same file
    save_model(back, path.with_name("again.json"))
    again = path.with_name("again.json")
    save_model(load_model(again), path.with_name("third.json"))
    assert again.read_text() == path.with_name("third.json").read_text()


def test_negative_zero_survives(tmp_path):
    m = hand_model(exact=False)
    m.blocks[0].ff.W[0, 1] = -0.0
    save_model(m, tmp_path / "m.json")
    back = load_model(tmp_path / "m.json")
    assert np.signbit(back.blocks[0].ff.W[0, 1])
    assert model_to_dict(back) == model_to_dict(m)


@pytest.mark.parametrize("value", [0.1, 1 / 3, -2.5e-300, 5e-324, 1.7976931348623157e308,
                                   2.2250738585072014e-308, 123456789.123456789, -7.0, 0.0])
def test_awkward_floats_survive(tmp_path, value):
    m = hand_model(exact=False)
    m.blocks[0].ff.U[1, 1] = value
    m.blocks[0].sa.A.alpha = value
    save_model(m, tmp_path / "m.json")
    back = load_model(tmp_path / "m.json")
    assert same_number(back.blocks[0].ff.U[1, 1], value)
    assert same_number(back.blocks[0].sa.A.alpha, value)
    assert_identical(m, back)


def test_hand_made_exact_model_round_trip(tmp_path):
    m = hand_model()
    m.blocks[0].ff.W[0, 0] = Fraction(10**30 + 1, 3**40)
    save_model(m, tmp_path / "m.json")
    back = load_model(tmp_path / "m.json")
    assert_identical(m, back)
    assert back.blocks[0].ff.W[0, 0] == Fraction(10**30 + 1, 3**40)
    assert back.blocks[1].ff is None and back.blocks[2].sa is None
    assert back.blocks[3].ff is None and back.blocks[3].sa is None


def test_softmax_model_round_trip_keeps_tau(tmp_path):
    m = hand_model(attention="softmax", tau=Fraction(3, 4))
    save_model(m, tmp_path / "m.json")
    doc = json.loads((tmp_path / "m.json").read_text())
    assert doc["attention"] == "softmax" and doc["tau"] == "3/4"
    back = load_model(tmp_path / "m.json")
    assert back.tau == Fraction(3, 4) and back.attention == "softmax"
    assert_identical(m, back)


# ------------------------------------------------------------------------------ the format
def walk_numbers(node, where="doc"):
    """Yield (where, value) for every leaf of a blocks tree."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield from walk_numbers(v, f"{where}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from walk_numbers(v, f"{where}[{i}]")
    elif node is not None:
        yield where, node


def test_documented_format_keys(tmp_path):
    ds = builtin.demo()
    model = ef.compile(ds, exact=True, seed=0)
    save_model(model, tmp_path / "m.json")
    doc = json.loads((tmp_path / "m.json").read_text())
    d = model.d  # the model's width: the data's d plus the keyed model's own coordinates
    assert d > ds.d
    assert doc["format"] == "exactformer.model/1" == FORMAT
    assert doc["d"] == d and doc["attention"] == "hardmax" and doc["number"] == "rational"
    assert "tau" not in doc
    assert isinstance(doc["meta"], dict) and doc["meta"]["R"] == model.meta["R"]
    assert len(doc["blocks"]) == model.n_blocks
    n_ff = n_sa = 0
    for blk, b in zip(doc["blocks"], model.blocks, strict=True):
        assert set(blk) == {"ff", "sa"}
        if blk["ff"] is not None:
            n_ff += 1
            ff = blk["ff"]
            assert set(ff) == {"eta", "U", "b", "W"}
            w = len(ff["U"])
            assert 1 <= w <= 4 and all(len(row) == d for row in ff["U"])
            assert len(ff["b"]) == w and len(ff["W"]) == d
            assert all(len(row) == w for row in ff["W"])
            assert Fraction(ff["eta"]) == b.ff.eta
            assert [[Fraction(v) for v in r] for r in ff["U"]] == b.ff.U.tolist()
            assert [Fraction(v) for v in ff["b"]] == b.ff.b.tolist()
            assert [[Fraction(v) for v in r] for r in ff["W"]] == b.ff.W.tolist()
        else:
            assert b.ff is None
        if blk["sa"] is not None:
            n_sa += 1
            sa = blk["sa"]
            assert set(sa) == {"rho", "A", "V"}
            assert set(sa["A"]) == {"alpha", "a", "c"} and set(sa["V"]) == {"beta", "p", "q"}
            for key in ("a", "c"):
                assert len(sa["A"][key]) == d
            for key in ("p", "q"):
                assert len(sa["V"][key]) == d
            assert Fraction(sa["rho"]) == b.sa.rho
            assert Fraction(sa["A"]["alpha"]) == b.sa.A.alpha
            assert [Fraction(v) for v in sa["A"]["a"]] == b.sa.A.a.tolist()
            assert [Fraction(v) for v in sa["A"]["c"]] == b.sa.A.c.tolist()
            assert Fraction(sa["V"]["beta"]) == b.sa.V.beta
            assert [Fraction(v) for v in sa["V"]["p"]] == b.sa.V.p.tolist()
            assert [Fraction(v) for v in sa["V"]["q"]] == b.sa.V.q.tolist()
        else:
            assert b.sa is None
    assert n_ff == model.n_blocks and n_sa >= 1
    leaves = list(walk_numbers(doc["blocks"], "blocks"))
    assert len(leaves) == len(model.parameters())
    for where, v in leaves:
        assert isinstance(v, str), f"{where} is not a string"
        Fraction(v)  # parses exactly


def test_float64_file_numbers_are_strings(tmp_path):
    model = ef.compile(builtin.demo(), exact=False, seed=0)
    save_model(model, tmp_path / "m.json")
    doc = json.loads((tmp_path / "m.json").read_text())
    for where, v in walk_numbers(doc["blocks"], "blocks"):
        assert isinstance(v, str), where
        assert float(Fraction(v)) == float(v)


HAND_DOC = {
    "format": "exactformer.model/1", "d": 3, "attention": "hardmax",
    "blocks": [
        {"ff": None, "sa": None},
        {"ff": {"eta": "1", "U": [["1", "0", "0"]], "b": ["-3/7"],
                "W": [["0"], ["2"], ["-0.125"]]}, "sa": None},
        {"ff": None,
         "sa": {"rho": "0", "A": {"alpha": "1", "a": ["0", "0", "0"], "c": ["0", "0", "0"]},
                "V": {"beta": "1", "p": ["0", "0", "0"], "q": ["0", "0", "0"]}}},
    ],
}


def test_hand_written_file_with_identity_layers(tmp_path):
    (tmp_path / "m.json").write_text(json.dumps(HAND_DOC))
    m = load_model(tmp_path / "m.json")
    assert m.exact and m.d == 3 and m.n_blocks == 3 and m.meta == {}
    assert m.blocks[0].ff is None and m.blocks[0].sa is None
    assert m.blocks[1].sa is None and m.blocks[2].ff is None
    ff = m.blocks[1].ff
    assert ff.b[0] == Fraction(-3, 7) and ff.W[2, 0] == Fraction(-1, 8)
    assert all(isinstance(v, Fraction) for v in m.parameters())
    # FF: x + W relu(x0 - 3/7); SA: A = I, V = I, rho = 0 (each token -> argmax <x_i, x_l>)
    x = obj([[1, 0, 0], [0, 0, 1]])
    (out,) = ef.forward(m, [x], "exact")
    moved = [Fraction(1), Fraction(8, 7), Fraction(-1, 14)]  # token 0 after the FF
    assert out[0].tolist() == moved  # |moved|^2 > <moved, (0,0,1)>
    assert out[1].tolist() == [0, 0, 1]  # <e3, e3> = 1 > <e3, moved> = -1/14


def test_identity_only_model_is_the_identity(tmp_path):
    doc = {"format": "exactformer.model/1", "d": 2, "attention": "hardmax",
           "blocks": [{"ff": None, "sa": None}] * 3}
    (tmp_path / "m.json").write_text(json.dumps(doc))
    m = load_model(tmp_path / "m.json")
    x = obj([[1, 2], ["1/3", -4], [0, 0]])
    (out,) = ef.forward(m, [x], "exact")
    assert out.tolist() == x.tolist()
    assert m.n_params() == 0 and m.max_width() == 0


# ------------------------------------------------------------------------------ malformed
def doc_with(**changes):
    doc = json.loads(json.dumps(HAND_DOC))
    doc.update(changes)
    return doc


def block_doc(ff="keep", sa="keep"):
    blk = json.loads(json.dumps(HAND_DOC["blocks"][1]))
    blk["sa"] = json.loads(json.dumps(HAND_DOC["blocks"][2]["sa"]))
    if ff != "keep":
        blk["ff"] = ff
    if sa != "keep":
        blk["sa"] = sa
    return doc_with(blocks=[blk])


def modified(path: list, value):
    doc = block_doc()
    node = doc["blocks"][0]
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    return doc


@pytest.mark.parametrize("doc, parts", [
    ([HAND_DOC], ["format"]),
    (doc_with(format="exactformer.model/3"), ["format", FORMAT]),
    ({k: v for k, v in HAND_DOC.items() if k != "format"}, ["format"]),
    (doc_with(d=0), ['"d"', "positive integer"]),
    (doc_with(d="3"), ['"d"', "positive integer"]),
    (doc_with(attention="relu"), ['"attention"', "hardmax"]),
    (doc_with(attention="softmax"), ["tau"]),
    (doc_with(attention="softmax", tau="0"), ['"tau"', "positive"]),
    (doc_with(attention="softmax", tau="-1/2"), ['"tau"', "positive"]),
    (modified(["ff", "U", 0], ["1", "0"]), ["blocks[0].ff.U[0]", "3 numbers"]),
    (modified(["ff", "b"], ["1", "2"]), ["blocks[0].ff.b", "1 numbers"]),
    (modified(["ff", "W"], [["0"], ["2"]]), ["blocks[0].ff.W", "3 rows"]),
    (modified(["ff", "W", 1], ["1", "2"]), ["blocks[0].ff.W[1]", "1 numbers"]),
    (modified(["ff", "eta"], "one"), ["blocks[0].ff.eta", "'one'", "exact number"]),
    (modified(["ff", "b", 0], "1/0"), ["blocks[0].ff.b", "exact number"]),
    (modified(["ff", "U", 0, 2], "nan"), ["blocks[0].ff.U[0]", "exact number"]),
    (modified(["sa", "A", "alpha"], "x"), ["blocks[0].sa.A.alpha", "exact number"]),
    (modified(["sa", "A", "c"], ["1"]), ["blocks[0].sa.A.c", "3 numbers"]),
    (modified(["sa", "V", "p"], "0"), ["blocks[0].sa.V.p", "3 numbers"]),
    (modified(["sa", "V", "q", 2], None), ["blocks[0].sa.V.q", "exact number"]),
    (modified(["sa", "rho"], "inf"), ["blocks[0].sa.rho", "exact number"]),
])
def test_malformed_documents(tmp_path, doc, parts):
    p = tmp_path / "m.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(ModelFormatError) as info:
        load_model(p)
    msg = str(info.value)
    for part in parts:
        assert part in msg, f"{part!r} not in {msg!r}"


def test_missing_matrix_names_the_field():
    doc = block_doc()
    del doc["blocks"][0]["ff"]["U"]
    with pytest.raises(ModelFormatError, match=re.escape("blocks[0].ff.U")):
        model_from_dict(doc)


def test_compiled_meta_is_plain_json():
    # Σm > N, so the construction moves circle leaders and records them in meta["leaders"]
    ds = ef.Dataset.from_arrays([[[0, 0]], [[0, 1]], [[0, 0], [0, 1], [0, -1]]],
                                [[[0, 0]], [[0, 0]], [[0, 0], [0, 1]]])
    for exact in (True, False):
        meta = ef.compile(ds, exact=exact, seed=0).meta
        assert json.loads(json.dumps(meta)) == meta


def test_not_json(tmp_path):
    p = tmp_path / "m.json"
    p.write_text('{"format": "exactformer.model/1", "d": ')
    with pytest.raises(ModelFormatError, match="not valid JSON"):
        load_model(p)


def test_missing_file_is_an_os_error(tmp_path):
    with pytest.raises(OSError):
        load_model(tmp_path / "absent.json")



@pytest.mark.parametrize("doc", [
    pytest.param(doc_with(blocks=[1]), id="block-int"),
    pytest.param(doc_with(blocks=[None]), id="block-null"),
    pytest.param(doc_with(blocks="abc"), id="blocks-string"),
    pytest.param(block_doc(ff=5), id="ff-int"),
    pytest.param(block_doc(sa=["rho"]), id="sa-list"),
    pytest.param(modified(["sa", "A"], "I"), id="A-string"),
])
def test_malformed_structure_is_a_format_error(doc):
    with pytest.raises(ModelFormatError, match=r"blocks"):
        model_from_dict(doc)


# ------------------------------------------------------------------------------ atomic writes
def test_failed_write_leaves_nothing(tmp_path):
    target = tmp_path / "out.json"
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_text("partial")
        raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_failed_save_keeps_the_old_file(tmp_path):
    target = tmp_path / "out.json"
    target.write_text("old")
    m = hand_model()
    m.blocks[0].ff.eta = object()  # not a number: formatting fails half-way
    with pytest.raises(TypeError):
        save_model(m, target)
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_save_creates_parent_directories(tmp_path):
    target = tmp_path / "a" / "b" / "m.json"
    save_model(hand_model(), target)
    assert_identical(hand_model(), load_model(target))
    assert [p.name for p in target.parent.iterdir()] == ["m.json"]


def test_atomic_path_refuses_a_directory(tmp_path):
    (tmp_path / "out.json").mkdir()
    with pytest.raises(IsADirectoryError, match="is a directory"), \
            atomic_path(tmp_path / "out.json"):
        pass
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_atomic_temporary_keeps_the_suffix(tmp_path):
    with atomic_path(tmp_path / "fig.png") as tmp:
        assert tmp.parent == tmp_path and tmp.suffix == ".png" and tmp.name.startswith(".")
        tmp.write_text("x")
    assert [p.name for p in tmp_path.iterdir()] == ["fig.png"]


# ------------------------------------------------------------------------------ fast paths
float_arrays = st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=0,
                        max_size=12)


@SETTINGS
@given(values=float_arrays, cols=st.integers(1, 3))
def test_fmt_array_is_fmt_of_every_entry(values, cols):
    a = np.array(values, dtype=float)
    assert fmt_array(a) == [fmt(v) for v in a]
    m = a[: len(a) // cols * cols].reshape(-1, cols)
    assert fmt_array(m) == [[fmt(v) for v in row] for row in m]
    o = obj([[Fraction(1, 3), 2], [Fraction(-5, 7), 0]])
    assert fmt_array(o) == [["1/3", "2"], ["-5/7", "0"]]


@SETTINGS
@given(values=st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=3,
                       max_size=3))
def test_float64_json_restores_every_bit(tmp_path_factory, values):
    m = hand_model(exact=False)
    m.blocks[0].ff.U[1] = values[:2]
    m.blocks[0].sa.V.p[0] = values[2]
    path = tmp_path_factory.mktemp("f") / "m.json"
    save_model(m, path)
    assert_identical(m, load_model(path))


def test_float64_file_with_fractions_and_bad_strings():
    doc = block_doc()
    doc["number"] = "float64"
    doc["blocks"][0]["ff"]["W"] = [["1/3"], ["-0.0"], ["2"]]
    m = model_from_dict(doc)
    assert m.blocks[0].ff.W[:, 0].tolist() == [1 / 3, 0.0, 2.0]
    assert np.signbit(m.blocks[0].ff.W[1, 0]) and not m.exact
    for bad, words in (("nan", "not an exact number"), ("1e400", "float64 range"),
                       ("1e999999999", "exponent")):
        doc["blocks"][0]["ff"]["W"][2] = [bad]
        with pytest.raises(ModelFormatError, match=re.escape("blocks[0].ff.W[2]")) as info:
            model_from_dict(doc)
        assert words in str(info.value)


# ------------------------------------------------------------------------------ .npz models
@SETTINGS
@given(ds=datasets(), seed=st.integers(0, 1000))
def test_npz_round_trip_is_identical(tmp_path_factory, ds, seed):
    model = ef.compile(ds, exact=False, seed=seed)
    folder = tmp_path_factory.mktemp("npz")
    save_model(model, folder / "m.npz")
    back = load_model(folder / "m.npz")
    assert_identical(model, back)
    assert back.meta == json.loads(json.dumps(model.meta))
    save_model(back, folder / "m.json")  # the same content as JSON
    assert_identical(load_model(folder / "m.json"), back)
    assert sorted(p.name for p in folder.iterdir()) == ["m.json", "m.npz"]


@pytest.mark.parametrize("value", [-0.0, 5e-324, -1.7976931348623157e308, 0.1, 1 / 3])
def test_npz_keeps_bit_patterns_and_identities(tmp_path, value):
    m = hand_model(exact=False, attention="softmax", tau=0.375)
    m.blocks[0].ff.U[1, 1] = value
    m.blocks[1].sa.V.q[0] = value
    save_model(m, tmp_path / "m.npz")
    back = load_model(tmp_path / "m.npz")
    assert_identical(m, back)
    assert back.blocks[3].ff is None and back.blocks[3].sa is None
    m.blocks.append(Block(FF(2.0, np.zeros((0, 2)), np.zeros(0), np.zeros((2, 0))), None))
    with pytest.raises(ModelFormatError, match=r"blocks\[4\].ff: an FF layer needs at least"):
        save_model(m, tmp_path / "w0.npz")  # no FF without units is written (or read back)
    assert not (tmp_path / "w0.npz").exists()
    with np.load(tmp_path / "m.npz") as z:
        assert set(z.files) == set(NPZ_KEYS)
        assert z["ff_width"].tolist() == [3, -1, 3, -1]
        assert z["has_sa"].tolist() == [True, True, False, False]
        assert z["ff_U"].shape == (6, 2) and z["ff_W"].shape == (2, 6)
        header = json.loads(str(z["header"]))
    assert header["number"] == "float64" and header["tau"] == "0.375" and "blocks" not in header


def test_npz_refuses_rational_models(tmp_path):
    with pytest.raises(ValueError, match="float64 models only"):
        save_model(hand_model(), tmp_path / "m.npz")
    assert list(tmp_path.iterdir()) == []


def npz_doc(tmp_path, **changes):
    save_model(hand_model(exact=False), tmp_path / "good.npz")
    with np.load(tmp_path / "good.npz") as z:
        arrays = {k: z[k] for k in z.files}
    arrays.update(changes)
    arrays = {k: v for k, v in arrays.items() if v is not None}
    np.savez(tmp_path / "bad.npz", **arrays)
    return tmp_path / "bad.npz"


@pytest.mark.parametrize("changes, words", [
    (dict(ff_b=None), ["missing arrays", "ff_b"]),
    (dict(ff_U=np.zeros((5, 2))), ['"ff_U"', "(6, 2)"]),
    (dict(sa_p=np.zeros((2, 2), dtype=np.float32)), ['"sa_p"', "float64"]),
    (dict(ff_eta=np.array([1.0, np.nan])), ['"ff_eta"', "not finite"]),
    (dict(ff_width=np.array([3.0, -1, 3, -1])), ['"ff_width"', "integers"]),
    (dict(has_sa=np.array([True])), ['"has_sa"', "4 booleans"]),
    (dict(header=np.array('{"format": "exactformer.model/1", "d": 2, "attention": '
                          '"hardmax", "number": "rational"}')), ["float64"]),
    (dict(header=np.array("{")), ["header", "not valid JSON"]),
    (dict(header=np.array(json.dumps({
        "format": FORMAT, "d": 2, "attention": "hardmax", "number": "float64",
        "meta": {"construction": "hardmax", "seed": 0, "N": 1, "sum_m": 1, "R": "x",
                 "phases": {}}}))), ["meta.R", "'x'"]),
])
def test_malformed_npz_models(tmp_path, changes, words):
    with pytest.raises(ModelFormatError) as info:
        load_model(npz_doc(tmp_path, **changes))
    for w in words:
        assert w in str(info.value)


@pytest.mark.parametrize("content, words", [
    (b"", ["not a readable .npz"]), (b"PK\x03\x04 truncated", ["not a readable .npz"]),
])
def test_unreadable_npz_models(tmp_path, content, words):
    (tmp_path / "m.npz").write_bytes(content)
    with pytest.raises(ModelFormatError, match=words[0]):
        load_model(tmp_path / "m.npz")


def test_plain_npy_is_not_a_model(tmp_path):
    with open(tmp_path / "m.npz", "wb") as f:
        np.save(f, np.zeros(3))
    with pytest.raises(ModelFormatError, match="single .npy array"):
        load_model(tmp_path / "m.npz")


def test_model_benchmark_quick(tmp_path):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_modelio.py"
    spec = importlib.util.spec_from_file_location("bench_modelio", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "modelio.md"
    assert bench.main(["--quick", "--out", str(out)]) == 0
    rows = [line for line in out.read_text().splitlines() if line.startswith("| JSON")
            or line.startswith("| .npz")]
    assert len(rows) == 3 and all(r.rstrip(" |").endswith("yes") for r in rows)


@pytest.mark.parametrize("suffix", [".json", ".npz"])
def test_causal_fields_survive(tmp_path, suffix):
    m = hand_model(exact=False)
    m.causal = True
    m.positions = np.array([[0.5, -0.0], [1 / 3, 2.0], [3.0, 1e-300]])
    save_model(m, tmp_path / f"m{suffix}")
    back = load_model(tmp_path / f"m{suffix}")
    assert back.causal and back.positions.shape == (3, 2)
    assert (back.positions.view(np.int64) == m.positions.view(np.int64)).all()
    assert_identical(m, back)
