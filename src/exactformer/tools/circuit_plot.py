"""A figure of one pair's circuit over the TransformerLens blocks (``plot --explain``; needs
matplotlib).

Two panels share the x axis, the TL blocks: above, every MLP unit (y: its index in
``blocks.{i}.mlp.hook_post``) coloured by log10 of its largest |activation| on the pair's
tokens, blank where it is exactly 0 (the unit is not used, docs/circuit.md); below, every
head, filled where its output on the pair is nonzero. The record's phases are shaded and
named along the top. One column a block, so a 100-block model is 100 thin columns; the numbers
come from the checked exact pass (:mod:`exactformer.circuit.trace`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from ..circuit.document import lens_shape, phases
from ..circuit.trace import trace
from ..data import CausalDataset, Dataset
from ..model import Transformer
from ..modelio import atomic_path

PHASE_SHADES = ("#f2f2f2", "#ffffff")


def circuit_grids(model: Transformer, data: Dataset | CausalDataset, j: int,
                  t: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(units, heads): (d_mlp, n_layers) log10 of the largest |activation| of each TL unit on
    sequence j's tokens (those ≤ t for a causal position), NaN where every one is 0; and
    (n_heads, n_layers) True where the head's output there is nonzero."""
    shape = lens_shape(model)
    tr = trace(model, data, [j])
    n = None if t is None else t + 1
    units = np.full((shape["d_mlp"], shape["n_layers"]), np.nan)
    for m in tr.mlps:
        A = m.acts[0][:n]
        if A.size:
            used = (A != 0).any(axis=0)  # decided on the exact (or mp) values
            top = np.array([max(abs(float(v)) for v in A[:, u]) for u in range(A.shape[1])])
            units[: A.shape[1], m.block] = np.where(
                used, np.log10(np.maximum(top, np.finfo(float).tiny)), np.nan)
    heads = np.zeros((shape["n_heads"], shape["n_layers"]), dtype=bool)
    for a in tr.attns:
        O = a.outputs[0][:, :n]
        for h in range(len(O)):
            heads[h, a.block] = bool(O[h].any())
    return units, heads


def plot_circuit(model: Transformer, data: Dataset | CausalDataset, path: str | Path,
                 pair: int | None = None, position: tuple[int, int] | None = None) -> Figure:
    """Draw pair ``pair`` (or causal ``position`` (j, t)) over the TL blocks into ``path``
    (PNG, written atomically) and return the figure."""
    j, t = (pair, None) if position is None else position
    if j is None or not 0 <= j < data.N:
        raise ValueError(f"pair {j}: the data have pairs 0..{data.N - 1}")
    units, heads = circuit_grids(model, data, j, t)
    L = units.shape[1]
    fig = Figure(figsize=(min(24.0, max(8.0, 0.09 * L + 3)), 6.5), layout="constrained")
    FigureCanvasAgg(fig)
    top, bottom = fig.subplots(2, 1, sharex=True,
                               gridspec_kw={"height_ratios": [max(4, units.shape[0]), 2
                                                              + heads.shape[0]]})
    for ax in (top, bottom):
        _shade_phases(ax, model)
    image = top.imshow(units, aspect="auto", origin="lower", cmap="viridis",
                       interpolation="nearest", extent=(-0.5, L - 0.5, -0.5,
                                                        units.shape[0] - 0.5))
    bar = fig.colorbar(image, ax=top, shrink=0.9)
    bar.set_label("log10 |activation| (blank: exactly 0)", fontsize=8)
    top.set_ylabel("mlp.hook_post unit", fontsize=8)
    top.yaxis.set_major_locator(MaxNLocator(integer=True))
    bottom.imshow(np.where(heads, 1.0, np.nan), aspect="auto", origin="lower",
                  cmap=ListedColormap(["#c0392b"]), interpolation="nearest",
                  extent=(-0.5, L - 0.5, -0.5, heads.shape[0] - 0.5))
    bottom.set_ylabel("attn head", fontsize=8)
    bottom.set_yticks(range(heads.shape[0]))
    bottom.set_xlabel("TransformerLens block (blocks.{i})", fontsize=8)
    for p in phases(model):
        if p["blocks"] is not None:
            top.text((p["blocks"][0] + p["blocks"][1] - 1) / 2, 1.01, p["name"],
                     transform=top.get_xaxis_transform(), ha="center", va="bottom",
                     fontsize=7)
    who = f"pair {j}" if t is None else f"sequence {j}, position {t}"
    used = int(np.isfinite(units).sum())
    fig.suptitle(f"circuit of {who}: {used} units and {int(heads.sum())} heads used, "
                 f"{L} TransformerLens blocks ({model.attention})", fontsize=10)
    with atomic_path(Path(path)) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    return fig


def _shade_phases(ax, model: Transformer) -> None:
    for k, p in enumerate(phases(model)):
        if p["blocks"] is not None:
            ax.axvspan(p["blocks"][0] - 0.5, p["blocks"][1] - 0.5,
                       color=PHASE_SHADES[k % 2], zorder=0)
