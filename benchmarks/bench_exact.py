"""Exact verification against float64 verification of the same data, serial and parallel.

For each dataset a rational and a float64 hardmax model are built; the table gives the
verification time of the float64 model, of the rational one with one worker and with every
CPU (``verify(..., workers=k)``), and their ratios. Wall-clock times depend on what else runs
on the machine, so the CPU time of the serial exact verification and the load average are
reported too. Both kinds of model are verified once on small data before anything is timed, so
one-time costs (importing torch for the float64 model's independent check) are not counted.
Writes benchmarks/results/exact.md with the date and machine.

    python benchmarks/bench_exact.py            # digits (200 images), 300 image-like
                                                # sequences of 61 tokens, a vocabulary dataset
    python benchmarks/bench_exact.py --quick    # small sizes only (seconds)
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import resource
import sys
import time
import warnings
from pathlib import Path

import gmpy2
import numpy as np

import exactformer as ef
from exactformer.data import builtin
from exactformer.evaluate.jobs import default_workers
from exactformer.tables import markdown_table

RESULTS = Path(__file__).parent / "results"
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

COLUMNS = ["data", "N", "tokens", "L", "float64 verify s", "exact verify s (1 worker)",
           "ratio (1)", "exact verify s (k workers)", "ratio (k)", "float64 CPU s",
           "exact CPU s (1 worker)", "CPU ratio (1)", "exact CPU s (k workers)", "verdict"]


def digits(n_images: int) -> tuple[str, ef.Dataset]:
    """The digits inpainting data of examples/digits_inpainting.py, or image-like random data
    of the same shape when that example cannot be imported (scikit-learn missing)."""
    sys.path.insert(0, str(EXAMPLES))
    try:
        from digits_inpainting import inpainting_data
        return f"digits ({n_images} images)", inpainting_data(n_images)[0]
    except ImportError:
        return f"image-like ({n_images}, no scikit-learn)", image_like(n_images, seed=1)
    finally:
        sys.path.remove(str(EXAMPLES))


def image_like(N: int, side: int = 8, masked: int = 3, seed: int = 0) -> ef.Dataset:
    """Random 8×8 'images' as sequences of pixel tokens (row, col, intensity 0–16): the
    visible pixels map to the set of the ``masked`` hidden ones, as in the digits example."""
    rng = np.random.default_rng(seed)
    grid = [(r, c) for r in range(side) for c in range(side)]
    xs, ys = [], []
    for _ in range(N):
        tokens = [[r, c, int(v)] for (r, c), v in zip(grid, rng.integers(0, 17, side * side),
                                                      strict=True)]
        hidden = set(rng.choice(len(grid), masked, replace=False).tolist())
        xs.append([t for i, t in enumerate(tokens) if i not in hidden])
        ys.append([tokens[i] for i in sorted(hidden)])
    return ef.Dataset.from_arrays(xs, ys)


def cases(quick: bool):
    """(label, dataset) pairs."""
    if quick:
        yield "image-like", image_like(12, seed=2)
        yield "vocabulary", builtin.vocabulary(20, 12, 5, 2, 3)
        return
    yield digits(200)
    yield "image-like (61 tokens)", image_like(300)
    yield "vocabulary (40 words, R^4)", builtin.vocabulary(300, 40, 8, 2, 4)


def timed(fn):
    """(result, wall seconds, CPU seconds of this process and of its finished children)."""
    def cpu():
        ch = resource.getrusage(resource.RUSAGE_CHILDREN)
        return time.process_time() + ch.ru_utime + ch.ru_stime

    w, c = time.perf_counter(), cpu()
    out = fn()
    return out, time.perf_counter() - w, cpu() - c


def warm_up() -> None:
    """Verify a small rational and float64 model once, untimed (imports, first-call caches)."""
    data = builtin.vocabulary(6, 6, 3, 2, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for exact in (True, False):
            ef.verify(ef.compile(data, exact=exact), data, workers=1)


def ratio(a: float, b: float) -> str:
    """a / b to three significant digits (a fast exact pass on tiny data is below 0.1)."""
    return f"{a / b:.3g}"


def run(label: str, data: ef.Dataset, workers: int) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exact = ef.compile(data, exact=True)
        floats = ef.compile(data, exact=False)
        rep_f, t_f, c_f = timed(lambda: ef.verify(floats, data))
        rep_1, t_1, c_1 = timed(lambda: ef.verify(exact, data, workers=1))
        rep_k, t_k, c_k = timed(lambda: ef.verify(exact, data, workers=workers))
    if rep_1.exact_equal != rep_k.exact_equal:
        raise AssertionError(f"{label}: serial and parallel verification disagree")
    verdict = "EXACT" if rep_1.ok and rep_k.ok else "FAILED"
    return {"data": label, "N": data.N, "tokens": data.total_n, "L": exact.n_blocks,
            "float64 verify s": f"{t_f:.2f}", "exact verify s (1 worker)": f"{t_1:.2f}",
            "ratio (1)": ratio(t_1, t_f), "exact verify s (k workers)": f"{t_k:.2f}",
            "ratio (k)": ratio(t_k, t_f), "float64 CPU s": f"{c_f:.2f}",
            "exact CPU s (1 worker)": f"{c_1:.2f}", "CPU ratio (1)": ratio(c_1, c_f),
            "exact CPU s (k workers)": f"{c_k:.2f}",
            "verdict": verdict if rep_f.ok else verdict + " (float64 FAILED)"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes only")
    ap.add_argument("--workers", type=int, default=default_workers())
    ap.add_argument("--out", default=str(RESULTS / "exact.md"))
    args = ap.parse_args(argv)
    warm_up()
    load0 = os.getloadavg()[0]
    rows = []
    for label, data in cases(args.quick):
        rows.append(run(label, data, args.workers))
        r = rows[-1]
        print(" | ".join(f"{c} {r[c]}" for c in COLUMNS), flush=True)
    load1 = os.getloadavg()[0]
    head = (f"Measured {datetime.date.today()} on {platform.machine()} "
            f"({os.cpu_count()} CPUs, k = {args.workers} workers, Python "
            f"{platform.python_version()}, numpy {np.__version__}, gmpy2 {gmpy2.version()}). "
            f"Load average {load0:.1f} before and {load1:.1f} after: other processes shared "
            "the CPUs, so wall-clock times and parallel speed-ups are only indicative; CPU times "
            "(this process and its workers) are less affected.")
    text = "\n\n".join(["# Exact against float64 verification", head,
                        markdown_table(rows, COLUMNS),
                        "Ratios are exact verification time over float64 verification time "
                        "of the float64 model built from the same data. The exact "
                        "verification also runs the float64 pass of its model (for the "
                        "margins). Both were warmed up on small data first (torch imported "
                        "for the float64 model's independent check)."]) + "\n"
    print("\n" + text)
    if not args.quick or args.out != str(RESULTS / "exact.md"):
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
    return 0 if all(r["verdict"] == "EXACT" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
