"""Build and verification benchmark of the paper's construction (docs/hardmax.md): time, blocks
L and parameters P against N, n, m, d (the default construction: bench_default.py).

Prints a Markdown table and writes it (with the date and machine) to
benchmarks/results/build.md. Columns give the design bound R + max(1, Σm−N) [+1] + Σm and the
paper's bound (2Σm+2N+1 hardmax, 2Σm+3N softmax). A second table measures how build and verify
time grow with the total number of input tokens T (up to 5·10^5) and fits the exponent.

    python benchmarks/bench_build.py            # the full tables (about 10 minutes on 2 cores)
    python benchmarks/bench_build.py --quick    # small sizes only (seconds)
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

import exactformer as ef
from exactformer.data import builtin
from exactformer.tables import markdown_table

RESULTS = Path(__file__).parent / "results"

COLUMNS = ["attention", "params", "data", "N", "n", "m", "d", "T", "R", "L", "L design",
           "L paper", "P", "P dense", "build s", "verify s", "verdict", "error", "tau*"]


def run(attention: str, exact: bool, label: str, data: ef.Dataset, seed: int = 0) -> dict:
    t0 = time.perf_counter()
    model = ef.compile(data, attention=attention, exact=exact, seed=seed, construction="paper")
    t1 = time.perf_counter()
    report = ef.verify(model, data)
    t2 = time.perf_counter()
    n = data.input_lengths
    if report.exact_equal is not None:
        error = "exact (==)"
    elif "hausdorff_mp" in report.extra:
        error = (f"{max(report.extra['hausdorff_mp']):.1e} (mp50); "
                 f"{report.relative_error_float64:.1e} (f64)")
    else:
        error = f"{report.relative_error_float64:.1e} (f64)"
    return {"attention": attention, "params": "rational" if exact else "float64",
            "data": label, "N": data.N, "n": f"{min(n)}-{max(n)}" if min(n) != max(n) else n[0],
            "m": data.total_m // data.N if data.total_m % data.N == 0 else
            f"{data.total_m / data.N:.1f}", "d": data.d, "T": data.total_n,
            "R": model.meta["R"], "L": model.n_blocks, "L design": report.blocks_design,
            "L paper": report.blocks_paper, "P": model.n_params(),
            "P dense": model.n_params_dense(), "build s": f"{t1 - t0:.2f}",
            "verify s": f"{t2 - t1:.2f}", "verdict": "EXACT" if report.exact_equal else
            ("OK" if report.ok else "FAILED"), "error": error,
            "tau*": f"{model.meta['tau_star']:.3g}" if isinstance(model.meta.get("tau_star"),
                                                                  float)
            else model.meta.get("tau_star", "")}


def cases(quick: bool):
    """(attention, exact, label, dataset) for the main table."""
    U = builtin.uniform
    if quick:
        yield "hardmax", True, "uniform", U(20, 10, 2, 4)
        yield "hardmax", False, "uniform", U(100, 20, 3, 8)
        yield "softmax", True, "pool", builtin.shared_pool(10, 3, 8, 5, 3, seed=1)
        return
    for N in (10, 100, 1000, 10000):  # N
        yield "hardmax", False, "uniform", U(N, 20, 2, 8)
    for n in (10, 100, 1000):  # n: L and P must not move
        yield "hardmax", False, "uniform", U(100, n, 3, 8)
    for m in (1, 3, 10):  # m
        yield "hardmax", False, "uniform", U(100, 20, m, 8)
    for d in (2, 16, 64):  # d: P grows like d
        yield "hardmax", False, "uniform", U(100, 20, 3, d)
    yield "hardmax", False, "uniform (target 1)", U(1000, 50, 3, 16)
    yield "hardmax", True, "uniform (target 2)", U(100, 20, 3, 4)
    for N in (10, 100, 300):
        yield "hardmax", True, "shared vocabulary", builtin.vocabulary(N, 40, 8, 2, 4, seed=N)
    for N, n in ((10, 10), (50, 10), (100, 20)):
        yield "softmax", True, "uniform", U(N, n, 2, 4)
    yield "softmax", True, "shared vocabulary", builtin.vocabulary(50, 30, 6, 2, 3, seed=5)


def scaling(quick: bool) -> tuple[list[dict], float, float]:
    """Build/verify time against T = N·n (n = 50, m = 2, d = 8, float64) and fitted exponents."""
    Ns = (100, 200, 400) if quick else (625, 1250, 2500, 5000, 10000)
    rows = []
    for N in Ns:
        r = run("hardmax", False, "uniform", builtin.uniform(N, 50, 2, 8))
        rows.append(r)
        print(f"  scaling N={N}: build {r['build s']} s, verify {r['verify s']} s", flush=True)
    T = np.log([r["T"] for r in rows])
    slope_b = np.polyfit(T, np.log([float(r["build s"]) for r in rows]), 1)[0]
    slope_v = np.polyfit(T, np.log([float(r["verify s"]) for r in rows]), 1)[0]
    return rows, float(slope_b), float(slope_v)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes only")
    ap.add_argument("--out", default=str(RESULTS / "build.md"))
    args = ap.parse_args(argv)
    rows = []
    for attention, exact, label, data in cases(args.quick):
        rows.append(run(attention, exact, label, data))
        r = rows[-1]
        print(f"{r['attention']:8} {r['params']:8} N={r['N']:<6} n={r['n']:<5} m={r['m']:<3} "
              f"d={r['d']:<3} L={r['L']:<6} build {r['build s']:>7} s verify "
              f"{r['verify s']:>7} s {r['verdict']}", flush=True)
    srows, sb, sv = scaling(args.quick)
    head = (f"Measured {datetime.date.today()} on {platform.machine()} "
            f"({os.cpu_count()} CPUs, Python {platform.python_version()}, "
            f"numpy {np.__version__}).")
    text = "\n\n".join([
        "# Build and verification benchmark", head, markdown_table(rows, COLUMNS),
        "## Scaling with the number of input tokens T (hardmax, float64, n = 50, m = 2, d = 8)",
        markdown_table(srows, ["N", "T", "L", "build s", "verify s", "verdict", "error"]),
        f"Fitted exponents (time ∝ T^k): build k = {sb:.2f}, verify k = {sv:.2f}. "
        "L grows with N here (Σm = 2N), so these include the growth of the model."]) + "\n"
    print("\n" + text)
    if not args.quick or args.out != str(RESULTS / "build.md"):
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
