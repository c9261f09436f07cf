"""Inputs that once crashed or hung the CLI (issue 23) exit with status 2 and one line naming
the file and the field, and leave nothing behind."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import exactformer as ef
from exactformer.cli import main
from exactformer.data import builtin
from exactformer.numbers import NumberError, parse_exact


def refused(capsys, argv, *names) -> str:
    """Run the CLI, assert exit 2 and one stderr line containing every one of ``names``."""
    assert main([str(a) for a in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    for n in names:
        assert str(n) in err, err
    return err


def model_doc(blocks, number="rational", causal=False, attention="softmax") -> dict:
    doc = {"format": "exactformer.model/2", "d": 2, "attention": attention, "number": number,
           "blocks": blocks, "meta": {}}
    if attention == "softmax":
        doc["tau"] = "1"
    if causal:
        doc["causal"] = True
    return doc


def write(path, doc):
    path.write_text(json.dumps(doc, ensure_ascii=False))
    return path


@pytest.mark.parametrize("number", ["rational", "float64"])
@pytest.mark.parametrize("eta", ["0", "1"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("attention", ["hardmax", "softmax"])
def test_ff_of_width_zero_is_refused(tmp_path, capsys, number, eta, causal, attention):
    empty = {"ff": {"eta": eta, "U": [], "b": [], "W": [[], []]}, "sa": None}
    model = write(tmp_path / "m.json", model_doc([empty], number, causal, attention))
    data = write(tmp_path / "d.json", {"inputs": [[[1, 2]]], "targets": [[[1, 2]]],
                                       **({"causal": True} if causal else {})})
    refused(capsys, ["verify", model, data], "m.json", "ff.U", "at least one unit")


def test_in_memory_ff_of_width_zero_is_a_clear_error():
    from exactformer.model import FF, Block, Transformer
    z = np.zeros((0, 2))
    model = Transformer(d=2, attention="hardmax", blocks=[Block(FF(1.0, z, z[:, 0], z.T), None)],
                        exact=False)
    with pytest.raises(ValueError, match="block 0: an FF layer needs at least one unit"):
        ef.verify(model, ef.Dataset.from_arrays([[[1, 2]]], [[[1, 2]]]))


@pytest.mark.parametrize("widths", [[2 ** 63, 2 ** 63], [0, 0]])
def test_npz_widths_that_wrap_or_are_zero_are_refused(tmp_path, capsys, widths):
    model = ef.compile(builtin.demo(), exact=False, seed=0)
    ef.save_model(model, tmp_path / "good.npz")
    z = dict(np.load(tmp_path / "good.npz"))
    w = z["ff_width"].astype(np.uint64)
    w[: len(widths)] = widths
    w[len(widths):] = np.where(z["ff_width"][len(widths):] < 0, 1, z["ff_width"][len(widths):])
    z["ff_width"] = w
    np.savez(tmp_path / "bad.npz", **z)
    data = write(tmp_path / "d.json", builtin.demo().to_json_dict())
    err = refused(capsys, ["verify", tmp_path / "bad.npz", data], "bad.npz")
    assert '"ff_width"' in err or '"ff_U" must be a float64 array of shape (1844' in err


@pytest.fixture
def causal_model(tmp_path):
    data = ef.CausalDataset.from_arrays([[[1, 0], [0, 1]]], [[[0, 1], [1, 0]]])
    path = tmp_path / "c.json"
    ef.save_model(ef.compile(data), path)
    return path


@pytest.mark.parametrize("prompt", ['[[true, 2]]', '[[null, 2]]', '[[[1], 2]]', '["a", ["x"]]',
                                    '[[1, "2"]]', '[[]]'])
def test_generate_prompts_of_the_wrong_types_are_refused(capsys, causal_model, prompt):
    refused(capsys, ["generate", causal_model, "--prompt", prompt], "prompt")


@pytest.mark.parametrize("vocabulary", [[[1, 0], [0, 1, 2]], [[True, 0], [0, 1]],
                                        {"a": [1, 0], "b": [None, 1]}, [[1, 0], "x"]])
def test_ragged_or_boolean_vocabularies_are_refused(tmp_path, capsys, causal_model, vocabulary):
    vocab = write(tmp_path / "v.json", vocabulary)
    refused(capsys, ["generate", causal_model, "--prompt", "ab", "--vocabulary", vocab], "v.json")


def test_train_from_a_model_without_parameters_is_refused(tmp_path, capsys):
    pytest.importorskip("torch")
    identity = {"ff": None, "sa": {"rho": "1", "A": {"alpha": "0", "a": ["0", "0"],
                                                     "c": ["0", "0"]},
                                   "V": {"beta": "0", "p": ["0", "0"], "q": ["0", "0"]}}}
    start = write(tmp_path / "id.json", model_doc([identity], attention="hardmax"))
    data = write(tmp_path / "d.json", {"inputs": [[[1, 2]]], "targets": [[[1, 2]]]})
    out = tmp_path / "t.pt"
    refused(capsys, ["train", data, "--from", start, "-o", out, "--epochs", "1"], "id.json",
            "no parameters")
    assert not out.exists()


@pytest.mark.parametrize("doc, field", [
    ({"causal": True, "inputs": [[[1, 2]]], "targets": 1.5}, '"targets"'),
    ({"causal": True, "inputs": [7], "targets": [[None]]}, "input sequence 0"),
    ({"causal": True, "inputs": [[[1, 2]]], "targets": [1.5]}, "target list 0"),
    ({"causal": True, "inputs": 3, "targets": [[None]]}, '"inputs"')])
@pytest.mark.parametrize("command", ["build", "verify", "plot"])
def test_causal_files_with_numbers_for_lists_are_refused(tmp_path, capsys, doc, field, command,
                                                         causal_model):
    data = write(tmp_path / "bad.json", doc)
    out = tmp_path / ("out.png" if command == "plot" else "out.json")
    argv = {"build": ["build", data, "-o", out], "verify": ["verify", causal_model, data],
            "plot": ["plot", data, "-o", out]}[command]
    refused(capsys, argv, "bad.json", field)
    assert not out.exists()


FULL_WIDTH = "1e" + "".join(chr(0xFF10 + int(c)) for c in "100000000")  # "1e１００００００００"


def test_non_ascii_digits_are_refused_in_data_and_model_files(tmp_path, capsys):
    data = write(tmp_path / "d.json", {"inputs": [[[FULL_WIDTH, "1"]]], "targets": [[["1", "1"]]]})
    out = tmp_path / "m.json"
    refused(capsys, ["build", data, "-o", out], "d.json", "non-ASCII")
    assert not out.exists()
    good = tmp_path / "good.json"
    ef.save_model(ef.compile(builtin.demo(), attention="softmax", seed=0), good)
    doc = json.loads(good.read_text())
    doc["tau"] = FULL_WIDTH
    model = write(tmp_path / "bad.json", doc)
    refused(capsys, ["info", model], "bad.json", "tau", "non-ASCII")


@settings(max_examples=50, deadline=None)
@given(st.text(alphabet=st.characters(min_codepoint=0x80, max_codepoint=0x2FFFF), min_size=1,
               max_size=3), st.text(alphabet="0123456789e-./", max_size=6))
def test_no_non_ascii_character_reaches_the_number_parser(odd, ascii_part):
    with pytest.raises(NumberError, match="non-ASCII"):
        parse_exact(ascii_part + odd)


# ------------------------------------------------------------------------------ one rule each
@pytest.mark.parametrize("digits", ["١٢", "１", "1" + chr(0x0663)])
def test_float64_files_refuse_non_ascii_digits_like_rational_files(tmp_path, capsys, digits):
    """Python's float (and NumPy) read any Unicode digit; every number string is ASCII."""
    data = write(tmp_path / "d.json", {"number": "float64", "inputs": [[[digits, "1"]]],
                                       "targets": [[["1", "1"]]]})
    refused(capsys, ["build", data, "-o", tmp_path / "m.json"], "d.json", "non-ASCII")
    ff = {"eta": "1", "U": [[digits, "0"]], "b": ["0"], "W": [["0"], ["0"]]}
    model = write(tmp_path / "m.json", model_doc([{"ff": ff, "sa": None}], "float64", False,
                                                 "hardmax"))
    refused(capsys, ["info", model], "m.json", "blocks[0].ff.U", "non-ASCII")
    assert {p.name for p in tmp_path.iterdir()} == {"d.json", "m.json"}


@pytest.mark.parametrize("tau", ["1e-4300", "1e-400", "1e400", "1/10**400"])
@pytest.mark.parametrize("command", ["info", "verify"])
def test_a_temperature_outside_float64_is_refused_naming_the_file(tmp_path, capsys, tau,
                                                                   command):
    good = tmp_path / "good.json"
    ef.save_model(ef.compile(builtin.demo(), attention="softmax", seed=0), good)
    doc = json.loads(good.read_text())
    doc["tau"] = tau
    model = write(tmp_path / "bad.json", doc)
    data = write(tmp_path / "d.json", builtin.demo().to_json_dict())
    argv = ["info", model] if command == "info" else ["verify", model, data]
    if tau == "1/10**400":  # not a number string at all
        refused(capsys, argv, "bad.json", "tau")
    else:
        refused(capsys, argv, "bad.json", "\"tau\"", "normal float64 range")


@pytest.mark.parametrize("field, value", [
    ("cap_margin", "nan"), ("cap_margin", "１"), ("scale", "1e99999"), ("scale", "-2"),
    ("scale", "0"), ("heights", 10 ** 40), ("coordinates", 10 ** 6), ("tag_layers", 10 ** 9),
])
def test_keyed_meta_values_are_checked(tmp_path, capsys, field, value):
    good = tmp_path / "good.json"
    ef.save_model(ef.compile(builtin.demo(), keys=True), good)
    doc = json.loads(good.read_text())
    doc["meta"]["keyed"][field] = value
    refused(capsys, ["info", write(tmp_path / "bad.json", doc)], "bad.json",
            f"meta.keyed.{field}")


def test_keyed_causal_meta_values_are_checked(tmp_path, capsys):
    data = ef.CausalDataset.from_arrays([[[1, 0], [0, 1]], [[0, 1]]],
                                        [[[2, 2], None], [[1, 1]]])  # no position keys
    good = tmp_path / "good.json"
    ef.save_model(ef.compile(data, keys=True), good)
    for where, value in ((("keyed", "cap_margin"), "inf"), (("keyed", "heights"), 10 ** 40),
                         (("position_code", "scale"), "1e99999")):
        doc = json.loads(good.read_text())
        doc["meta"][where[0]][where[1]] = value
        refused(capsys, ["info", write(tmp_path / "bad.json", doc)], "bad.json",
                f"meta.{where[0]}.{where[1]}")


@pytest.mark.parametrize("causal", [np.array([True, False]), np.array("yes"), np.array(1),
                                    np.array([[True]])[:0]])
def test_an_npz_causal_flag_must_be_one_boolean(tmp_path, capsys, causal):
    path = tmp_path / "d.npz"
    np.savez(path, inputs=np.array([[1.0, 0], [0, 1]]), input_lengths=[2],
             targets=np.array([[2.0, 1], [0, 0]]), target_mask=[True, False], causal=causal)
    refused(capsys, ["build", path, "-o", tmp_path / "m.json"], "d.npz", "causal")
    assert not (tmp_path / "m.json").exists()


@pytest.mark.parametrize("heads, width", [(5, 4), (10 ** 20, 4), (9, 8)])
def test_keyed_heads_above_the_width_are_refused(tmp_path, capsys, heads, width):
    data = write(tmp_path / "d.json", builtin.demo().to_json_dict())
    refused(capsys, ["build", data, "-o", tmp_path / "m.json", "--keys", "--heads", heads,
                     "--width", width], f"heads = {heads}", f"width = {width}")
    with pytest.raises(ValueError, match="heads"):
        ef.compile(builtin.demo(), keys=True, heads=heads, width=width)


@pytest.mark.parametrize("attention", ["hardmax", "softmax"])
@pytest.mark.parametrize("command", ["build", "plot"])
def test_keys_on_causal_data_without_targets_build_the_empty_model(tmp_path, capsys,
                                                                   attention, command):
    """No constrained position: nothing to move, so a model of 0 blocks, as without --keys."""
    if command == "plot":
        pytest.importorskip("matplotlib")
    data = write(tmp_path / "d.json", {"causal": True, "inputs": [[[1, 0], [0, 1]], [[0, 1]]],
                                       "targets": [[None, None], [None]]})
    out = tmp_path / ("m.json" if command == "build" else "m.png")
    assert main([command, str(data), "-o", str(out), "--keys", "--attention", attention]) == 0
    assert out.exists()
    if command == "build":
        assert ef.load_model(out).n_blocks == 0
        assert main(["verify", str(out), str(data)]) == 0


@pytest.mark.parametrize("attention", ["hardmax", "softmax"])
def test_keys_on_data_near_the_float64_floor_build_and_say_float32_cannot(tmp_path, capsys,
                                                                          attention):
    """1e-300 to 3e-300 span one order of magnitude of normal float64 numbers: the keyed
    model is built and proved exact, and the build warns that float32 cannot hold it."""
    data = write(tmp_path / "d.json", {"inputs": [[["1e-300", "0"], ["0", "2e-300"]]],
                                       "targets": [[["3e-300", "1e-300"]]]})
    model = tmp_path / "m.json"
    with pytest.warns(RuntimeWarning, match="float32 copy of the model"):
        assert main(["build", str(data), "-o", str(model), "--keys", "--attention",
                     attention]) == 0
    assert "too many orders of magnitude" not in capsys.readouterr().err
    assert main(["verify", str(model), str(data)]) == 0
    assert "PROVED EXACT" in capsys.readouterr().out


def test_a_set_model_on_causal_data_says_which_is_which(tmp_path, capsys):
    pytest.importorskip("torch")
    pytest.importorskip("safetensors")
    model = tmp_path / "m.json"
    ef.save_model(ef.compile(builtin.demo()), model)
    data = write(tmp_path / "c.json", {"causal": True, "inputs": [[[1, 0], [0, 1]]],
                                       "targets": [[[2, 2], None]]})
    err = refused(capsys, ["verify", model, data], "c.json", "set-to-set", "causal")
    assert "a causal model is verified" not in err
    refused(capsys, ["export", model, "-o", tmp_path / "lens", "--layout", "transformer-lens",
                     "--data", data], "c.json", "set-to-set")
    assert not (tmp_path / "lens").exists()  # the data are checked before anything is written


def test_lens_export_of_data_wider_than_the_model_writes_nothing(tmp_path, capsys):
    pytest.importorskip("torch")
    pytest.importorskip("safetensors")
    model = tmp_path / "m.json"
    built = ef.compile(builtin.demo())
    ef.save_model(built, model)
    d = built.d + 1
    wide = write(tmp_path / "w.json", {"inputs": [[[1] + [0] * (d - 1)]],
                                       "targets": [[[1, 1] + [0] * (d - 2)]]})
    refused(capsys, ["export", model, "-o", tmp_path / "lens", "--layout", "transformer-lens",
                     "--data", wide], f"d = {d}", "d_model")
    assert not (tmp_path / "lens").exists()
