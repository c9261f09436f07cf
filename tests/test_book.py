"""examples/recite.py --file and the book benchmarks (bench_book, construct_vs_train_causal) on
tiny texts, so that they keep working and keep their claims."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TEXT = ("It is a truth universally acknowledged, that a single man in possession of a good "
        "fortune, must be in want of a wife. Ünïcödé — too.\n")


def load(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def script(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=100)


def test_recite_a_file(tmp_path):
    recite = load(ROOT / "examples" / "recite.py")
    path = tmp_path / "t.txt"
    path.write_text(TEXT, encoding="utf-8")
    (row,) = recite.main(None, file=str(path), width=16)
    assert row["verified"] and row["recited"] and row["characters"] == len(TEXT)
    assert row["L"] < len(TEXT) / 3  # four hats a layer
    (row,) = recite.main(40, exact=True, file=str(path))
    assert row["verified"] and row["recited"] and row["characters"] == 40


@pytest.mark.parametrize("content, message", [
    (b"\xff\xfe not utf-8", "not UTF-8"), (b"a", "at least 2 characters")])
def test_recite_a_bad_file_is_a_clear_error(tmp_path, content, message):
    path = tmp_path / "bad.txt"
    path.write_bytes(content)
    done = script("examples/recite.py", "--file", str(path))
    assert done.returncode == 2
    assert str(path) in done.stderr and message in done.stderr
    assert script("examples/recite.py", "--file", str(tmp_path / "none.txt")).returncode == 2


def test_book_benchmark_rows(tmp_path):
    bench = load(ROOT / "benchmarks" / "bench_book.py")
    path, out = tmp_path / "t.txt", tmp_path / "book.md"
    path.write_text(TEXT * 3, encoding="utf-8")
    assert bench.main(["--rows", "200:16,300:64", "--file", str(path), "--verify-max", "200",
                       "--out", str(out)]) == 0
    lines = [line for line in out.read_text().splitlines() if line.startswith("| 200")
             or line.startswith("| 300")]
    cols = dict(zip(bench.COLUMNS, (c.strip() for c in lines[0].split("|")[1:-1]),
                    strict=True))
    assert cols["verdict"] == "OK" and cols["generated exactly"] == "yes"
    assert float(cols["peak MiB generation"]) >= float(cols["peak MiB build"]) > 0
    assert "| not run |" in lines[1] and "| yes |" in lines[1]
    with pytest.raises(ValueError, match="fewer than"):
        bench.book_text(10**6, str(path))


def test_construct_vs_train_causal_tiny(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("matplotlib")
    bench = load(ROOT / "benchmarks" / "construct_vs_train_causal.py")
    path = tmp_path / "t.txt"
    path.write_text(TEXT * 2, encoding="utf-8")
    assert bench.main(["--sizes", "150", "--file", str(path), "--budget", "0.5", "--width",
                       "16", "--context", "32", "--batch", "4", "--out", str(tmp_path)]) == 0
    text = (tmp_path / "construct_vs_train_causal.md").read_text()
    assert "| 150 | construct + verify |" in text and "1 (verified) | 150 (all)" in text
    assert text.count("| 150 | train (Adam) |") == 2
    assert (tmp_path / "construct_vs_train_causal.png").stat().st_size > 0
    (tmp_path / "construct_vs_train_causal.md").unlink()
    assert bench.main(["--merge", "--out", str(tmp_path)]) == 0  # from the .json it wrote
    assert (tmp_path / "construct_vs_train_causal.md").read_text().count("| 150 |") == 3


def test_windows_cover_every_position_once():
    bench = load(ROOT / "benchmarks" / "construct_vs_train_causal.py")
    for n, context in ((2, 8), (9, 8), (100, 8), (101, 16)):
        wins = bench.windows_for(n, context)
        scored = [i for _, first, end in wins for i in range(first, end)]
        assert scored == list(range(n - 1))
        assert all(end - start <= context and first - start >= min(context // 2, first)
                   for start, first, end in wins)
