"""Verdicts that say what was checked: the data's sha256 and N recorded by compile and
compared by verify, the failing pairs named, and the messages for the wrong kind of data."""

from __future__ import annotations

import hashlib
import json
import warnings

import numpy as np
import pytest

import exactformer as ef
from exactformer.cli import main
from exactformer.record import RecordError, record_from_meta

RNG = np.random.default_rng(1)
XS = [RNG.integers(-9, 10, (3, 2)).tolist() for _ in range(20)]
YS = [x[:1] for x in XS]


def cli(capsys, *argv):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def own_sha256(data) -> str:
    """The documented recipe, written out: a JSON header, then the values (float64 bytes, or
    the "p/q" strings of exact data), then a causal mask."""
    causal = isinstance(data, ef.CausalDataset)
    header = {"causal": causal, "d": data.d, "number": "rational" if data.exact else "float64",
              "lengths": [[len(x), len(y)] for x, y in zip(data.inputs, data.targets,
                                                                     strict=True)]}
    h = hashlib.sha256(json.dumps(header, sort_keys=True, separators=(",", ":")).encode())
    arrays = list(data.inputs) + list(data.targets)
    if data.exact:
        h.update(json.dumps([[[str(v) for v in r] for r in a] for a in arrays],
                            separators=(",", ":")).encode())
    else:
        h.update(b"".join(np.asarray(a, dtype="<f8").tobytes() for a in arrays))
    if causal:
        h.update(bytes(int(b) for k in data.known for b in k))
    return h.hexdigest()


def test_the_sha256_follows_its_recipe():
    floats = ef.Dataset.from_arrays(XS, YS)
    exact = ef.Dataset.from_arrays([[["1/3", 0], [2, 1]]], [[["1/3", 0]]])
    text = ef.CausalDataset.from_text("abracadabra", d=3)
    for data in (floats, exact, text):
        assert data.sha256() == own_sha256(data)
    same_values = ef.Dataset.from_arrays([[["1", "0"]]], [[["1", "0"]]])
    assert same_values.sha256() != ef.Dataset.from_arrays([[[1.0, 0.0]]], [[[1.0, 0.0]]]).sha256()


def test_compile_records_the_datas_sha256_and_save_keeps_it(tmp_path):
    data = ef.Dataset.from_arrays(XS, YS)
    for exact, name in ((True, "m.json"), (False, "m.npz")):
        model = ef.compile(data, exact=exact)
        assert model.record.data_sha256 == data.sha256() and model.record.N == 20
        ef.save_model(model, tmp_path / name)
        assert ef.load_model(tmp_path / name).record.data_sha256 == data.sha256()


def test_verify_says_when_the_data_are_a_subset():
    data = ef.Dataset.from_arrays(XS, YS)
    model = ef.compile(data)
    same = ef.verify(model, data)
    assert same.data["same"] is True and "matches" in same.table()
    subset = ef.verify(model, ef.Dataset.from_arrays(XS[:10], YS[:10]))
    assert subset.verdict() == "PROVED EXACT"  # the exactness verdict is unchanged
    assert subset.data == {"sha256": ef.Dataset.from_arrays(XS[:10], YS[:10]).sha256(),
                           "N": 10, "built_for_sha256": data.sha256(), "built_for_N": 20,
                           "same": False, "model_sha256": same.data["model_sha256"]}
    row = dict(subset.rows())["data"]
    assert row.startswith("NOT") and "built for N = 20, given N = 10" in row
    assert subset.to_dict()["data"]["same"] is False


def test_a_model_without_a_recorded_hash_says_so():
    data = ef.Dataset.from_arrays(XS, YS)
    model = ef.compile(data)
    model.record.data_sha256 = None
    report = ef.verify(model, ef.Dataset.from_arrays(XS[:5], YS[:5]))
    assert report.data["same"] is None
    assert "no sha256" in dict(report.rows())["data"] and "N differs" in dict(report.rows())["data"]


def test_a_bad_recorded_hash_is_refused():
    model = ef.compile(ef.Dataset.from_arrays(XS[:3], YS[:3]))
    meta = {**model.meta, "data_sha256": "not a hash"}
    with pytest.raises(RecordError, match="meta.data_sha256"):
        record_from_meta(meta)


def test_the_table_names_the_failing_pairs():
    data = ef.Dataset.from_arrays(XS, YS)
    model = ef.compile(data)
    moved = [list(map(list, y)) for y in YS]
    for j in (7, 12):
        moved[j][0][0] += 0.001
    report = ef.verify(model, ef.Dataset.from_arrays(XS, moved))
    assert report.verdict() == "FAILED" and report.failing_pairs() == [7, 12]
    row = dict(report.rows())["failing pairs"]
    assert row.startswith("2/20: pair 7") and "pair 12" in row and "0.001" in row
    assert "failing pairs" not in dict(ef.verify(model, data).rows())


def test_a_set_model_given_causal_data_names_the_fix():
    model = ef.compile(ef.Dataset.from_arrays(XS, YS))
    causal = ef.CausalDataset.from_arrays([[[0, 1], [1, 0]]], [[[1, 0], None]])
    with pytest.raises(ValueError, match="set model.*causal data.*--causal"):
        ef.verify(model, causal)


def test_text_data_without_causal_name_the_flag(tmp_path, capsys):
    data = ef.CausalDataset.from_text("abracadabra", d=2)
    doc = data.to_json_dict()
    del doc["causal"]  # as if the file forgot to say it
    path = tmp_path / "d.json"
    path.write_text(json.dumps(doc))
    rc, _, err = cli(capsys, "build", path, "-o", tmp_path / "m.json")
    assert rc == 2 and "--causal" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "m.json").exists()
    assert cli(capsys, "build", path, "-o", tmp_path / "m.json", "--causal")[0] == 0


def test_next_token_pairs_read_as_set_data_warn():
    """All characters distinct and no null: valid set data, but surely meant as causal."""
    vec = {c: [i, i * i] for i, c in enumerate("abcdef")}
    doc = {"inputs": [[vec[c] for c in "abcdef"]],
           "targets": [[vec[c] for c in "bcdef"] + [vec["a"]]]}
    with pytest.warns(UserWarning, match="--causal"):
        ef.Dataset.from_doc(doc, "d.json")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ef.Dataset.from_doc({"inputs": XS, "targets": YS}, "d.json")
