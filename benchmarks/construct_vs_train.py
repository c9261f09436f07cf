"""Construction against gradient training on the same data (README, Construction vs training).

For a few small built-in datasets:

1. **construct** the interpolant and verify it: hardmax with rational parameters (proved with
   ``==``) and softmax (τ = 1, verified at 50 digits), with ``exactformer.compile`` and
   ``exactformer.verify``;
2. **train** what a user would otherwise train: the ρ/η layout with exactly the architecture of
   the softmax construction's ρ/η export (same depth, width 4, h = d + 1, softmax τ = 1, so an
   exact interpolant exists in it), from a seeded random start
   (exactformer.tools.train.random_rho_eta), full-batch Adam with no penalty (ε = 0), until the
   largest Hausdorff error of a pair is below --target (1e-3) × the coordinate scale, or the time
   budget (--budget, 60 s) runs out.

Table: time, final error (max Hausdorff distance over the coordinate scale), parameters
(structured count for the constructions, the ρ/η layout's dense count for training) and the
ratios training / construction. Printed and written with the date and machine to
benchmarks/results/construct_vs_train.md.

Run: .venv/bin/python benchmarks/construct_vs_train.py [--quick] [--budget S]
(--quick: a 3 s budget, written to construct_vs_train_quick.md).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import time
from pathlib import Path

import torch

import exactformer as ef
from exactformer.data import builtin
from exactformer.export import to_rho_eta
from exactformer.tools import train as tr

RESULTS = Path(__file__).parent / "results"
DATASETS = {
    "uniform": lambda: builtin.uniform(N=4, n=6, m=2, d=3, seed=0),
    "shared_pool": lambda: builtin.shared_pool(N=5, d=3, pool=6, n_max=4, m_max=2, seed=1),
    "vocabulary": lambda: builtin.vocabulary(N=5, vocab=10, n=4, m=2, d=3, seed=0),
}


def construct(data, attention: str) -> dict:
    t0 = time.perf_counter()
    model = ef.compile(data, attention=attention)
    report = ef.verify(model, data)
    seconds = time.perf_counter() - t0
    if report.exact_equal is not None:
        error = "0 (exact, ==)"
    else:
        error = f"{max(report.extra['hausdorff_mp']) / report.coordinate_scale:.1e} (50 digits)"
    assert report.ok, f"the {attention} construction failed to verify"
    return {"method": f"construct {attention}", "model": model, "blocks": model.n_blocks,
            "params": model.n_params(), "seconds": seconds, "error": error, "reached": "yes"}


def train_row(data, model, args) -> dict:
    """Train the ρ/η architecture of ``model``'s export from a random start."""
    shape = to_rho_eta(model)
    start = tr.random_rho_eta(data.d, len(shape.blocks), h=shape.h, tau=1.0, width=shape.width,
                              seed=args.seed)
    scale = data.coordinate_scale()
    run = tr.train(start, data, eps=0.0, epochs=args.epochs, lr=args.lr,
                   lr_final=args.lr / 100, target_error=args.target * scale,
                   time_budget=args.budget, progress=True)
    reached = run.stop == "target error"
    return {"method": "train (Adam, ρ/η)", "blocks": len(start.blocks),
            "params": sum(p.numel() for p in start.parameters()), "seconds": run.seconds,
            "error": f"{run.final_max_error / scale:.1e} (best {min(run.max_error) / scale:.1e})",
            "reached": f"{'yes' if reached else 'no'} ({run.steps} steps, {run.stop})"}


def table(results: list[tuple[str, object, list[dict]]], args, seconds: float) -> str:
    head = (f"# Construction against training\n\n{datetime.date.today().isoformat()}, "
            f"{platform.platform()}, {platform.processor() or platform.machine()}, "
            f"{os.cpu_count()} CPUs, torch {torch.__version__} ({torch.get_num_threads()} "
            f"thread(s)); total {seconds:.0f} s.\n\n"
            f"Training: ρ/η layout with the softmax construction's export architecture (same "
            f"depth, width 4, h = d + 1, τ = 1), random start (seed {args.seed}), full-batch "
            f"Adam, lr {args.lr:g} (cosine to {args.lr / 100:g} over {args.epochs} epochs), "
            f"ε = 0; stop at max Hausdorff error < {args.target:g} × coordinate scale or after "
            f"{args.budget:g} s. Errors are max Hausdorff distances over the coordinate scale; "
            "parameters are the structured count for constructions and the dense ρ/η count "
            "for training; ratios are training / softmax construction.\n\n"
            "| dataset | N | Σm | tokens | method | blocks | parameters | time s | "
            "max error / scale | below target | time ratio | parameter ratio |\n"
            + "|---" * 12 + "|\n")
    lines = []
    for name, data, rows in results:
        soft, trained = rows[1], rows[2]
        for row in rows:
            ratios = ("", "")
            if row is trained:  # a run that missed the target gives a lower bound on time
                more = "" if row["reached"].startswith("yes") else "> "
                ratios = (f"{more}{row['seconds'] / soft['seconds']:.0f}×",
                          f"{row['params'] / soft['params']:.1f}×")
            lines.append(f"| {name} | {data.N} | {data.total_m} | {data.total_n} | "
                         f"{row['method']} | {row['blocks']} | {row['params']} | "
                         f"{row['seconds']:.2f} | {row['error']} | {row['reached']} | "
                         f"{ratios[0]} | {ratios[1]} |")
    return head + "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="3 s training budget per dataset")
    p.add_argument("--budget", type=float, help="training seconds per dataset (default 60)")
    p.add_argument("--epochs", type=int, default=20_000, help="Adam steps at most")
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--target", type=float, default=1e-3,
                   help="stop below this max Hausdorff error / coordinate scale")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    if args.budget is None:
        args.budget = 3.0 if args.quick else 60.0
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    results = []
    for name, make in DATASETS.items():
        data = make()
        rows = [construct(data, "hardmax"), construct(data, "softmax")]
        rows.append(train_row(data, rows[1]["model"], args))
        results.append((name, data, rows))
        print(f"{name}: constructed in {rows[1]['seconds']:.2f} s, trained "
              f"{rows[2]['seconds']:.1f} s to error {rows[2]['error']}")
    text = table(results, args, time.perf_counter() - t0)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"construct_vs_train{'_quick' if args.quick else ''}.md"
    path.write_text(text)
    print("\n" + text + f"\nwritten to {path}")


if __name__ == "__main__":
    main()
