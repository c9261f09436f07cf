"""Heavy-sharing scaling benchmark: N sequences over one 4 000-word vocabulary in R^16.

Each sequence has n = 50 distinct words and maps to m = 3 of them; every word is shared by
about 50·N/4000 sequences, which is what the separation phase has to undo. A float64 hardmax
model is built and verified for each N, at width 4 with one head and at width 64 with 16 heads
(the wide model only up to N = 10^4); the table gives build and verify time, their ratio, the
peak resident memory of the process that did both, the separation depth R and the block count
L. Each row runs in a fresh process, so its peak memory is its own. Writes
benchmarks/results/scale.md with the date, machine and load.

    python benchmarks/bench_scale.py            # N = 10^3, 10^4
    python benchmarks/bench_scale.py --big      # and N = 10^5
    python benchmarks/bench_scale.py --quick    # N = 10^3 only
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing
import os
import platform
import resource
import sys
import time
import warnings
from pathlib import Path

import numpy as np

import exactformer as ef
from exactformer.data import builtin
from exactformer.tables import markdown_table

RESULTS = Path(__file__).parent / "results"
VOCAB, N_TOKENS, M_TARGETS, D = 4000, 50, 3, 16

COLUMNS = ["N", "width", "heads", "T", "R", "L", "build s", "verify s", "verify / build",
           "peak RSS MiB", "verdict", "error", "decided by"]
WIDE = (64, 16)  # the wide model's width and heads
WIDE_MAX_N = 10 ** 4


def run(N: int, width: int = 4, heads: int = 1) -> dict:
    """Generate, build and verify one size, in the calling process."""
    data = builtin.vocabulary(N, VOCAB, N_TOKENS, M_TARGETS, D, seed=N)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        model = ef.compile(data, exact=False, width=width, heads=heads)
        t1 = time.perf_counter()
        report = ef.verify(model, data)
        t2 = time.perf_counter()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    peak_mib = peak / 2 ** 20 if sys.platform == "darwin" else peak / 2 ** 10
    return {"N": N, "width": width, "heads": heads, "T": data.total_n,
            "R": model.meta.get("R", "n/a"), "L": model.n_blocks,
            "build s": f"{t1 - t0:.1f}", "verify s": f"{t2 - t1:.1f}",
            "verify / build": f"{(t2 - t1) / (t1 - t0):.2f}",
            "peak RSS MiB": f"{peak_mib:.0f}", "verdict": "OK" if report.ok else "FAILED",
            "error": f"{report.relative_error_float64:.1e}",
            "decided by": report.extra.get("decided by", report.arithmetic)}


def run_fresh(N: int, width: int, heads: int) -> dict:
    """:func:`run` in a new process (forked where possible), so that peak memory is per row."""
    ctx = multiprocessing.get_context("fork" if sys.platform.startswith("linux") else None)
    with ctx.Pool(1) as pool:
        return pool.apply(run, (N, width, heads))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    size = ap.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="N = 10^3 only")
    size.add_argument("--big", action="store_true", help="N up to 10^5")
    ap.add_argument("--out", default=str(RESULTS / "scale.md"))
    args = ap.parse_args(argv)
    Ns = [10 ** 3] if args.quick else [10 ** 3, 10 ** 4] + ([10 ** 5] if args.big else [])
    load0 = os.getloadavg()[0]
    rows = []
    shapes = [(N, 4, 1) for N in Ns] + [(N, *WIDE) for N in Ns if N <= WIDE_MAX_N]
    for shape in shapes:
        rows.append(run_fresh(*shape))
        print(" | ".join(f"{c} {rows[-1][c]}" for c in COLUMNS), flush=True)
    head = (f"Measured {datetime.date.today()} on {platform.machine()} "
            f"({os.cpu_count()} CPUs, Python {platform.python_version()}, numpy "
            f"{np.__version__}); load average {load0:.1f} at the start, "
            f"{os.getloadavg()[0]:.1f} at the end. Vocabulary of {VOCAB} "
            f"words in R^{D}, n = {N_TOKENS} words per sequence, m = {M_TARGETS} targets, "
            "float64 hardmax models.")
    text = "\n\n".join(["# Scaling with heavy token sharing", head,
                        markdown_table(rows, COLUMNS),
                        "T: input tokens. R: separation blocks. Peak RSS includes the Python "
                        "interpreter and NumPy (about 100 MiB). Verify judges each pair by the "
                        "exact value of the stored floats: float64 enclosures settle most pairs, "
                        "the exact pass the rest (docs/verification.md)."]) + "\n"
    print("\n" + text)
    if not args.quick or args.out != str(RESULTS / "scale.md"):
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
    return 0 if all(r["verdict"] == "OK" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
