"""Float32 as a runtime: the same data compiled with hats and with keys, run in float32.

A dataset with heavily shared tokens (``vocabulary``: sequences of words drawn from a small
vocabulary in R^d) is compiled three ways: the default hat construction, a keyed hardmax
model and a keyed softmax model (docs/keyed.md). Each is verified, then exported to a plain
dense torch module (every FF as η·x + W·relu(U·x + b), ``to_torch(..., ff="dense")``) and run
in float64, float32 and bfloat16 on the data. The table shows what a user running the model
outside exactformer gets: the hat model misses its targets by about the data's scale in
float32, the keyed models stay within float32's rounding.

Run: .venv/bin/python examples/float32_runtime.py [--N 60 --vocab 40 --n 8 --m 3 --d 8]
(extras: torch)
"""

from __future__ import annotations

import argparse
import time

import torch

import exactformer as ef
from exactformer.data import builtin
from exactformer.export import max_error, to_torch
from exactformer.tables import markdown_table

DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}
KINDS = (("hats, hardmax", "hardmax", False), ("keyed, hardmax", "hardmax", True),
         ("keyed, softmax", "softmax", True))


def main(N: int = 60, vocab: int = 40, n: int = 8, m: int = 3, d: int = 8) -> list[dict]:
    """One row per construction: blocks, parameters, the verdict, and the error of a dense
    pass in each dtype over the data's coordinate scale."""
    data = builtin.vocabulary(N, vocab, n, m, d)
    rows = []
    for label, attention, keys in KINDS:
        t0 = time.perf_counter()
        model = ef.compile(data, attention=attention, keys=keys)
        built = time.perf_counter() - t0
        report = ef.verify(model, data)
        errors = {name: max_error(to_torch(model, dt, ff="dense"), data)  # over the scale
                  for name, dt in DTYPES.items()}
        rows.append({"model": label, "L": model.n_blocks, "P": model.n_params(),
                     "d_model": model.d, "verdict": report.verdict(),
                     "build s": f"{built:.2f}",
                     **{f"{k} error": f"{v:.1e}" for k, v in errors.items()},
                     "ok": report.ok, "float32": errors["float32"]})
    return rows


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in (("N", 60), ("vocab", 40), ("n", 8), ("m", 3), ("d", 8)):
        ap.add_argument(f"--{name}", type=int, default=default)
    args = ap.parse_args()
    rows = main(args.N, args.vocab, args.n, args.m, args.d)
    columns = ["model", "L", "P", "d_model", "verdict", "build s", "float64 error",
               "float32 error", "bfloat16 error"]
    print(markdown_table(rows, columns))
