"""The command line: build / verify / info / demo, exit statuses and no partial output files."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from exactformer import load_model
from exactformer.cli import main
from exactformer.data import DuplicatePairWarning

DATA = {"inputs": [[[0, 1], [2, 3], [4, 1]], [[2, 3], [5, 5]], [["1/2", "-3/7"]]],
        "targets": [[[1, 1], [0, 0]], [[7, 7]], [["0.125", 2]]]}
OTHER = {"inputs": DATA["inputs"], "targets": [[[1, 1], [0, 0]], [[7, 8]], [["0.125", 2]]]}

BAD = {
    "non-finite": ({"inputs": [[[0, "nan"]]], "targets": [[[0, 0]]]}, ["input 0, token 0",
                                                                      "finite"]),
    "repeated": ({"inputs": [[[0, 1], [0, 1]]], "targets": [[[0, 0]]]},
                 ["input 0", "tokens 0 and 1", "pairwise distinct"]),
    "contradictory": ({"inputs": [[[0, 1], [1, 0]], [[1, 0], [0, 1]]],
                       "targets": [[[0, 0]], [[1, 1]]]}, ["pairs 0 and 1", "contradictory"]),
    "m>n": ({"inputs": [[[0, 1]]], "targets": [[[0, 0], [1, 1]]]}, ["pair 0", "m_j <= n_j"]),
    "d<2": ({"inputs": [[[0], [1]]], "targets": [[[0]]]}, ["d = 1", "d >= 2"]),
    "ragged": ({"inputs": [[[0, 1], [1, 1, 1]]], "targets": [[[0, 0]]]},
               ["input 0, token 1", "ragged"]),
    "empty": ({"inputs": [[]], "targets": [[[0, 0]]]}, ["input 0", "empty"]),
    "not json": ('{"inputs": [', ["not valid JSON"]),
}


DUP = {"inputs": [[[0, 1], [1, 0]], [[1, 0], [0, 1]]], "targets": [[[0, 0]], [[0, 0]]]}


def write(path: Path, doc) -> Path:
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return path


@pytest.fixture
def data(tmp_path):
    return write(tmp_path / "data.json", DATA)


def run(capsys, *argv):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


# ------------------------------------------------------------------------------ build/verify
def test_build_then_verify(tmp_path, data, capsys):
    model = tmp_path / "model.json"
    rc, out, err = run(capsys, "build", data, "-o", model, "--seed", 3)
    assert rc == 0, err
    assert "built hardmax model" in out and str(model) in out
    m = load_model(model)
    assert m.attention == "hardmax" and m.exact and m.d > 2 and m.meta["seed"] == 3
    assert m.record.keyed is not None  # the default construction
    rc, out, err = run(capsys, "verify", model, data)
    assert rc == 0, err
    assert "EXACT" in out and "3/3 pairs equal as sets" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.json", "model.json"]


def test_verify_writes_a_json_report(tmp_path, data, capsys):
    model = tmp_path / "model.json"
    assert run(capsys, "build", data, "-o", model)[0] == 0
    rc, _, err = run(capsys, "verify", model, data, "--json", tmp_path / "report.json")
    assert rc == 0, err
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["ok"] is True and report["exact_equal"] == [True] * 3
    assert report["N"] == 3 and report["blocks"] <= report["blocks_paper"]


def test_verify_against_other_data_exits_1(tmp_path, data, capsys):
    model = tmp_path / "model.json"
    assert run(capsys, "build", data, "-o", model)[0] == 0
    other = write(tmp_path / "other.json", OTHER)
    rc, out, err = run(capsys, "verify", model, other)
    assert rc == 1
    assert "FAILED" in out and "2/3 pairs equal as sets" in out


def test_float_build_verifies(tmp_path, data, capsys):
    model = tmp_path / "model.json"
    rc, out, err = run(capsys, "build", data, "-o", model, "--float")
    assert rc == 0, err
    m = load_model(model)
    assert not m.exact
    rc, out, err = run(capsys, "verify", model, data)
    assert rc == 0, err
    assert "OK" in out and "max Hausdorff error" in out
    rc, out, _ = run(capsys, "verify", model, write(tmp_path / "other.json", OTHER))
    assert rc == 1 and "FAILED" in out


def test_build_from_npz(tmp_path, capsys):
    xs = [np.array([[0.0, 1.0], [2.0, 3.0]]), np.array([[2.0, 3.0]])]
    ys = [np.array([[1.0, 1.0]]), np.array([[0.5, 0.25]])]
    npz = tmp_path / "data.npz"
    np.savez(npz, inputs=np.concatenate(xs), input_lengths=[2, 1],
             targets=np.concatenate(ys), target_lengths=[1, 1])
    model = tmp_path / "model.json"
    assert run(capsys, "build", npz, "-o", model)[0] == 0
    rc, out, _ = run(capsys, "verify", model, npz)
    assert rc == 0 and "EXACT" in out


def test_build_is_deterministic(tmp_path, data, capsys):
    a, b, c = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "c.json"
    assert run(capsys, "build", data, "-o", a, "--seed", 7)[0] == 0
    assert run(capsys, "build", data, "-o", b, "--seed", 7)[0] == 0
    assert run(capsys, "build", data, "-o", c, "--seed", 8)[0] == 0
    assert a.read_bytes() == b.read_bytes()
    assert json.loads(a.read_text())["blocks"] != json.loads(c.read_text())["blocks"]


def test_info(tmp_path, data, capsys):
    model = tmp_path / "model.json"
    assert run(capsys, "build", data, "-o", model)[0] == 0
    m = load_model(model)
    rc, out, err = run(capsys, "info", model)
    assert rc == 0, err
    assert "hardmax" in out and "rational" in out
    assert any(line.startswith("blocks") and line.split()[-1] == str(m.n_blocks)
               for line in out.splitlines())
    assert any(line.startswith("R ") and line.split()[-1] == str(m.meta["R"])
               for line in out.splitlines())


def test_demo(tmp_path, capsys):
    rc, out, err = run(capsys, "demo")
    assert rc == 0, err
    assert "EXACT" in out and "12/12 pairs equal as sets" in out
    rc, out, err = run(capsys, "demo", "-o", tmp_path / "demo.json")
    assert rc == 0, err
    assert load_model(tmp_path / "demo.json").n_blocks > 0


# ------------------------------------------------------------------------------ errors
@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_data_exits_2_without_output(tmp_path, capsys, case):
    doc, parts = BAD[case]
    bad = write(tmp_path / "bad.json", doc)
    model = tmp_path / "model.json"
    rc, out, err = run(capsys, "build", bad, "-o", model)
    assert rc == 2
    assert "error" in err
    for part in parts:
        assert part in err
    assert not model.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["bad.json"]  # no temp files either


def test_bad_data_keeps_an_existing_output(tmp_path, capsys):
    model = tmp_path / "model.json"
    model.write_text("previous")
    bad = write(tmp_path / "bad.json", BAD["repeated"][0])
    assert run(capsys, "build", bad, "-o", model)[0] == 2
    assert model.read_text() == "previous"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.json", "model.json"]


def test_verify_with_bad_data_exits_2(tmp_path, data, capsys):
    model = tmp_path / "model.json"
    assert run(capsys, "build", data, "-o", model)[0] == 0
    bad = write(tmp_path / "bad.json", BAD["contradictory"][0])
    rc, out, err = run(capsys, "verify", model, bad, "--json", tmp_path / "r.json")
    assert rc == 2 and "contradictory" in err
    assert not (tmp_path / "r.json").exists()


def test_verify_with_a_broken_model_exits_2(tmp_path, data, capsys):
    model = write(tmp_path / "model.json", {"format": "something else"})
    rc, _, err = run(capsys, "verify", model, data)
    assert rc == 2 and "format" in err
    rc, _, err = run(capsys, "info", model)
    assert rc == 2 and "format" in err


def test_verify_with_wrong_dimension_exits_2(tmp_path, data, capsys):
    model = tmp_path / "model.json"  # the paper's construction: d_model = d = 2
    assert run(capsys, "build", data, "-o", model, "--construction", "paper")[0] == 0
    d3 = write(tmp_path / "d3.json", {"inputs": [[[0, 1, 2]]], "targets": [[[0, 0, 0]]]})
    rc, _, err = run(capsys, "verify", model, d3)
    assert rc == 2 and "d = 3" in err and "d_model = 2" in err


def test_missing_files_exit_2(tmp_path, data, capsys):
    rc, _, err = run(capsys, "build", tmp_path / "absent.json", "-o", tmp_path / "m.json")
    assert rc == 2 and "error" in err
    rc, _, err = run(capsys, "verify", tmp_path / "absent.json", data)
    assert rc == 2 and "error" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.json"]


def test_unknown_data_format_exits_2(tmp_path, capsys):
    txt = write(tmp_path / "data.txt", DATA)
    rc, _, err = run(capsys, "build", txt, "-o", tmp_path / "m.json")
    assert rc == 2 and "unknown dataset format" in err


def test_duplicate_pairs_warn_and_build(tmp_path, capsys):
    dup = write(tmp_path / "dup.json", DUP)
    model = tmp_path / "m.json"
    with pytest.warns(DuplicatePairWarning, match="pairs 0 and 1"):
        rc, _, err = run(capsys, "build", dup, "-o", model)
    assert rc == 0, err
    with pytest.warns(DuplicatePairWarning, match="pairs 0 and 1"):
        assert run(capsys, "verify", model, dup)[0] == 0


def test_softmax_build_then_verify(tmp_path, data, capsys):
    model = tmp_path / "model.json"
    rc, out, err = run(capsys, "build", data, "-o", model, "--attention", "softmax",
                       "--construction", "paper")
    assert rc == 0, err
    assert "built softmax model" in out
    m = load_model(model)
    assert m.attention == "softmax" and m.exact and m.tau == 1
    assert m.meta["tau_star"] == "inf"  # these data are valid at every temperature tried
    rc, out, err = run(capsys, "verify", model, data)
    assert rc == 0, err
    assert "PROVED EXACT" in out and "ball arithmetic at 64 bits" in out
    rc, out, err = run(capsys, "build", data, "-o", model, "--attention", "softmax",
                       "--tau", "1/64")
    assert rc == 0, err
    assert load_model(model).tau == Fraction(1, 64)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.json", "model.json"]


def test_float_model_as_npz(tmp_path, data, capsys):
    model = tmp_path / "model.npz"
    rc, out, err = run(capsys, "build", data, "-o", model, "--float")
    assert rc == 0, err
    rc, out, err = run(capsys, "verify", model, data)
    assert rc == 0 and "OK" in out, err
    rc, out, err = run(capsys, "info", model)
    assert rc == 0 and "float64" in out, err
    rc, out, err = run(capsys, "build", data, "-o", tmp_path / "exact.npz")
    assert rc == 2 and "float64 models only" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.json", "model.npz"]


# ------------------------------------------------------------------------------ progress
def test_no_progress_bar_when_stderr_is_captured(tmp_path, data, capsys):
    model = tmp_path / "model.json"
    rc, out, err = run(capsys, "build", data, "-o", model)
    assert rc == 0 and err == ""
    rc, out, err = run(capsys, "verify", model, data)
    assert rc == 0 and err == ""


@pytest.mark.parametrize("flag, expected", [([], False), (["--progress"], True),
                                            (["--no-progress"], False)])
def test_progress_flag_reaches_the_library(tmp_path, data, capsys, monkeypatch, flag, expected):
    import exactformer.cli as cli

    seen = {}

    def spy(name, real):
        def wrapped(*args, **kwargs):
            seen[name] = kwargs["progress"]
            return real(*args, **kwargs)
        return wrapped

    monkeypatch.setattr(cli, "compile", spy("compile", cli.compile))
    monkeypatch.setattr(cli, "verify", spy("verify", cli.verify))
    model = tmp_path / "model.json"
    assert run(capsys, "build", data, "-o", model, *flag)[0] == 0
    assert run(capsys, "verify", model, data, *flag)[0] == 0
    assert seen == {"compile": expected, "verify": expected}


def test_construction_failure_exits_2(tmp_path, capsys):
    close = write(tmp_path / "close.json", {"inputs": [[[1.0, 0.0]], [[1.0000000000000002, 0.0]]],
                                            "targets": [[[1, 1]], [[2, 2]]]})
    model = tmp_path / "m.json"
    rc, _, err = run(capsys, "build", close, "-o", model, "--float")
    assert rc == 2 and "error" in err
    assert not model.exists()


def test_usage_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as info:
        main(["build"])
    assert info.value.code == 2
    with pytest.raises(SystemExit) as info:
        main(["frobnicate"])
    assert info.value.code == 2


# ------------------------------------------------------------------------------ entry point
def entry_point() -> list[str]:
    exe = Path(sys.executable).parent / "exactformer"
    if exe.exists():
        return [str(exe)]
    found = shutil.which("exactformer")
    return [found] if found else [sys.executable, "-m", "exactformer.cli"]


def test_installed_entry_point(tmp_path):
    data = write(tmp_path / "data.json", DATA)
    bad = write(tmp_path / "bad.json", BAD["m>n"][0])
    model = tmp_path / "model.json"
    env = dict(os.environ)
    done = subprocess.run(entry_point() + ["build", str(data), "-o", str(model)],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    done = subprocess.run(entry_point() + ["verify", str(model), str(data)],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "EXACT" in done.stdout
    done = subprocess.run(entry_point() + ["build", str(bad), "-o", str(tmp_path / "x.json")],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2
    assert "m_j <= n_j" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "x.json").exists()
    # the duplicate-pair warning reaches the user on stderr, and the build goes on
    dup = write(tmp_path / "dup.json", DUP)
    done = subprocess.run(entry_point() + ["build", str(dup), "-o", str(tmp_path / "d.json")],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "pairs 0 and 1" in done.stderr and "DuplicatePairWarning" in done.stderr
    assert (tmp_path / "d.json").exists()
