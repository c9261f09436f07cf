"""Figures of the construction: where the tokens are after each phase (needs matplotlib).

``plot_phases`` runs the model on the data (float64) and draws one panel per stage: the input,
then the positions after each phase that ``model.record.phases`` lists, in order. A phase
whose last block ends in a non-residual attention layer (ρ = 0: the collapse onto the leaders)
gets two panels, before and after that layer, so the leaders are seen before the collapse. So a
hardmax model shows input, separation, leaders, collapse, interpolation; a softmax model also
its projection and snap phases. Tokens are coloured by sequence, targets are black crosses in
the input and final panels. Tokens in R^2 are drawn as they are; for d > 2 each panel shows its
points projected onto their own first two principal directions (the titles say so).

Rendering uses matplotlib's Agg canvas directly (no pyplot, no display needed). An optional GIF
steps through the blocks.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import matplotlib as mpl
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from .data import Dataset
from .evaluate import forward
from .model import Block, Transformer
from .modelio import atomic_path

MAX_FRAMES = 80


@dataclass
class Stage:
    """A panel: its title and the snapshot index (blocks applied, in the split model)."""

    title: str
    index: int
    phase: str


def _is_collapse(block: Block) -> bool:
    """An FF followed by a non-residual attention layer (ρ = 0) in the same block."""
    return block.ff is not None and block.sa is not None and block.sa.rho == 0


def _blocks_label(a: int, b: int) -> str:
    if a == b:
        return "no blocks"
    return f"block {b}" if b == a + 1 else f"blocks {a + 1}–{b}"


def stages(model: Transformer) -> tuple[Transformer, list[Stage]]:
    """The model with each phase-ending collapse block split into FF and SA, and the stages."""
    phases = {p.name: (p.start, p.end) for p in model.record.phases} if model.record else \
        {"all blocks": (0, model.n_blocks)}
    ends = {b for a, b in phases.values() if b > a and _is_collapse(model.blocks[b - 1])}
    blocks, where = [], [0]  # where[k]: split-model index after k original blocks
    for k, blk in enumerate(model.blocks, start=1):
        blocks += [Block(blk.ff, None), Block(None, blk.sa)] if k in ends else [blk]
        where.append(len(blocks))
    out = [Stage("input", 0, "input")]
    for name, (a, b) in phases.items():
        label = _blocks_label(a, b)
        if b in ends:
            out.append(Stage(f"after {name} ({label}),\nbefore the collapse", where[b] - 1, name))
            out.append(Stage(f"after the collapse\n(attention of block {b}, ρ = 0)", where[b],
                             name))
        else:
            out.append(Stage(f"after {name}\n({label})", where[b], name))
    return replace(model, blocks=blocks), out


def _colours(N: int) -> np.ndarray:
    if N <= 10:
        return np.array(mpl.colormaps["tab10"].colors[:N])
    if N <= 20:
        return np.array(mpl.colormaps["tab20"].colors[:N])
    return mpl.colormaps["turbo"](np.linspace(0.05, 0.95, N))[:, :3]


def _project(points: np.ndarray, d: int) -> np.ndarray:
    """The points themselves (d = 2), else onto their own first two principal directions."""
    if d == 2:
        return points
    centred = points - points.mean(axis=0)
    _, _, vt = np.linalg.svd(centred, full_matrices=False)
    basis = vt[:2].T if vt.shape[0] >= 2 else np.eye(d)[:, :2]
    return centred @ basis


def _draw(ax, positions: list[np.ndarray], colours, targets: np.ndarray | None, d: int,
          size: float) -> None:
    """Tokens coloured by sequence; a point shared by k sequences is k concentric discs."""
    P = np.concatenate(positions)
    seq = np.repeat(np.arange(len(positions)), [len(p) for p in positions])
    both = P if targets is None else np.concatenate([P, targets])
    xy = _project(both, d)
    keys = [tuple(r) for r in np.round(P, 12).tolist()]
    sharing: dict[tuple, int] = {}  # point -> how many sequences hold it
    rank = np.empty(len(keys), dtype=int)
    for i, k in enumerate(keys):
        rank[i] = sharing.get(k, 0)
        sharing[k] = rank[i] + 1
    k_of = np.array([sharing[k] for k in keys])
    sizes = size * (1 + 2 * (k_of - 1 - rank) / k_of)
    order = np.argsort(-sizes, kind="stable")
    ax.scatter(xy[order, 0], xy[order, 1], c=colours[seq[order]], s=sizes[order],
               linewidths=0)
    if targets is not None:
        ax.scatter(xy[len(P):, 0], xy[len(P):, 1], marker="x", c="black", s=max(size, 20),
                   linewidths=1)
    ax.text(0.02, 0.98, f"{len(sharing)} distinct points", transform=ax.transAxes, va="top",
            fontsize=8, color="0.3")
    ax.set_xlabel("x[0]" if d == 2 else "PC 1", fontsize=8)
    ax.set_ylabel("x[1]" if d == 2 else "PC 2", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.margins(0.08)


def plot_phases(model: Transformer, dataset: Dataset, path, animate=False) -> Figure:
    """Draw the token positions after each phase to ``path`` (PNG, or any format matplotlib
    infers from the suffix); return the figure, one axes per panel.

    ``animate``: False, True (a GIF beside ``path``, same name) or a path for the GIF, which
    steps through the blocks (at most MAX_FRAMES frames, always including each stage).
    """
    if model.d != dataset.d:
        raise ValueError(f"the model is for d = {model.d} but the data have d = {dataset.d}")
    split, panels = stages(model)
    xs, ys = dataset.floats()
    targets = np.concatenate(ys)
    _, snaps = forward(split, xs, "float", snapshots={s.index for s in panels})
    colours = _colours(dataset.N)
    size = float(np.clip(400 / np.sqrt(dataset.total_n), 2, 30))
    ncols = len(panels) if len(panels) <= 4 else 3
    nrows = -(-len(panels) // ncols)
    fig = Figure(figsize=(3.6 * ncols, 3.4 * nrows + 0.8), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for ax in axes[len(panels):]:
        fig.delaxes(ax)
    for k, (ax, st) in enumerate(zip(axes, panels, strict=False)):
        show = targets if k in (0, len(panels) - 1) else None
        _draw(ax, snaps[st.index], colours, show, dataset.d, size)
        ax.set_title(st.title, fontsize=9)
    fig.suptitle(_headline(model, dataset), fontsize=10)
    path = Path(path)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format=path.suffix.lstrip(".").lower() or "png", dpi=110)
    if animate:
        gif = path.with_suffix(".gif") if animate is True else Path(animate)
        _animate(split, panels, dataset, colours, size, gif)
    return fig


def _headline(model: Transformer, dataset: Dataset) -> str:
    where = ("tokens in R^2, drawn as they are" if dataset.d == 2 else
             f"tokens in R^{dataset.d}: each panel projected onto its points' first two "
             "principal directions")
    shape = "" if model.max_width() <= 4 and model.max_heads() <= 1 else \
        f" (width {model.max_width()}, {model.max_heads()} heads)"
    return (f"{model.attention} transformer, N = {dataset.N} sequences, L = {model.n_blocks} "
            f"blocks{shape}; {where}\ndots: tokens, coloured by sequence; black ×: target tokens "
            "(first and last panel)")


def _animate(split: Transformer, panels: list[Stage], dataset: Dataset, colours, size: float,
             path: Path) -> None:
    from PIL import Image

    L = split.n_blocks
    frames = sorted({*np.linspace(0, L, min(L + 1, MAX_FRAMES)).round().astype(int).tolist(),
                     *(s.index for s in panels)})
    xs, ys = dataset.floats()
    targets = np.concatenate(ys)
    _, snaps = forward(split, xs, "float", snapshots=set(frames))
    phase_of = {}
    for prev, st in zip([Stage("", 0, "input"), *panels], panels, strict=False):
        for i in range(prev.index, st.index + 1):
            phase_of.setdefault(i, st.phase)
    fig = Figure(figsize=(5, 5), layout="constrained")
    canvas = FigureCanvasAgg(fig)
    ax = fig.subplots()
    images = []
    for i in frames:
        ax.clear()
        _draw(ax, snaps[i], colours, targets if i in (0, L) else None, dataset.d, size)
        ax.set_title(f"{phase_of.get(i, '')}: step {i} of {L}", fontsize=10)
        canvas.draw()
        images.append(Image.frombuffer("RGBA", canvas.get_width_height(),
                                       canvas.buffer_rgba()).convert("RGB"))
    with atomic_path(path) as tmp:
        images[0].save(tmp, format="GIF", save_all=True, append_images=images[1:],
                       duration=[1200 if i in {s.index for s in panels} else 250
                                 for i in frames], loop=0)
