"""Draw docs/figures/gadgets.png: the three ReLU gadgets as functions of t.

The curves are computed from the units that exactformer itself builds
(``construct/gadgets.py``: ``hat_units`` and ``snap_units``), so the figure shows the code's
gadgets, not a re-derivation. Run from the repository root:

    .venv/bin/python docs/figures/gadgets.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))
from exactformer.construct.gadgets import hat_units, snap_units  # noqa: E402

OUT = Path(__file__).with_suffix(".png")


def added(units, t):
    """The vector Σ w·relu(u·x + b) that the units add, for scalar tokens x = t (d = 1)."""
    return sum(np.asarray(un.w, dtype=float)[0] * np.maximum(float(un.u[0]) * t + float(un.b), 0)
               for un in units)


def main() -> None:
    one = np.array([1.0])
    t = np.linspace(-2.0, 2.0, 801)
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))

    # 1. the 3-ReLU hat: centre c = 0, width δ = 1, displacement D = 1
    ax = axes[0]
    ax.plot(t, added(hat_units(one, 0.0, 0.0, 1.0, one, plateau=False), t), lw=2)
    ax.set_title("hat (3 ReLU): c = 0, δ = 1, D = 1")
    ax.set_xlabel("t = f·x")
    ax.set_ylabel("added displacement / D")

    # 2. the flat-top hat on a dyadic grid: same c, δ, D
    ax = axes[1]
    ax.plot(t, added(hat_units(one, 0.0, 0.0, 1.0, one, plateau=True), t), lw=2, color="C1")
    ax.axvspan(-0.5, 0.5, color="C1", alpha=0.12, label="plateau |t − c| ≤ δ/2")
    ax.set_title("flat-top hat (4 ReLU): c = 0, δ = 1, D = 1")
    ax.set_xlabel("t = f·x")
    ax.legend(loc="upper right", fontsize=8)

    # 3. the interval snap for tokens x = t·e on a line (d = 1, e = 1): t ↦ t + φ(t)
    ax = axes[2]
    c1, c2, c3, c4, y = 1.0, 1.5, 2.5, 3.0, 4.0
    s = np.linspace(0.0, 4.5, 901)
    out = s + added(snap_units(one, 0.0, one, c1, c2, c3, c4, np.array([y])), s)
    ax.plot(s, s, ls=":", color="grey", label="identity")
    ax.plot(s, out, lw=2, color="C2", label="snap output")
    ax.axvspan(c2, c3, color="C2", alpha=0.12, label="[c2, c3] → y")
    for c in (c1, c2, c3, c4):
        ax.axvline(c, color="grey", lw=0.5)
    ax.set_xticks([c1, c2, c3, c4])
    ax.set_xticklabels(["c1", "c2", "c3", "c4"])
    ax.set_yticks([y])
    ax.set_yticklabels(["y"])
    ax.set_title("interval snap (4 ReLU) on the line x = t·e")
    ax.set_xlabel("t = f'·x")
    ax.set_ylabel("output (coordinate along e)")
    ax.legend(loc="upper left", fontsize=8)

    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(OUT, dpi=110)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
