"""Depth against width: blocks L, parameters P, times and float32 error for k = width/4.

For each dataset and k in 1, 2, 4, 8, 16, 32 the hardmax model is built at width 4k with one
head and with k heads (at most d − 1 are used), verified exactly, and compared with the width-4
build: L against the target R + ⌈(L₄ − R)/k⌉ + 3, the separation rounds R_k against R, P
against P₄. The float32 error is the max Hausdorff error over the coordinate scale of the
native torch layout run in float32 (`exactformer.export.float32_verdict`). Writes
benchmarks/results/heads.md and heads.png.

    python benchmarks/bench_heads.py            # digits (sklearn) and a vocabulary dataset
    python benchmarks/bench_heads.py --quick    # small data, k ≤ 4 (seconds)
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
import time
from pathlib import Path

import numpy as np

import exactformer as ef
from exactformer.data import builtin

RESULTS = Path(__file__).parent / "results"
COLUMNS = ["data", "k", "heads", "heads used", "R", "L", "target", "P", "P / P₄", "build s",
           "verify s", "verdict", "float32 error"]


def digits_like(n_images: int, seed: int = 0) -> ef.Dataset:
    """The inpainting pairs of examples/digits_inpainting.py (sklearn's digits), or, without
    scikit-learn, image-like random 8×8 images of the same shape."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "examples"))
    try:
        from digits_inpainting import inpainting_data
        return inpainting_data(n_images, seed=seed)[0]
    except ImportError:
        rng = np.random.default_rng(seed)
        xs, ys = [], []
        for _ in range(n_images):
            img = rng.integers(0, 3, size=(8, 8)) * rng.integers(0, 2, size=(8, 8)) * 8
            tokens = [[r, c, int(img[r, c])] for r in range(8) for c in range(8)]
            hidden = set(rng.choice(64, 3, replace=False).tolist())
            xs.append([t for i, t in enumerate(tokens) if i not in hidden])
            ys.append([tokens[i] for i in sorted(hidden)])
        return ef.Dataset.from_arrays(xs, ys)


def float32_error(model: ef.Transformer, data: ef.Dataset) -> float | None:
    """Relative max Hausdorff error of the native layout in float32 (None: no torch)."""
    try:
        from exactformer.export import float32_verdict
    except ImportError:
        return None
    return float32_verdict(model, data).error


def run(label: str, data: ef.Dataset, k: int, heads: int, base: dict) -> dict:
    t0 = time.perf_counter()
    model = ef.compile(data, width=4 * k, heads=heads)
    t1 = time.perf_counter()
    report = ef.verify(model, data)
    t2 = time.perf_counter()
    L4, R = base["L"], base["R"]
    err = float32_error(model, data)
    return {"data": label, "k": k, "heads": heads, "heads used": model.max_heads(),
            "R": model.meta["R"],
            "L": model.n_blocks, "target": R + -(-(L4 - R) // k) + 3, "P": model.n_params(),
            "P / P₄": f"{model.n_params() / base['P']:.3f}", "build s": f"{t1 - t0:.2f}",
            "verify s": f"{t2 - t1:.2f}", "verdict": "EXACT" if report.ok else "FAILED",
            "float32 error": "n/a" if err is None else f"{err:.2e}"}


def table(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(str(r[c]) for c in COLUMNS) + " |" for r in rows]
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    for label in dict.fromkeys(r["data"] for r in rows):
        for many, style in ((False, "o-"), (True, "s--")):
            mine = [r for r in rows if r["data"] == label and r["heads"] == (r["k"] if many else 1)]
            ax.plot([r["k"] for r in mine], [r["L"] for r in mine], style,
                    label=f"{label}, {'k heads' if many else '1 head'}")
    ax.set(xscale="log", yscale="log", xlabel="k = width / 4", ylabel="blocks L",
           title="Depth against width (hardmax, exact)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--images", type=int, default=200)
    p.add_argument("--out", type=Path, default=RESULTS / "heads.md")
    args = p.parse_args(argv)
    ks = [1, 2, 4] if args.quick else [1, 2, 4, 8, 16, 32]
    sets = [("vocabulary", builtin.vocabulary(40 if args.quick else 200, 12, 5, 2, 4, seed=1)),
            ("digits", digits_like(10 if args.quick else args.images))]
    rows = []
    for label, data in sets:
        narrow = ef.compile(data)
        base = {"L": narrow.n_blocks, "R": narrow.meta["R"], "P": narrow.n_params()}
        for k in ks:
            for heads in dict.fromkeys([1, k]):
                rows.append(run(label, data, k, heads, base))
                print(table(rows[-1:]).splitlines()[-1], flush=True)
    text = (f"# Depth against width\n\n{datetime.date.today()}, {platform.machine()}, "
            f"Python {platform.python_version()}; `python benchmarks/bench_heads.py"
            f"{' --quick' if args.quick else ''}`\n\n{table(rows)}\n")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    plot(rows, args.out.with_suffix(".png"))
    return 0 if all(r["verdict"] == "EXACT" and r["L"] <= r["target"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
