"""Transformer against ResNet as the sequence length n grows (docs/baselines.md).

For N pairs of n uniform tokens in [0,1]^d with m target tokens each (N and Σm fixed), build
and verify both interpolants for every n:

* the hardmax transformer (exactformer.compile): rational parameters and exact verification up
  to --exact-max-n, float64 parameters and a
  float64 Hausdorff check (tolerance --tolerance × coordinate scale) above it;
* the residual MLP on the flattened input (exactformer.tools.resnet): always rational and verified
  with ``==``, plus its float64 error.

Writes a Markdown table and a PNG figure under benchmarks/results/ and prints the table.
Run: .venv/bin/python benchmarks/resnet_vs_transformer.py [--ns 10,100,1000]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import time
from pathlib import Path

import exactformer as ef
from exactformer.data import builtin
from exactformer.tools.resnet import build_resnet, resnet_param_count, verify_resnet

RESULTS = Path(__file__).parent / "results"


def transformer_row(data, exact: bool, tolerance: float) -> dict:
    t0 = time.perf_counter()
    model = ef.compile(data, attention="hardmax", exact=exact)
    t1 = time.perf_counter()
    rep = ef.verify(model, data, tolerance=tolerance)
    t2 = time.perf_counter()
    how = "exact (Fraction, ==)" if rep.exact_equal is not None else \
        f"float64, Hausdorff ≤ {tolerance:g}·scale"
    return {"L": model.n_blocks, "P": model.n_params(), "ok": rep.ok, "how": how,
            "err": rep.max_hausdorff_float64, "build": t1 - t0, "verify": t2 - t1}


def resnet_row(data) -> dict:
    t0 = time.perf_counter()
    net = build_resnet(data)
    t1 = time.perf_counter()
    rep = verify_resnet(net, data)
    t2 = time.perf_counter()
    assert net.n_params() == resnet_param_count(net.n_blocks, net.D)
    return {"L": net.n_blocks, "P": net.n_params(), "ok": rep.ok, "how": "exact (Fraction, ==)",
            "err": rep.max_error_float64, "build": t1 - t0, "verify": t2 - t1}


def table(rows: list[dict], args) -> str:
    head = (f"N = {args.N} pairs, d = {args.d}, m = {args.m} target tokens each (Σm = "
            f"{args.N * args.m}), inputs uniform in [0,1]^d, seed {args.seed}.\n\n"
            "| n | tokens | transformer L | transformer P | transformer check | verdict | "
            "err float64 | build s | verify s | ResNet L | ResNet P | ResNet check | verdict | "
            "err float64 | build s | verify s |\n" + "|---" * 16 + "|\n")
    lines = []
    for r in rows:
        t, s = r["transformer"], r["resnet"]
        cells = [r["n"], r["n"] * args.N]
        for x in (t, s):
            cells += [x["L"], x["P"], x["how"], "EXACT" if x["ok"] and "exact" in x["how"]
                      else ("OK" if x["ok"] else "FAILED"), f"{x['err']:.1e}",
                      f"{x['build']:.2f}", f"{x['verify']:.2f}"]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return head + "\n".join(lines) + "\n"


def figure(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ns = [r["n"] for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, key, label in ((axes[0], "L", "blocks L"), (axes[1], "P", "parameters P")):
        for name, colour in (("transformer", "tab:blue"), ("resnet", "tab:red")):
            vals = [r[name][key] for r in rows]
            exact = ["exact" in r[name]["how"] for r in rows]
            ax.plot(ns, vals, "-", color=colour,
                    label="transformer (hardmax)" if name == "transformer" else
                    "ResNet on flattened input")
            ax.scatter([n for n, e in zip(ns, exact, strict=True) if e],
                       [v for v, e in zip(vals, exact, strict=True) if e], color=colour, zorder=3)
            ax.scatter([n for n, e in zip(ns, exact, strict=True) if not e],
                       [v for v, e in zip(vals, exact, strict=True) if not e],
                       facecolors="white", edgecolors=colour, zorder=3)
        ax.set_xscale("log")
        if key == "P":
            ax.set_yscale("log")
        else:
            ax.set_ylim(bottom=0)
        ax.set_xlabel("tokens per sequence n")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3, which="both")
    axes[0].legend()
    fig.suptitle("Exact interpolants of the same data: size against sequence length "
                 "(filled: verified in exact arithmetic, hollow: float64 check)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--N", type=int, default=10)
    p.add_argument("--m", type=int, default=2)
    p.add_argument("--d", type=int, default=2)
    p.add_argument("--ns", default="10,30,100,300,1000,3000,10000")
    p.add_argument("--exact-max-n", type=int, default=10000,
                   help="largest n for which the transformer is built and verified exactly")
    p.add_argument("--tolerance", type=float, default=1e-9,
                   help="relative Hausdorff tolerance of the float64 transformer check")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    rows = []
    for n in (int(v) for v in args.ns.split(",")):
        data = builtin.uniform(args.N, n, args.m, args.d, seed=args.seed)
        rows.append({"n": n,
                     "transformer": transformer_row(data, n <= args.exact_max_n, args.tolerance),
                     "resnet": resnet_row(data)})
        r = rows[-1]
        print(f"n = {n}: transformer L {r['transformer']['L']} P {r['transformer']['P']} "
              f"({r['transformer']['how']}, ok {r['transformer']['ok']}); ResNet L "
              f"{r['resnet']['L']} P {r['resnet']['P']} (ok {r['resnet']['ok']})", flush=True)
    stamp = (f"Measured {datetime.date.today()} on {platform.machine()}, "
             f"{os.cpu_count()} cores, Python {platform.python_version()}.\n\n")
    text = "# Transformer vs ResNet: size against sequence length\n\n" + stamp + table(rows, args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "resnet_vs_transformer.md").write_text(text)
    figure(rows, args.out / "resnet_vs_transformer.png")
    print("\n" + text + f"\nwritten: {args.out / 'resnet_vs_transformer.md'}, "
          f"{args.out / 'resnet_vs_transformer.png'}")
    return rows


if __name__ == "__main__":
    main()
