"""Which reduced-precision runtimes each family's default model is proved faithful in, and what
the proof costs against the build and the float64 verify.

Every family of bench_conditioning.py, hardmax and softmax, at width 4 and at width 64 with
heads, built by the default (keyed) construction. Per row: the verdict of
``exactformer.prove_runtime`` for float32, TF32, bfloat16 and float16 (P proved, F failed with
a witness, U undecided), the float32 proof's error bound over the scale, and build, float64
verify and float32 proof seconds (docs/numerics.md#proofs-for-reduced-precision-runtimes).
Causal text data carry their vocabulary, so their rows are judged by decoding
(docs/numerics.md#decoding-to-a-vocabulary). Writes benchmarks/results/runtime.md.

``--text`` runs instead the row of a bfloat16 text: the first 10^4 characters of
bench_book's text (the standard library's docstrings), position keys at width 1024, every
runtime judged by decoding, with the bfloat16 proof's margin and time; it writes
benchmarks/results/runtime_text.md.

    python benchmarks/bench_runtime.py             # every family
    python benchmarks/bench_runtime.py --quick     # small sizes (a few minutes)
    python benchmarks/bench_runtime.py --text      # the 10^4-character text
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
from bench_book import book_text  # noqa: E402  (a sibling script: the book's text)

RUNTIMES = ("float32", "tf32", "bfloat16", "float16")
COLUMNS = ["data", "attention", "width", "L", *RUNTIMES, "float32 bound", "build s",
           "verify s", "proof s", "proof/verify"]


def row(label: str, data, attention: str, width: int, exact: bool) -> dict:
    """One family at one attention and width, built as bench_conditioning builds it (rational
    where that takes seconds, else float64): the proofs and their costs."""
    kw = {"width": width, "heads": bc.heads_of(width)} if width > 4 else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        t0 = time.perf_counter()
        model = ef.compile(data, attention=attention, exact=exact, **kw)
        t1 = time.perf_counter()
        ef.verify(model, data)
        t2 = time.perf_counter()
    out = {"data": bc.data_label(label, exact), "attention": attention, "width": width,
           "L": model.n_blocks,
           "build s": f"{t1 - t0:.2f}", "verify s": f"{t2 - t1:.2f}"}
    for runtime in RUNTIMES:
        v = ef.prove_runtime(model, data, runtime)
        out[runtime] = v.verdict.split()[0][0]  # P, F or U
        if runtime == "float32":
            out["float32 bound"] = f"{v.bound:.2g}"
            out["proof s"] = f"{v.seconds:.2f}"
            out["proof/verify"] = f"{v.seconds / max(t2 - t1, 1e-9):.2f}"
    return out


TEXT_COLUMNS = ["data", "width", "L", *RUNTIMES, "bfloat16 margin", "bfloat16 bound",
                "build s", "verify s", "bfloat16 proof s", "proof/verify"]


def text_row(chars: int, width: int) -> dict:
    """The text's position-key model: each runtime's decoding verdict, the bfloat16 proof's
    decoding margin and distance bound (over the scale) and its cost against verify."""
    text = book_text(chars)
    data = ef.CausalDataset.from_text(text)
    t0 = time.perf_counter()
    model = ef.compile(data, width=width, exact=False)
    t1 = time.perf_counter()
    ef.verify(model, data)
    t2 = time.perf_counter()
    out = {"data": f"{chars} characters, {len(set(text))} symbols", "width": width,
           "L": model.n_blocks, "build s": f"{t1 - t0:.2f}", "verify s": f"{t2 - t1:.2f}"}
    for runtime in RUNTIMES:
        v = ef.prove_runtime(model, data, runtime)
        out[runtime] = f"{v.verdict.split()[0][0]} ({v.proved}/{v.checked})"
        if runtime == "bfloat16":
            out |= {"bfloat16 margin": f"{v.margin:.3g}", "bfloat16 bound": f"{v.bound:.2g}",
                    "bfloat16 proof s": f"{v.seconds:.2f}",
                    "proof/verify": f"{v.seconds / max(t2 - t1, 1e-9):.2f}"}
    return out


def text_main(out: str) -> int:
    """``--text``: the 10^4-character row, written to ``out``."""
    row_ = text_row(10 ** 4, 1024)
    print(row_, flush=True)
    head = [f"# Decoding proofs of a 10^4-character text ({datetime.date.today()}, "
            f"{platform.machine()})", "",
            "`python benchmarks/bench_runtime.py --text`: position keys, float64 build; "
            "P: every position proved to decode to its next character in every evaluation "
            "in that runtime (any summation order), of the positions shown; margin: the least "
            "proved distance from an output to its decoding boundary, over the data's scale; "
            "bound: the largest proved distance from the target.", "", ""]
    write_text_atomic(out, "\n".join(head) + markdown_table([row_], TEXT_COLUMNS) + "\n")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small sizes")
    p.add_argument("--text", action="store_true", help="only the 10^4-character text row")
    p.add_argument("--out", default=None, help="default: results/runtime.md (runtime_text.md "
                   "with --text)")
    args = p.parse_args(argv)
    results = Path(__file__).parent / "results"
    if args.text:
        return text_main(args.out or str(results / "runtime_text.md"))
    rows = []
    for label, data, exact in bc.datasets(args.quick):
        for attention in ("hardmax", "softmax"):
            for width in (4, 64):
                rows.append(row(label, data, attention, width, exact))
                print(rows[-1], flush=True)
    proved = sum(r["float32"] == "P" for r in rows)
    head = [f"# Runtime proofs ({datetime.date.today()}, {platform.machine()}, "
            f"{'--quick' if args.quick else 'full'})", "",
            "`python benchmarks/bench_runtime.py`: default models, proved by "
            "`exactformer.prove_runtime` (P proved faithful, F failed with a witness, "
            "U undecided) in every summation order; tolerance 1e-5 × the data's scale (causal "
            "text rows: every position decodes to its next character). "
            f"{proved} of {len(rows)} rows are proved in float32.", "", ""]
    write_text_atomic(args.out or str(results / "runtime.md"),
                      "\n".join(head) + markdown_table(rows, COLUMNS) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
