"""Running a model: ef.run / ef.predict (which numbers come back), ``exactformer run``, and
text as causal data (CausalDataset.from_text, ``exactformer text``)."""

from __future__ import annotations

import json
import subprocess
import sys
from fractions import Fraction

import numpy as np
import pytest
from conftest import datasets
from hypothesis import given, settings

import exactformer as ef
from exactformer.cli import main
from exactformer.data.text import read_vocabulary, text_embedding

EXACT = {"inputs": [[[0, 1], [2, 3], [4, 1]], [[2, 3], [5, 5]], [["1/2", "-3/7"]]],
         "targets": [[[1, 1], [0, 0]], [[7, 7]], [["1/8", 2]]]}
FLOATS = {"inputs": [[[0.5, 1.25], [2.0, 3.0], [4.0, 0.1]], [[2.0, 3.0], [5.0, 5.0]]],
          "targets": [[[0.3, 1.0], [0.0, 0.0]], [[7.0, 7.0]]]}
TEXT = "It is a truth universally acknowledged, that a single man."


def as_set(rows) -> set:
    return {tuple(Fraction(v) for v in r) for r in rows}


def targets_as_sets(data) -> list[set]:
    return [as_set(y) for y in data.targets]


def cli(capsys, *argv):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


# ------------------------------------------------------------------------------ ef.run
@settings(max_examples=15, deadline=None)
@given(datasets(rational=True))
def test_exact_data_give_fractions_equal_to_the_targets(data):
    model = ef.compile(data)
    outs = ef.run(model, data)
    assert all(o.dtype == object and all(isinstance(v, Fraction) for v in o.flat)
               for o in outs)
    assert [as_set(o) for o in outs] == targets_as_sets(data)  # in the data's d coordinates


def test_float_data_give_floats_equal_to_the_float_targets():
    """A rational model on float data: floats back, each one exactly the target float."""
    data = ef.Dataset.from_arrays(FLOATS["inputs"], FLOATS["targets"])
    model = ef.compile(data)
    outs = ef.run(model, data)
    assert all(o.dtype == np.float64 for o in outs)
    assert [{tuple(r) for r in o.tolist()} for o in outs] == \
        [{tuple(r) for r in y.tolist()} for y in data.targets]
    assert ef.predict(model, data.inputs[0]).dtype == np.float64


def test_an_explicit_arithmetic_wins():
    data = ef.Dataset.from_arrays(FLOATS["inputs"], FLOATS["targets"])
    model = ef.compile(data)
    (exact,) = ef.run(model, data.inputs[:1], arithmetic="exact")
    assert exact.dtype == object and as_set(exact) == as_set(data.targets[0])
    (floats,) = ef.run(model, [ef.Dataset.from_arrays(EXACT["inputs"], EXACT["targets"])
                               .inputs[2]], arithmetic="float")
    assert floats.dtype == np.float64


def test_float64_and_softmax_models_give_floats():
    data = ef.Dataset.from_arrays(EXACT["inputs"], EXACT["targets"])
    for model in (ef.compile(data, exact=False), ef.compile(data, attention="softmax")):
        outs = ef.run(model, data)
        assert all(o.dtype == np.float64 for o in outs)
        for o, y in zip(outs, data.targets, strict=True):  # Hausdorff distance, by hand
            want = np.array([[float(v) for v in r] for r in y])
            dist = np.linalg.norm(o[:, None, :] - want[None, :, :], axis=2)
            assert max(dist.min(axis=0).max(), dist.min(axis=1).max()) < 1e-6


def test_causal_run_gives_every_position():
    data = ef.CausalDataset.from_text(TEXT)
    model = ef.compile(data)
    (out,) = ef.run(model, data)
    assert out.shape[0] == len(TEXT) and out.dtype == np.float64
    k = data.known[0]
    np.testing.assert_array_equal(out[k][:, :data.d], data.targets[0][k])


# ------------------------------------------------------------------------------ text
def test_from_text_is_next_character_data():
    data = ef.CausalDataset.from_text(TEXT, d=4, seed=3)
    embedding = text_embedding(TEXT, 4, 3)
    assert sorted(embedding) == sorted(set(TEXT)) and data.d == 4
    vectors = {tuple(v) for v in embedding.values()}
    assert len(vectors) == len(embedding)  # distinct characters, distinct vectors
    x, y, known = data.inputs[0], data.targets[0], data.known[0]
    for i, c in enumerate(TEXT):
        np.testing.assert_array_equal(x[i], embedding[c])
        if i + 1 < len(TEXT):
            assert known[i]
            np.testing.assert_array_equal(y[i], embedding[TEXT[i + 1]])
    assert not known[-1]


def test_from_text_refuses_a_character_without_a_vector():
    with pytest.raises(ef.DatasetError, match="'z'.*no vector"):
        ef.CausalDataset.from_text("abz", {"a": [0, 1], "b": [1, 0]})


def test_text_command_then_build_generate_run(tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text(TEXT)
    data, vocab, model = tmp_path / "d.json", tmp_path / "v.json", tmp_path / "m.json"
    rc, out, _ = cli(capsys, "text", text, "-o", data, "--vocabulary", vocab, "--dim", 6)
    assert rc == 0 and "58 characters" in out
    symbols, vectors = read_vocabulary(vocab)
    assert sorted(symbols) == sorted(set(TEXT)) and vectors.shape == (len(symbols), 6)
    assert cli(capsys, "build", data, "-o", model)[0] == 0
    rc, out, _ = cli(capsys, "generate", model, "--prompt", TEXT[0], "--vocabulary", vocab,
                     "--steps", len(TEXT) - 1)
    assert rc == 0 and out.strip() == TEXT[1:]
    rc, out, _ = cli(capsys, "run", model, data, "--vocabulary", vocab)
    # every position but the last (which has no target) predicts the next character
    shown = json.loads(out.split(": ", 1)[1])
    assert rc == 0 and shown[:-1] == TEXT[1:]


def test_text_command_refuses_a_bad_file_and_writes_nothing(tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_bytes(b"\xff\xfe")
    rc, _, err = cli(capsys, "text", text, "-o", tmp_path / "d.json", "--vocabulary",
                     tmp_path / "v.json")
    assert rc == 2 and "not UTF-8" in err and len(err.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.txt"]


# ------------------------------------------------------------------------------ exactformer run
@pytest.mark.parametrize("doc, exact", [(EXACT, True), (FLOATS, False)])
def test_run_json_round_trip(tmp_path, capsys, doc, exact):
    data_path, model_path, out_path = tmp_path / "d.json", tmp_path / "m.json", tmp_path / "o.json"
    data_path.write_text(json.dumps(doc))
    assert cli(capsys, "build", data_path, "-o", model_path)[0] == 0
    rc, out, _ = cli(capsys, "run", model_path, data_path, "--json", out_path)
    assert rc == 0 and out.count("pair ") == len(doc["inputs"])
    back = json.loads(out_path.read_text())
    assert back["number"] == ("rational" if exact else "float64") and not back["causal"]
    data = ef.Dataset.from_json(data_path)
    model = ef.load_model(model_path)
    for rows, o, y in zip(back["outputs"], ef.run(model, data), data.targets, strict=True):
        if exact:
            assert all(isinstance(v, str) for r in rows for v in r)
            got = {tuple(Fraction(v) for v in r) for r in rows}
        else:
            assert all(isinstance(v, float) for r in rows for v in r)
            got = {tuple(Fraction(v) for v in r) for r in rows}
        assert got == as_set(o) == as_set(y)


def test_run_on_the_wrong_kind_of_data_names_the_fix(tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text(TEXT)
    data, vocab = tmp_path / "d.json", tmp_path / "v.json"
    assert cli(capsys, "text", text, "-o", data, "--vocabulary", vocab)[0] == 0
    sets = tmp_path / "s.json"
    sets.write_text(json.dumps(EXACT))
    assert cli(capsys, "build", sets, "-o", tmp_path / "m.json")[0] == 0
    rc, _, err = cli(capsys, "run", tmp_path / "m.json", data, "--json", tmp_path / "o.json")
    assert rc == 2 and "set model" in err and "--causal" in err
    assert not (tmp_path / "o.json").exists()


def test_a_closed_pipe_ends_run_quietly(tmp_path, capsys):
    """``exactformer run … | head``: no 'Broken pipe' error, the status of SIGPIPE."""
    text = tmp_path / "t.txt"
    text.write_text((TEXT + " ") * 40)
    data, model = tmp_path / "d.json", tmp_path / "m.json"
    assert cli(capsys, "text", text, "-o", data, "--vocabulary", tmp_path / "v.json")[0] == 0
    assert cli(capsys, "build", data, "-o", model, "--width", 64)[0] == 0
    proc = subprocess.Popen([sys.executable, "-m", "exactformer.cli", "run", str(model),
                             str(data)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.read(10)
    proc.stdout.close()  # the reader stops, as head does
    err = proc.stderr.read().decode()
    assert proc.wait(60) == 141 and err == ""
