"""Short versions of the benchmark scripts, so that they keep working and keep their claims."""

import importlib.util
import re
from argparse import Namespace
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_build_benchmark_quick_table(tmp_path):
    bench = load("bench_build")
    out = tmp_path / "build.md"
    assert bench.main(["--quick", "--out", str(out)]) == 0
    text = out.read_text()
    rows = [line.split("|")[1:-1] for line in text.splitlines()
            if line.startswith("| hardmax") or line.startswith("| softmax")]
    assert len(rows) == 3
    cols = [c.strip() for c in bench.COLUMNS]
    for row in rows:
        r = dict(zip(cols, (c.strip() for c in row), strict=True))
        assert r["verdict"] in ("EXACT", "OK")
        assert int(r["L"]) <= int(r["L design"]) < int(r["L paper"])
    # the fitted exponents are reported (their values are only meaningful for the full sizes)
    assert re.search(r"build k = -?[0-9]+\.[0-9]+, verify k = -?[0-9]+\.[0-9]+", text)


def test_tikhonov_experiment_short_run():
    pytest.importorskip("torch")
    exp = load("tikhonov_experiment")
    args = Namespace(seed=0, N=4, n=12, d=4, eps=[1e-1, 1e-2], epochs=60, lr=0.05,
                     lr_final=1e-3)
    rows, gen_norm, slope = exp.run(args)
    assert gen_norm > 0 and np.isfinite(slope)
    for r in rows:
        res, diag = r["result"], r["diag"]
        assert diag.bound == pytest.approx(r["eps"] * gen_norm)  # the generator has loss 0
        assert res.min_loss < res.loss[0]  # training lowers the loss
