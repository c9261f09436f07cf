"""The Tikhonov experiment of Alcalde–Fantuzzi–Zuazua (docs/baselines.md), one command.

Data: N = 10 sequences of n = 100 tokens uniform in [0,1]^16; each target is the output of one
generating block (exactformer.tools.train.mean_ff_generator: zero query/key matrices, so every token
becomes its sequence's mean, then a random width-4 FF, ρ = 0, η = 1), a single token (m = 1).
The generator θ_gen is an exact interpolant in the trained architecture (one ρ/η block, h = 1,
softmax, τ = 1, width 4), so a global minimiser of Loss + ε‖θ‖² has loss ≤ ε‖θ_gen‖².

For each ε, a model trained from the same seeded random start with full-batch Adam (cosine
schedule). Results in benchmarks/results/: tikhonov.md (table, fitted slope of log(minimal
training loss) against log ε), tikhonov_slope.png (log-log with the slope-1 bound ε‖θ_gen‖² and
a slope-1 reference through the data) and tikhonov_curves.png (loss curves against the bounds).

Run: .venv/bin/python benchmarks/tikhonov_experiment.py [--quick] [--epochs E] [--lr LR]
(--quick: a few hundred epochs, seconds, files suffixed _quick).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

import exactformer as ef  # noqa: E402
from exactformer.export import to_rho_eta  # noqa: E402
from exactformer.tools import train as tr  # noqa: E402

RESULTS = Path(__file__).parent / "results"


def constructed_norms(data) -> dict[str, tuple[int, float]]:
    """(L, ‖θ*‖²) of the constructed interpolants (hats and keyed models, hardmax and
    softmax) in the ρ/η layout, the architecture of the bound ε‖θ*‖² they give: no
    generator needed (docs/numerics.md#conditioning)."""
    out = {}
    for label, attention, keys in (("hardmax", "hardmax", False), ("softmax", "softmax", False),
                                   ("keyed hardmax", "hardmax", True),  # docs/keyed.md
                                   ("keyed softmax", "softmax", True)):
        model = ef.compile(data, attention=attention, exact=False, keys=keys)
        out[label] = (model.n_blocks, float(tr.norm_sq(to_rho_eta(model)).detach()))
    return out


def run(args) -> tuple[list[dict], float, float]:
    """Train for every ε; the rows, ‖θ_gen‖² and the fitted slope."""
    rng = np.random.default_rng(args.seed)
    inputs = list(rng.random((args.N, args.n, args.d)))
    gen = tr.mean_ff_generator(args.d, seed=args.seed + 1)
    data = tr.dataset_from_model(gen, inputs)
    assert all(len(y) == 1 for y in data.targets), "the generator must collapse each sequence"
    args.constructed = constructed_norms(data)
    for attention, (L, norm) in args.constructed.items():
        print(f"constructed {attention} interpolant: L = {L} blocks, ‖θ*‖² = {norm:.4g} "
              f"(generator: ‖θ_gen‖² = {float(tr.norm_sq(gen).detach()):.4g})")
    start = tr.random_rho_eta(args.d, n_blocks=1, h=1, tau=1.0, seed=args.seed + 2)
    rows = []
    for eps in args.eps:
        result = tr.train(start, data, eps=eps, epochs=args.epochs, lr=args.lr,
                          lr_final=args.lr_final, progress=True)
        diag = tr.tikhonov_diagnostic(result, gen, data)
        rows.append({"eps": eps, "result": result, "diag": diag})
        star = ", ".join(f"{a} ε‖θ*‖² = {eps * n:.4g}" for a, (_, n) in args.constructed.items())
        print(f"ε = {eps:g}: min loss {result.min_loss:.4g}, final loss {result.final_loss:.4g}, "
              f"bound ε‖θ_gen‖² = {diag.bound:.4g} (constructed: {star}), "
              f"{result.seconds:.1f} s")
    slope = float(np.polyfit(np.log10(args.eps), [np.log10(r["result"].min_loss)
                                                  for r in rows], 1)[0])
    return rows, rows[0]["diag"].reference_norm_sq, slope


def table(rows: list[dict], gen_norm: float, slope: float, args, seconds: float) -> str:
    constructed = "".join(
        f"Constructed {a} interpolant of the same data (float64 build, ρ/η layout): L = {L} "
        f"blocks, ‖θ*‖² = {n:.4g} = {n / gen_norm:.3g} × ‖θ_gen‖²; ε‖θ*‖² bounds J_ε at every "
        f"global minimiser over {L}-block models, with no known generator.\n\n"
        for a, (L, n) in args.constructed.items())
    head = (f"# Tikhonov experiment\n\n{datetime.date.today().isoformat()}, "
            f"{platform.platform()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
            f"{torch.get_num_threads()} torch thread(s); total {seconds:.0f} s.\n\n"
            f"N = {args.N} sequences of n = {args.n} tokens uniform in [0,1]^{args.d}, one target "
            f"token each from the generating block (mean, then a random width-4 FF); "
            f"‖θ_gen‖² = {gen_norm:.4g} (every parameter, ρ and η included). Trained: one ρ/η "
            f"block, h = 1, softmax τ = 1, width 4, random start (seed {args.seed + 2}), "
            f"full-batch Adam, {args.epochs} epochs, learning rate cosine {args.lr:g} → "
            f"{args.lr_final:g}. Loss = mean over pairs of the squared Hausdorff distance.\n\n"
            f"**Fitted slope of log(minimal training loss) against log ε: {slope:.2f}** "
            f"(least squares over the {len(rows)} values of ε).\n\n"
            f"{constructed}"
            "| ε | bound ε‖θ_gen‖² | minimal loss | final loss | final ‖θ‖² | "
            "final J = loss + ε‖θ‖² | min loss / bound | verdict | epochs | seconds |\n"
            + "|---" * 10 + "|\n")
    lines = []
    for r in rows:
        res, diag = r["result"], r["diag"]
        verdict = ("not at a global minimum (J > bound)" if diag.not_global_minimum
                   else "J ≤ bound (consistent)")
        lines.append(f"| {r['eps']:g} | {diag.bound:.4g} | {res.min_loss:.4g} | "
                     f"{res.final_loss:.4g} | {res.norm_sq[-1]:.4g} | {res.final_objective:.4g} | "
                     f"{res.min_loss / diag.bound:.3g} | {verdict} | {res.steps} | "
                     f"{res.seconds:.1f} |")
    return head + "\n".join(lines) + "\n"


def plot_slope(rows, gen_norm: float, slope: float, path: Path) -> None:
    eps = np.array([r["eps"] for r in rows])
    best = np.array([r["result"].min_loss for r in rows])
    grid = np.geomspace(eps.min() / 2, eps.max() * 2, 50)
    mid = np.exp(np.log(eps).mean()), np.exp(np.log(best).mean())
    fig, ax = plt.subplots(figsize=(5.5, 4.2))
    ax.loglog(eps, best, "o-", label=f"minimal training loss (fitted slope {slope:.2f})")
    ax.loglog(grid, gen_norm * grid, "k--", label="bound ε‖θ_gen‖² (slope 1)")
    ax.loglog(grid, mid[1] * grid / mid[0], ":", color="gray", label="slope-1 reference")
    ax.set_xlabel("ε")
    ax.set_ylabel("loss")
    ax.set_title("Tikhonov regularisation: minimal loss against ε")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def plot_curves(rows, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for r, colour in zip(rows, plt.rcParams["axes.prop_cycle"].by_key()["color"], strict=False):
        res = r["result"]
        ax.semilogy(np.arange(len(res.loss)), res.loss, color=colour, lw=1,
                    label=f"ε = {r['eps']:g}: Loss(θ_t)")
        ax.axhline(r["diag"].bound, color=colour, ls="--", lw=1,
                   label=f"ε = {r['eps']:g}: bound ε‖θ_gen‖²")
    ax.set_xlabel("epoch (full-batch Adam step)")
    ax.set_ylabel("training loss")
    ax.set_title("Loss curves against the bounds ε‖θ_gen‖²")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a few hundred epochs (seconds)")
    p.add_argument("--epochs", type=int, help="Adam steps per ε (default 5000, quick 300)")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--lr-final", type=float, default=1e-4)
    p.add_argument("--eps", type=lambda s: [float(v) for v in s.split(",")],
                   default=[1e-1, 1e-2, 1e-3])
    p.add_argument("--N", type=int, default=10)
    p.add_argument("--n", type=int, default=100)
    p.add_argument("--d", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    if args.epochs is None:
        args.epochs = 300 if args.quick else 5000
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    rows, gen_norm, slope = run(args)
    suffix = "_quick" if args.quick else ""
    args.out.mkdir(parents=True, exist_ok=True)
    text = table(rows, gen_norm, slope, args, time.perf_counter() - t0)
    (args.out / f"tikhonov{suffix}.md").write_text(text)
    plot_slope(rows, gen_norm, slope, args.out / f"tikhonov_slope{suffix}.png")
    plot_curves(rows, args.out / f"tikhonov_curves{suffix}.png")
    print("\n" + text)
    print(f"written to {args.out}/tikhonov{suffix}.md, tikhonov_slope{suffix}.png, "
          f"tikhonov_curves{suffix}.png")


if __name__ == "__main__":
    main()
