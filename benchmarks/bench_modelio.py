"""Model file benchmark: save and load time of a float64 model of ~2.7 M parameters.

A synthetic model (random width-4 FF and structured attention in every block, d = 16, 200
parameters per block; no construction needed) is saved and loaded as JSON with a per-number
writer and reader (how modelio worked before: ``fmt`` and ``Fraction`` on every number), as
JSON with the current writer and reader, and as .npz. Every load is checked to give the same
bit patterns. Times are wall-clock seconds and, in parentheses, this process's CPU seconds
(the better measure on a shared machine). Prints a Markdown table and writes it (with the
date and machine) to benchmarks/results/modelio.md.

    python benchmarks/bench_modelio.py            # 13 500 blocks, 2.7 M parameters (~1 min)
    python benchmarks/bench_modelio.py --quick    # 200 blocks (seconds)
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path

import numpy as np

from exactformer.model import FF, SA, Block, ScoreMatrix, Transformer, ValueMatrix
from exactformer.modelio import load_model, save_model, write_text_atomic
from exactformer.numbers import fmt

RESULTS = Path(__file__).parent / "results"


def synthetic(n_blocks: int, d: int = 16, width: int = 4, seed: int = 0) -> Transformer:
    """Random float64 parameters in every layer, -0.0 included (signs must survive)."""
    rng = np.random.default_rng(seed)

    def r(*shape):
        return rng.standard_normal(shape)

    blocks = [Block(FF(float(r()), r(width, d), r(width), r(d, width)),
                    SA(float(r()), ScoreMatrix(float(r()), r(d), r(d)),
                       ValueMatrix(float(r()), r(d), r(d))))
              for _ in range(n_blocks)]
    blocks[0].ff.U[0, 0] = -0.0
    return Transformer(d=d, attention="hardmax", blocks=blocks, exact=False)


def _per_number_dict(model: Transformer) -> dict:
    """The JSON document, formatting one number at a time with ``fmt``."""
    def vec(a):
        return [fmt(v) for v in a]

    blocks = [{"ff": {"eta": fmt(b.ff.eta), "U": [vec(row) for row in b.ff.U],
                      "b": vec(b.ff.b), "W": [vec(row) for row in b.ff.W]},
               "sa": {"rho": fmt(b.sa.rho),
                      "A": {"alpha": fmt(b.sa.A.alpha), "a": vec(b.sa.A.a), "c": vec(b.sa.A.c)},
                      "V": {"beta": fmt(b.sa.V.beta), "p": vec(b.sa.V.p), "q": vec(b.sa.V.q)}}}
              for b in model.blocks]
    return {"format": "exactformer.model/1", "d": model.d, "attention": model.attention,
            "number": "float64", "blocks": blocks, "meta": model.meta}


def save_per_number(model: Transformer, path: Path) -> None:
    write_text_atomic(path, json.dumps(_per_number_dict(model), separators=(",", ":")))


def load_per_number(path: Path) -> Transformer:
    """Check every number with Fraction, then float() it, and build the arrays from lists
    (the synthetic model has no identity layers, so no null checks are needed)."""
    doc = json.loads(path.read_text())

    def num(s):
        Fraction(s)
        return float(s)

    def vec(a):
        return np.array([num(v) for v in a])

    def mat(a):
        return np.array([[num(v) for v in row] for row in a])

    blocks = []
    for blk in doc["blocks"]:
        ff, sa = blk["ff"], blk["sa"]
        A, V = sa["A"], sa["V"]
        blocks.append(Block(FF(num(ff["eta"]), mat(ff["U"]), vec(ff["b"]), mat(ff["W"])),
                            SA(num(sa["rho"]), ScoreMatrix(num(A["alpha"]), vec(A["a"]),
                                                           vec(A["c"])),
                               ValueMatrix(num(V["beta"]), vec(V["p"]), vec(V["q"])))))
    return Transformer(d=doc["d"], attention=doc["attention"], blocks=blocks, exact=False)


def same_bits(m1: Transformer, m2: Transformer) -> bool:
    p1 = np.array(m1.parameters(), dtype=float)
    p2 = np.array(m2.parameters(), dtype=float)
    return p1.shape == p2.shape and bool((p1.view(np.int64) == p2.view(np.int64)).all())


def measure(model: Transformer, how: str, save, load, suffix: str, tmp: Path) -> dict:
    path = tmp / f"model{suffix}"
    t0, c0 = time.perf_counter(), time.process_time()
    save(model, path)
    t1, c1 = time.perf_counter(), time.process_time()
    back = load(path)
    t2, c2 = time.perf_counter(), time.process_time()
    return {"format": how, "save s (CPU s)": f"{t1 - t0:.2f} ({c1 - c0:.2f})",
            "load s (CPU s)": f"{t2 - t1:.2f} ({c2 - c1:.2f})",
            "file MB": f"{path.stat().st_size / 1e6:.1f}",
            "identical bits": "yes" if same_bits(model, back) else "NO"}


def run(n_blocks: int) -> tuple[Transformer, list[dict]]:
    model = synthetic(n_blocks)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        rows = [measure(model, "JSON, per-number writer and reader", save_per_number,
                        load_per_number, ".json", tmp),
                measure(model, "JSON, current writer and reader", save_model, load_model,
                        ".json", tmp),
                measure(model, ".npz", save_model, load_model, ".npz", tmp)]
    return model, rows


def table(rows: list[dict]) -> str:
    cols = list(rows[0])
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="200 blocks instead of 13 500")
    p.add_argument("--out", default=str(RESULTS / "modelio.md"))
    args = p.parse_args(argv)
    model, rows = run(200 if args.quick else 13_500)
    text = (f"# Model file save/load\n\n{datetime.date.today()}, {platform.machine()}, "
            f"{os.cpu_count()} CPUs, Python {platform.python_version()}, numpy "
            f"{np.__version__}. Synthetic float64 model: d = {model.d}, "
            f"{model.n_blocks} blocks (FF width 4 + attention each), "
            f"{model.n_params()} parameters.\n\n{table(rows)}\n")
    print(text)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    return 0 if all(r["identical bits"] == "yes" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
