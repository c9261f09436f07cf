"""Which reduced-precision runtimes each family's default model is proved faithful in, and what
the proof costs against the build and the float64 verify.

Every family of bench_conditioning.py, hardmax and softmax, at width 4 and at width 64 with
heads, built by the default (keyed) construction. Per row: the verdict of
``exactformer.prove_runtime`` for float32, TF32, bfloat16 and float16 (P proved, F failed with
a witness, U undecided), the float32 proof's error bound over the scale, and build, float64
verify and float32 proof seconds (docs/numerics.md#proofs-for-reduced-precision-runtimes).
Writes benchmarks/results/runtime.md.

    python benchmarks/bench_runtime.py             # every family
    python benchmarks/bench_runtime.py --quick     # small sizes (a few minutes)
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
import time
import warnings
from pathlib import Path

import exactformer as ef
from exactformer.modelio import write_text_atomic
from exactformer.tables import markdown_table

sys.path.insert(0, str(Path(__file__).parent))
import bench_conditioning as bc  # noqa: E402  (a sibling script: the family list)

RUNTIMES = ("float32", "tf32", "bfloat16", "float16")
COLUMNS = ["data", "attention", "width", "L", *RUNTIMES, "float32 bound", "build s",
           "verify s", "proof s", "proof/verify"]


def row(label: str, data, attention: str, width: int) -> dict:
    """One family at one attention and width: the proofs and their costs."""
    kw = {"width": width, "heads": bc.heads_of(width)} if width > 4 else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        t0 = time.perf_counter()
        model = ef.compile(data, attention=attention, **kw)
        t1 = time.perf_counter()
        ef.verify(model, data)
        t2 = time.perf_counter()
    out = {"data": label, "attention": attention, "width": width, "L": model.n_blocks,
           "build s": f"{t1 - t0:.2f}", "verify s": f"{t2 - t1:.2f}"}
    for runtime in RUNTIMES:
        v = ef.prove_runtime(model, data, runtime)
        out[runtime] = v.verdict.split()[0][0]  # P, F or U
        if runtime == "float32":
            out["float32 bound"] = f"{v.bound:.2g}"
            out["proof s"] = f"{v.seconds:.2f}"
            out["proof/verify"] = f"{v.seconds / max(t2 - t1, 1e-9):.2f}"
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small sizes")
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "runtime.md"))
    args = p.parse_args(argv)
    rows = []
    for label, data, _exact in bc.datasets(args.quick):
        for attention in ("hardmax", "softmax"):
            for width in (4, 64):
                rows.append(row(label, data, attention, width))
                print(rows[-1], flush=True)
    proved = sum(r["float32"] == "P" for r in rows)
    head = [f"# Runtime proofs ({datetime.date.today()}, {platform.machine()}, "
            f"{'--quick' if args.quick else 'full'})", "",
            "`python benchmarks/bench_runtime.py`: default models, proved by "
            "`exactformer.prove_runtime` (P proved faithful, F failed with a witness, "
            "U undecided) in every summation order; tolerance 1e-5 × the data's scale. "
            f"{proved} of {len(rows)} rows are proved in float32.", "", ""]
    write_text_atomic(args.out, "\n".join(head) + markdown_table(rows, COLUMNS) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
