"""Short versions of the benchmark scripts, so that they keep working and keep their claims."""

import importlib.util
import re
import time
from argparse import Namespace
from pathlib import Path

import numpy as np
import pytest

import exactformer as ef
from exactformer.data import builtin

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
    for L, norm in args.constructed.values():  # the generator-free bound's ‖θ*‖²
        assert L >= 1 and np.isfinite(norm) and norm > 0


def test_conditioning_benchmark_row():
    pytest.importorskip("torch")
    from exactformer.conditioning import conditioning
    from exactformer.data import builtin
    bench = load("bench_conditioning")
    data = builtin.demo()
    row = bench.measure("demo", data, True, "hardmax", 4, False)  # keys=False: the paper's
    paper = ef.compile(data, construction="paper")
    stats = conditioning(paper)
    assert row["L"] == data.total_m + data.total_m - data.N + paper.meta["R"]
    assert float(row["max |u|·|w|"]) == pytest.approx(stats.max_slope, rel=0.05)
    assert float(row["float64"]) <= 1e-9  # a plain dense float64 pass interpolates
    keyed = bench.measure("demo", data, True, "hardmax", 4, True)
    assert keyed["attention"] == "hardmax, keyed"
    assert keyed["L"] == ef.compile(data, keys=True).n_blocks
    assert float(keyed["float32"]) <= 1e-5  # the keyed model is faithful in float32
    texts = bench.sentences(4, 12, generic=True)  # causal texts that disagree at a position
    hat = bench.measure("texts", texts, True, "hardmax", 4, False)
    causal = bench.measure("texts", texts, True, "hardmax", 4, True)
    assert causal["L"] == ef.compile(texts, keys=True).n_blocks
    assert float(causal["float32"]) <= 1e-5 < float(hat["float32"])


def test_conditioning_benchmark_runs_rows_apart_and_sums_up_the_goal():
    """A row runs in a child process: one past its time limit is reported unfinished; the
    summary counts the rows that meet the goal from the rows themselves."""
    pytest.importorskip("torch")
    from exactformer.data import builtin
    bench = load("bench_conditioning")
    data = builtin.demo()
    keyed = bench.run_row("demo", data, True, "hardmax", 4, True, 600)
    hat = keyed | {"attention": "hardmax", "float32": "2.0e-04"}  # a hat row off the goal
    late = bench.run_row("demo", data, True, "hardmax", 4, False, 1e-3)
    assert keyed["L"] == ef.compile(data, keys=True).n_blocks
    assert late["build s"].startswith("did not finish") and late["float32"] == ""
    summary = bench.goal_summary([keyed, hat, late])
    assert "keyed models: 1 of 1 finished rows meet the goal" in summary
    assert "hat models: 0 of 1 finished rows" in summary and "1 rows did not finish" in summary


def _slow_after_verify(label, data, exact, attention, width, keys, partial):
    """A row that reports its build and verify, then runs past any limit."""
    partial({"build s": "1.25", "verify s": "2.50", "verdict": "OK"})
    time.sleep(60)


def test_an_unfinished_row_keeps_the_build_and_verify_it_reported():
    """bench_default's rows hand build and verify to the parent before the dense passes: a
    row cut at its limit after that keeps them, and says that the dense passes ran out."""
    bench = load("bench_conditioning")
    data = builtin.demo()
    row = bench.run_row("demo", data, True, "hardmax", 4, True, 3, row=_slow_after_verify)
    assert (row["build s"], row["verify s"], row["verdict"]) == ("1.25", "2.50", "OK")
    assert row["float64"] == "dense passes did not finish in 3 s" and row["float32"] == ""


def markdown_rows(text: str, columns: list[str]) -> list[dict]:
    """The rows of the Markdown table with these columns, as dicts of stripped strings."""
    lines = text.splitlines()
    start = lines.index("| " + " | ".join(columns) + " |") + 2
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append(dict(zip(columns, (c.strip() for c in line.split("|")[1:-1]), strict=True)))
    return rows


def test_causal_benchmark_quick_table(tmp_path):
    bench = load("bench_causal")
    out = tmp_path / "causal.md"
    assert bench.main(["--quick", "--out", str(out)]) == 0
    text = out.read_text()
    rows = markdown_rows(text, bench.RANDOM_COLUMNS)
    assert len(rows) == 5 and {r["params"] for r in rows} == {"float64", "rational"}
    for r in rows:
        assert r["verdict"] == ("EXACT" if r["params"] == "rational" else "OK")
        R, moves, L = int(r["R_c"]), int(r["moves"]), int(r["L"])
        assert int(r["R_c + moves + 2"]) == R + moves + 2 and L <= R + moves + 2
        assert r["L ≤ bound"] == "yes" and 0 < moves <= int(r["constrained"]) < int(r["contexts"])
        # one width-4 hat (8d + 5 parameters) per moving state, plus the few separation blocks
        assert float(r["P / (d · constrained)"]) == pytest.approx(
            int(r["P"]) / (int(r["d"]) * int(r["constrained"])), abs=0.006)
        assert float(r["P / (d · constrained)"]) < 12
    assert re.search(r"P ∝ constrained\^k with k = [0-9.]+ at d = 4", text)
    recites = markdown_rows(text, bench.RECITE_COLUMNS)
    assert [(r["case"].split(",")[0], r["params"]) for r in recites] == [
        ("passage", "float64"), ("shared openings", "float64"), ("passage", "rational"),
        ("shared openings", "rational")]
    for r in recites:
        assert r["generated exactly"] == "yes" and r["L ≤ bound"] == "yes"
        assert r["verdict"] == ("EXACT" if r["params"] == "rational" else "OK")
        assert int(r["R_c"]) == (0 if r["case"].startswith("passage") else 3)


def test_causal_benchmark_counts_moves_as_the_construction_does():
    """The benchmark's moves come from the model's states, not from its record: they agree."""
    bench = load("bench_causal")
    for exact in (False, True):
        row = bench.measure(bench.random_causal(8, 12, 3, seed=5), exact)
        assert row["R_c"] > 0 and row["moves"] == row["model"].record.moves
        assert row["L"] == row["R_c"] + row["moves"]


def test_runtime_benchmark_row():
    """bench_runtime's row for the demo: proved in float32 and, its coordinates being small
    integers, in bfloat16 (docs/numerics.md#low-precision-set-models), with its times."""
    pytest.importorskip("torch")  # bench_conditioning, whose family list it reads, needs torch
    bench = load("bench_runtime")
    row = bench.row("demo", ef.data.builtin.demo(), "hardmax", 4, True)
    assert row["float32"] == "P" and row["bfloat16"] == "P"
    assert set(bench.COLUMNS) == set(row) and float(row["proof s"]) > 0
