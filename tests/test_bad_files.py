"""Bad input files and arguments: exit status 2, one line on stderr naming the problem, no
traceback, nothing left in the output directory, and never a hang."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from exactformer.cli import main

GOOD = {"inputs": [[[0, 1], [2, 3]], [[2, 3], [5, 5]]], "targets": [[[1, 1]], [[7, 7]]]}
SAME = {"inputs": [[[0, 1], [2, 3]], [[5, 5]]], "targets": [[[0, 1], [2, 3]], [[5, 5]]]}
MODEL = {"format": "exactformer.model/1", "d": 2, "attention": "hardmax", "blocks": []}
SRC = str(Path(__file__).resolve().parents[1] / "src")


def scaled(exponent: str) -> str:
    """GOOD with every coordinate written as a JSON number times 10^exponent."""
    return json.dumps({k: [[[f"{v}e{exponent}" for v in t] for t in s] for s in seqs]
                       for k, seqs in GOOD.items()}).replace('"', "").replace(
        "inputs", '"inputs"').replace("targets", '"targets"')


def npz_bytes(tmp: Path) -> bytes:
    np.savez(tmp / "x.npz", inputs=np.zeros((1, 2)), input_lengths=[1],
             targets=np.zeros((1, 2)), target_lengths=[1])
    return (tmp / "x.npz").read_bytes()


def npy_bytes(tmp: Path) -> bytes:
    np.save(tmp / "x.npy", np.zeros(3))
    return (tmp / "x.npy").read_bytes()


# name → (file name, content (str, bytes, or a function of a scratch directory), words)
DATA_FILES = {
    "int-sequences": ("d.json", '{"inputs": 5, "targets": 5}', ["inputs", "list of sequences"]),
    "null-sequences": ("d.json", '{"inputs": null, "targets": null}',
                       ["inputs", "list of sequences"]),
    "deep-nesting": ("d.json", '{"inputs": ' + "[" * 100_000 + "]" * 100_000 + "}",
                     ["nested too deeply"]),
    "1e400-number": ("d.json", '{"inputs": [[[1e400, 0]]], "targets": [[[0, 0]]]}',
                     ["input 0, token 0", "float64 range"]),
    "1/0-string": ("d.json", '{"inputs": [[["1/0", 0]]], "targets": [[[0, 0]]]}',
                   ["input 0, token 0", "zero denominator"]),
    "1e400-scale": ("d.json", scaled("400"), ["input 0, token 0", "float64 range"]),
    "1e-320-scale": ("d.json", scaled("-320"), ["input 0, token 0", "float64 range"]),
    "float64-nan": ("d.json", '{"number": "float64", "inputs": [[["nan", "0"]]], '
                              '"targets": [[["0", "0"]]]}', ["input 0, token 0", "finite"]),
    "bad-number-kind": ("d.json", '{"number": "decimal", "inputs": [], "targets": []}',
                        ['"number"', "float64"]),
    "empty-npz": ("d.npz", b"", ["d.npz", "not a readable .npz"]),
    "truncated-npz": ("d.npz", lambda tmp: npz_bytes(tmp)[:100], ["d.npz", "not a readable"]),
    "plain-npy-as-npz": ("d.npz", npy_bytes, ["d.npz", "single .npy array"]),
    "float-lengths-npz": ("d.npz", None, ["input_lengths", "integer lengths"]),
}


def write_input(tmp: Path, name: str, content) -> Path:
    path = tmp / name
    if callable(content):
        scratch = tmp.parent / f"{tmp.name}-scratch"
        scratch.mkdir(exist_ok=True)
        content = content(scratch)
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif isinstance(content, str):
        path.write_text(content)
    else:
        path.write_text(json.dumps(content))
    return path


def run(capsys, *argv) -> tuple[int, str]:
    """Exit status and stderr of one in-process CLI run (argparse errors included)."""
    try:
        rc = main([str(a) for a in argv])
    except SystemExit as e:
        rc = e.code
    return rc, capsys.readouterr().err


def assert_refused(rc: int, err: str, words: list[str]) -> None:
    assert rc == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "error" in lines[0]
    for w in words:
        assert w in lines[0], f"{w!r} not in {lines[0]!r}"


def assert_only(directory: Path, names: set[str]) -> None:
    assert {p.name for p in directory.iterdir()} == names


# ------------------------------------------------------------------------------ data files
@pytest.mark.parametrize("case", sorted(DATA_FILES))
def test_bad_data_file(tmp_path, capsys, case):
    name, content, words = DATA_FILES[case]
    if case == "float-lengths-npz":
        np.savez(tmp_path / name, inputs=np.zeros((1, 2)), input_lengths=[1.0],
                 targets=np.zeros((1, 2)), target_lengths=[1])
        data = tmp_path / name
    else:
        data = write_input(tmp_path, name, content)
    rc, err = run(capsys, "build", data, "-o", tmp_path / "m.json")
    assert_refused(rc, err, words)
    assert_only(tmp_path, {name})
    model = write_input(tmp_path, "model.json", {**MODEL, "d": 2})
    rc, err = run(capsys, "verify", model, data, "--json", tmp_path / "r.json")
    assert_refused(rc, err, words)
    assert_only(tmp_path, {name, "model.json"})


# ------------------------------------------------------------------------------ model files
RECORD = {"construction": "hardmax", "seed": 0, "N": 2, "sum_m": 2, "R": 0, "phases": {}}


def meta(**fields):
    """MODEL with a construction record in "meta", some fields changed."""
    return {**MODEL, "meta": {**RECORD, **fields}}


MODEL_FILES = {
    "d-boolean": ({**MODEL, "d": True}, ['"d"', "positive integer"]),
    "d-float": ({**MODEL, "d": 2.0}, ['"d"', "positive integer"]),
    "number-kind": ({**MODEL, "number": "decimal"}, ['"number"']),
    "meta-list": ({**MODEL, "meta": [1]}, ['"meta"', "object"]),
    "meta-R-string": (meta(R="x"), ["meta.R", "'x'"]),
    "meta-R-negative": (meta(R=-1), ["meta.R", "non-negative"]),
    "meta-seed-bool": (meta(seed=True), ["meta.seed", "True"]),
    "meta-phases-int": (meta(phases=3), ["meta.phases", "3"]),
    "meta-phases-beyond": (meta(phases={"a": [0, 5]}), ["meta.phases.a", "block 5", "0 blocks"]),
    "meta-snap-windows": (meta(construction="softmax", snap_windows=[{"window": ["x"]}]),
                          ["meta.snap_windows[0].window"]),
    "meta-tau-star": (meta(construction="softmax", tau_star="big"), ["meta.tau_star"]),
    "meta-construction": (meta(construction=5), ["meta.construction", "5"]),
    "deep-nesting": ('{"format": "exactformer.model/1", "meta": ' + "[" * 100_000,
                     ["nested too deeply"]),
    "huge-eta": ({**MODEL, "blocks": [{"ff": {"eta": "1e400", "U": [["0", "0"]], "b": ["0"],
                                              "W": [["0"], ["0"]]}, "sa": None}],
                  "number": "float64"}, ["blocks[0].ff.eta", "float64 range"]),
}


@pytest.mark.parametrize("case", sorted(MODEL_FILES))
def test_bad_model_file(tmp_path, capsys, case):
    doc, words = MODEL_FILES[case]
    model = write_input(tmp_path, "model.json", doc)
    data = write_input(tmp_path, "data.json", SAME)
    for argv in (["info", model], ["verify", model, data, "--json", tmp_path / "r.json"]):
        rc, err = run(capsys, *argv)
        assert_refused(rc, err, words)
    assert_only(tmp_path, {"model.json", "data.json"})


def test_overflow_in_float64_steps_is_still_proved(tmp_path, capsys):
    # every value is in range, but 1e300 next to 1 makes float64 steps of verify overflow: the
    # float64 pass is only a report (it may say inf), the verdict comes from the exact pass
    data = write_input(tmp_path, "d.json", {
        "inputs": [[["1e300", 0], [0, 1]], [[1, 1]], [[1, 2], [3, 4]]],
        "targets": [[[0, "1e300"]], [[1, 0]], [[1, 1]]]})
    rc, err = run(capsys, "build", data, "-o", tmp_path / "m.json")
    assert rc == 0, err
    rc = main(["verify", str(tmp_path / "m.json"), str(data), "--json", str(tmp_path / "r.json")])
    out = capsys.readouterr().out
    assert rc == 0 and "PROVED EXACT" in out
    assert json.loads((tmp_path / "r.json").read_text())["proved"] is True


@pytest.mark.parametrize("blocks", [[], [{"ff": None, "sa": None}] * 3], ids=["none", "null"])
def test_identity_model_verifies(tmp_path, capsys, blocks):
    model = write_input(tmp_path, "model.json", {**meta(), "blocks": blocks})
    data = write_input(tmp_path, "data.json", SAME)
    rc = main(["verify", str(model), str(data)])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "EXACT" in out and "2/2 pairs equal as sets" in out
    rc = main(["verify", str(model), str(write_input(tmp_path, "other.json", GOOD))])
    assert rc == 1 and "FAILED" in capsys.readouterr().out


# ------------------------------------------------------------------------------ arguments
@pytest.mark.parametrize("tau, words", [
    ("1/0", ["--tau", "zero denominator"]), ("nan", ["--tau", "'nan'"]),
    ("0", ["--tau", "positive number"]), ("-1/2", ["--tau", "positive number"]),
    ("abc", ["--tau", "'abc'"]), ("1e999999999", ["--tau", "exponent"]),
    ("1e-4300", ["--tau", "normal float64 range", "about 1e-4300"]),
    ("1e400", ["--tau", "normal float64 range", "about 1e400"]),
])
def test_bad_tau_is_refused_before_anything(tmp_path, capsys, tau, words):
    # the data file does not exist: the temperature is refused first
    rc, err = run(capsys, "build", tmp_path / "absent.json", "-o", tmp_path / "m.json",
                  "--attention", "softmax", f"--tau={tau}")
    assert_refused(rc, err, words)
    assert_only(tmp_path, set())


@pytest.mark.parametrize("argv, words", [
    (["verify", "m.json", "d.json", "--tolerance=-1"], ["--tolerance"]),
    (["verify", "m.json", "d.json", "--tolerance", "nan"], ["--tolerance"]),
    (["train", "d.json", "-o", "t.safetensors", "--epochs=-1"], ["--epochs", "integer >= 0"]),
    (["train", "d.json", "-o", "t.safetensors", "--blocks", "0"], ["--blocks", "integer >= 1"]),
    (["train", "d.json", "-o", "t.safetensors", "--h", "0"], ["--h", "integer >= 1"]),
    (["train", "d.json", "-o", "t.safetensors", "--lr", "0"], ["--lr"]),
    (["train", "d.json", "-o", "t.safetensors", "--eps=-1"], ["--eps"]),
    (["train", "d.json", "-o", "t.safetensors", "--tau", "inf"], ["--tau"]),
    (["build"], ["required"]),
])
def test_bad_arguments(tmp_path, capsys, monkeypatch, argv, words):
    monkeypatch.chdir(tmp_path)
    write_input(tmp_path, "d.json", GOOD)
    write_input(tmp_path, "m.json", MODEL)
    rc, err = run(capsys, *argv)
    assert_refused(rc, err, words)
    assert_only(tmp_path, {"d.json", "m.json"})


def test_train_from_a_model_of_another_dimension(tmp_path, capsys):
    pytest.importorskip("torch")
    data = write_input(tmp_path, "d.json", GOOD)
    model = write_input(tmp_path, "m1.json", {**MODEL, "d": 1})  # narrower than the data
    rc, err = run(capsys, "train", data, "-o", tmp_path / "t.safetensors", "--from", model,
                  "--epochs", "1")
    assert_refused(rc, err, ["--from", "d = 2", "d_model = 1"])
    assert_only(tmp_path, {"d.json", "m1.json"})


# ------------------------------------------------------------------------------ partial outputs
def test_export_to_a_directory_leaves_nothing(tmp_path, capsys):
    pytest.importorskip("torch")
    pytest.importorskip("safetensors")
    model = write_input(tmp_path, "m.json", MODEL)
    (tmp_path / "out").mkdir()
    rc, err = run(capsys, "export", model, "-o", tmp_path / "out")
    assert_refused(rc, err, ["out", "is a directory"])
    assert_only(tmp_path, {"m.json", "out"})
    assert list((tmp_path / "out").iterdir()) == []


def test_plot_with_an_unwritable_gif_leaves_no_png(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    data = write_input(tmp_path, "d.json", GOOD)
    # a path below a regular file cannot be written, whoever runs the test
    rc, err = run(capsys, "plot", data, "-o", tmp_path / "fig.png", "--gif",
                  tmp_path / "d.json" / "a.gif")
    assert_refused(rc, err, ["a.gif", "cannot write"])
    assert_only(tmp_path, {"d.json"})


def test_sigterm_during_a_write_leaves_nothing(tmp_path):
    script = ("import sys, time\nfrom exactformer.modelio import atomic_path\n"
              "with atomic_path(sys.argv[1]) as tmp:\n"
              "    tmp.write_text('partial')\n    print('writing', flush=True)\n"
              "    time.sleep(60)\n")
    env = {**os.environ, "PYTHONPATH": SRC}
    proc = subprocess.Popen([sys.executable, "-c", script, str(tmp_path / "m.json")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stdout.readline().strip() == "writing"
    assert any(p.name.endswith(".tmp.json") for p in tmp_path.iterdir())
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    assert "Traceback" not in proc.stderr.read()
    assert_only(tmp_path, set())


# ------------------------------------------------------------------------------ never a hang
@pytest.mark.parametrize("argv_of, content, words", [
    (lambda p: ["build", p, "-o", Path(p).with_name("m.json")],
     '{"inputs": [[["1e999999999", 0]]], "targets": [[[0, 0]]]}', ["exponent"]),
    (lambda p: ["build", p, "-o", Path(p).with_name("m.json")],
     '{"inputs": [[[1e999999999, 0]]], "targets": [[[0, 0]]]}', ["exponent"]),
    (lambda p: ["info", p],
     json.dumps({**MODEL, "blocks": [{"ff": None, "sa": {
         "rho": "1e999999999", "A": {"alpha": "0", "a": ["0", "0"], "c": ["0", "0"]},
         "V": {"beta": "0", "p": ["0", "0"], "q": ["0", "0"]}}}]}),
     ["blocks[0].sa.rho", "exponent"]),
    (lambda p: ["generate", Path(p).with_name("model.json"), "--prompt", "[[0, 1]]",
                "--vocabulary", p], "[[1e999999999, 0]]", ["exponent"]),
], ids=["data-string", "data-number", "model-info", "generate-vocabulary"])
def test_absurd_exponents_are_refused_quickly(tmp_path, argv_of, content, words):
    write_input(tmp_path, "model.json", MODEL)
    path = tmp_path / "in.json"
    path.write_text(content)
    assert path.stat().st_size < 300
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "exactformer.cli",
                           *map(str, argv_of(str(path)))], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": SRC}, timeout=120)
    assert time.monotonic() - t0 < 120
    assert_refused(done.returncode, done.stderr, words)
    assert_only(tmp_path, {"in.json", "model.json"})


# ------------------------------------------------------------------------------ special outputs
def _special(tmp: Path, kind: str) -> Path:
    """A FIFO, or a character device (the null device's numbers; made as root only), in tmp."""
    path = tmp / kind
    if kind == "fifo":
        os.mkfifo(path)
    else:
        if os.geteuid() != 0:
            pytest.skip("making a device node needs root")
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    return path


@pytest.mark.parametrize("kind", ["fifo", "device"])
@pytest.mark.parametrize("command", ["build", "verify --json", "export"])
def test_an_output_that_is_not_a_regular_file_is_refused_and_kept(tmp_path, capsys, kind,
                                                                  command):
    """Writing is atomic (a temporary file renamed into place), so an output path that is a
    FIFO or a device would be replaced by a regular file: refused, exit 2, the node kept."""
    data = write_input(tmp_path, "d.json", GOOD)
    model = write_input(tmp_path, "m.json", MODEL)
    out = _special(tmp_path, kind)
    before = os.stat(out)
    argv = {"build": ["build", data, "-o", out],
            "verify --json": ["verify", model, data, "--json", out],
            "export": ["export", model, "-o", out]}[command]
    if command == "export":
        pytest.importorskip("torch")
        pytest.importorskip("safetensors")
    rc, err = run(capsys, *argv)
    assert_refused(rc, err, [str(out), "not a regular file"])
    after = os.stat(out)
    assert (after.st_mode, after.st_rdev, after.st_ino) == (before.st_mode, before.st_rdev,
                                                            before.st_ino)
    assert_only(tmp_path, {"d.json", "m.json", kind})
