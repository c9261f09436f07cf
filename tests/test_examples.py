"""The examples keep working: each main function runs and verifies on a small size."""

import importlib.util
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_digits_inpainting_small():
    pytest.importorskip("sklearn")
    rows = load("digits_inpainting").main(n_images=6, exact_images=2)
    assert rows and all(r["ok"] for r in rows)
    assert {(r["attention"], r["parameters"]) for r in rows} >= {("hardmax", "float64"),
                                                                 ("hardmax", "rational")}
    assert any(r["check"].startswith("exact") for r in rows)
    assert all(r["sum_m"] < r["tokens"] for r in rows)


def test_digits_repeated_images_are_dropped_and_counted():
    pytest.importorskip("sklearn")
    xs = [[[1, 2]], [[1, 2]], [[1, 2]], [[3, 4]]]
    ys = [[[5, 5]], [[5, 5]], [[6, 6]], [[5, 5]]]
    kx, ky, dropped = load("digits_inpainting").unique_pairs(xs, ys)
    assert kx == [[[1, 2]], [[3, 4]]] and ky == [[[5, 5]], [[5, 5]]]
    assert dropped == {"duplicate": 1, "contradictory": 1}


def test_text_keywords_small():
    ex = load("text_keywords")
    rows = ex.main(Ns=(6, 12), vocab=20, exact_max_N=6, synthetic=True)
    assert [r["arithmetic"] for r in rows] == ["exact", "exact-floats"]
    assert all(r["ok"] and 0 <= r["R"] <= r["N"] - 1 for r in rows)
    data = ex.sentences(ex.vocabulary_table(20, synthetic=True)[0], 5)
    assert all(y.shape[0] == 2 for y in data.targets)


def test_interpret_draws_patterns_and_interpolates(tmp_path):
    pytest.importorskip("matplotlib")
    pytest.importorskip("transformer_lens")
    out = tmp_path / "fig.png"
    result = load("interpret").main(str(out))
    assert out.stat().st_size > 0 and result["interpolates"] and result["error"] <= 1e-9
    for pattern in result["patterns"].values():  # hardmax: one key per query, weight exactly 1
        assert ((pattern == 0) | (pattern == 1)).all() and (pattern.sum(axis=1) == 1).all()


def test_float32_runtime_small():
    pytest.importorskip("torch")
    rows = load("float32_runtime").main(N=12, vocab=10, n=5, m=2, d=4)
    assert [r["model"] for r in rows] == ["hats, hardmax", "keyed, hardmax", "keyed, softmax"]
    assert all(r["ok"] for r in rows) and rows[0]["verdict"] == "PROVED EXACT"
    assert rows[1]["verdict"] == rows[2]["verdict"] == "PROVED EXACT"
    assert rows[1]["float32"] <= 1e-5 and rows[2]["float32"] <= 1e-5


def test_lens_generate_runs_a_folder_without_exactformer(tmp_path):
    import subprocess
    import sys

    pytest.importorskip("transformer_lens")
    from exactformer.cli import main

    text = "It is a truth universally acknowledged."
    (tmp_path / "t.txt").write_text(text)
    (tmp_path / "other.txt").write_text(text.replace("truth", "trout"))  # not the model's
    for argv in (["text", "t.txt", "-o", "t.json", "--vocabulary", "v.json", "--dim", "3"],
                 ["build", "t.json", "-o", "m.json"],
                 ["export", "m.json", "--layout", "transformer-lens", "-o", "tl"]):
        assert main([str(tmp_path / a) if a.endswith((".txt", ".json", "tl")) else a
                     for a in argv]) == 0
    for name, status in (("t.txt", 0), ("other.txt", 1)):
        done = subprocess.run([sys.executable, str(EXAMPLES / "lens_generate.py"),
                               str(tmp_path / "tl"), str(tmp_path / "v.json"),
                               str(tmp_path / name)], capture_output=True, text=True,
                              env={"PATH": "/usr/bin:/bin"}, timeout=300)
        assert done.returncode == status, done.stderr
        assert ("every text back exactly" in done.stdout) is (status == 0)
        assert "attention-free: tabulated" in done.stdout
