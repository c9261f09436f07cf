"""Image inpainting on scikit-learn's bundled 8×8 digits, compiled into exact transformers.

Each image is a sequence of 64 pixel tokens x = (row, col, intensity) in R^3 (a positional code
plus the 0–16 intensity: tokens within an image are distinct). A few pixels per image are
masked: the input is the visible pixels, the target the set of the masked pixels' tokens
(position and true intensity), so m_j < n_j. Tokens are shared heavily between images (every
background pixel), which the separation phase has to undo.

Two images with the same visible pixels would be merged (same masked pixels too) or
contradictory (different masked pixels); such images are dropped and counted.

Builds, verifies and reports L, P and times for:
* hardmax, float64 parameters, all images (checked in float64: max Hausdorff error ≤ tolerance
  × coordinate scale);
* hardmax, rational parameters, the first ``exact_images`` images (default: all), proved with
  == on Fractions;
* softmax, rational parameters, the same images, verified at 50 digits.

Run: .venv/bin/python examples/digits_inpainting.py [--images 500] [--exact-images N]
(about 5 minutes for 500 images on 2 cores, most of it the softmax temperature search).
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
from sklearn.datasets import load_digits

import exactformer as ef


def inpainting_data(n_images: int, masked: int = 3, seed: int = 0) -> tuple[ef.Dataset, dict]:
    """The first ``n_images`` digits as (visible pixels → masked pixels) pairs."""
    images = load_digits().images.astype(int)
    if n_images > len(images):
        raise ValueError(f"the digits data have {len(images)} images, not {n_images}")
    rng = np.random.default_rng(seed)
    xs, ys = [], []
    for img in images[:n_images]:
        tokens = [[r, c, int(img[r, c])] for r in range(8) for c in range(8)]
        hidden = set(rng.choice(64, masked, replace=False).tolist())
        xs.append([t for i, t in enumerate(tokens) if i not in hidden])
        ys.append([tokens[i] for i in sorted(hidden)])
    xs, ys, dropped = unique_pairs(xs, ys)
    return ef.Dataset.from_arrays(xs, ys), dropped


def unique_pairs(xs: list, ys: list) -> tuple[list, list, dict]:
    """Keep the first pair for each visible set; count later ones with the same target
    (duplicates) and with another target (contradictory: no function can fit both)."""
    seen: dict[frozenset, frozenset] = {}
    keep = []
    dropped = {"duplicate": 0, "contradictory": 0}
    for j, (x, y) in enumerate(zip(xs, ys, strict=True)):
        key, target = frozenset(map(tuple, x)), frozenset(map(tuple, y))
        if key in seen:
            dropped["duplicate" if seen[key] == target else "contradictory"] += 1
            continue
        seen[key] = target
        keep.append(j)
    return [xs[j] for j in keep], [ys[j] for j in keep], dropped


def build_and_verify(data: ef.Dataset, attention: str, exact: bool, tolerance: float) -> dict:
    """One model: sizes, verdict, how it was checked, and the times."""
    t0 = time.perf_counter()
    model = ef.compile(data, attention=attention, exact=exact)
    t1 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = ef.verify(model, data, tolerance=tolerance)
    t2 = time.perf_counter()
    if report.arithmetic == "exact":
        check = "exact (Fraction, ==)"
    elif report.arithmetic.startswith("mp"):
        check = f"mpmath at {report.arithmetic[2:]} digits"
    else:
        check = f"float64, Hausdorff ≤ {tolerance:g}·scale"
    return {"attention": attention, "parameters": "rational" if exact else "float64",
            "N": data.N, "tokens": data.total_n, "sum_m": data.total_m, "R": model.meta["R"],
            "L": model.n_blocks, "P": model.n_params(), "check": check, "ok": report.ok,
            "error": report.max_hausdorff_float64, "build_s": t1 - t0, "verify_s": t2 - t1}


def main(n_images: int = 500, exact_images: int | None = None, masked: int = 3,
         tolerance: float = 1e-9, seed: int = 0) -> list[dict]:
    data, dropped = inpainting_data(n_images, masked, seed)
    k = data.N if exact_images is None else exact_images
    subset = ef.Dataset.from_arrays(data.inputs[:k], data.targets[:k])
    print(f"digits: {data.N} images as sequences of {64 - masked} pixel tokens in R^3, "
          f"{masked} masked pixels each; dropped {dropped['duplicate']} duplicate and "
          f"{dropped['contradictory']} contradictory images")
    runs = [(data, "hardmax", False), (subset, "hardmax", True), (subset, "softmax", True)]
    rows = []
    for d, attention, exact in runs:
        rows.append(build_and_verify(d, attention, exact, tolerance))
        r = rows[-1]
        print(f"{r['attention']:8} {r['parameters']:8} N {r['N']:4}  tokens {r['tokens']:6}  "
              f"Σm {r['sum_m']:5}  R {r['R']:3}  L {r['L']:5}  P {r['P']:7}  "
              f"{'OK' if r['ok'] else 'FAILED'} ({r['check']}; float64 error {r['error']:.1e})  "
              f"build {r['build_s']:.1f} s, verify {r['verify_s']:.1f} s", flush=True)
    return rows


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=500)
    p.add_argument("--exact-images", type=int, default=None,
                   help="images for the rational models (default: all)")
    p.add_argument("--masked", type=int, default=3)
    p.add_argument("--tolerance", type=float, default=1e-9,
                   help="relative Hausdorff tolerance of the float64 check")
    a = p.parse_args()
    rows = main(a.images, a.exact_images, a.masked, a.tolerance)
    raise SystemExit(0 if all(r["ok"] for r in rows) else 1)
