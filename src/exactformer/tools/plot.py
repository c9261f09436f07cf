"""Figures of the construction: where the tokens are after each phase (needs matplotlib).

``plot_phases`` runs the model on the data (float64) and draws one panel per stage: the input,
then the positions after each phase that ``model.record.phases`` lists, in order. A phase
whose last block ends in a non-residual attention layer (ρ = 0: the collapse onto the leaders)
gets two panels, before and after that layer, so the leaders are seen before the collapse. So a
hardmax model shows input, separation, leaders, collapse, interpolation; a softmax model also
its projection and snap phases. Tokens are coloured by sequence (a legend, or a colour bar
beyond 20 sequences), a point held by k sequences is k concentric discs, and targets are black
crosses in the input and final panels. Tokens in R^2 are drawn as they are; for d > 2 each panel
shows its points projected onto their own first two principal directions (the titles say so).

A causal model (docs/causal.md) with its causal data is drawn the same way, panel by panel
(input plus stored positions, separation, interpolation; or projection and snap), but its
tokens are coloured by their position in the sequence, with a colour bar, and faint lines join
the consecutive positions of each sequence; the crosses are the targets of the constrained
positions.

Rendering uses matplotlib's Agg canvas directly (no pyplot, no display needed). An optional GIF
steps through the blocks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import matplotlib as mpl
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.cm import ScalarMappable
from matplotlib.collections import LineCollection
from matplotlib.colors import ListedColormap, Normalize
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from ..data import CausalDataset, Dataset
from ..evaluate import forward, forward_causal
from ..model import Block, Transformer
from ..modelio import atomic_path

MAX_FRAMES = 80
POSITION_CMAP = "viridis"
COLOUR_BAR = "position colour bar"  # the label of a causal figure's colour bar axes

# draws one snapshot into an axes; the flag asks for the target crosses
Painter = Callable[[object, list[np.ndarray], bool], None]


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
    out = [Stage("input" if model.positions is None else "input + stored positions", 0,
                 "input")]
    for name, (a, b) in phases.items():
        label = _blocks_label(a, b)
        if b in ends:
            before = f"before the collapse\n(FF of block {b})" if name == "collapse" else \
                f"after {name} ({label}),\nbefore the collapse"
            out.append(Stage(before, where[b] - 1, name))
            out.append(Stage(f"after the collapse\n(attention of block {b}, ρ = 0)", where[b],
                             name))
        else:
            out.append(Stage(f"after {name}\n({label})", where[b], name))
    return replace(model, blocks=blocks), out


def snapshots(model: Transformer, inputs: list[np.ndarray], indices) -> dict[int, list]:
    """The float64 positions after each number of blocks in ``indices`` (0: the input as the
    first block sees it). A set pass records them as it goes; a causal pass has no snapshots,
    so its blocks run segment by segment, each continuing from the last (the stored positions
    are added once, before the first; see docs/causal.md)."""
    if not model.causal:
        return forward(model, inputs, "float", snapshots=set(indices))[1]
    out, start, current, positions = {}, 0, inputs, model.positions
    for k in sorted(set(indices)):
        segment = replace(model, blocks=model.blocks[start:k], positions=positions)
        current = forward_causal(segment, current, "float")
        out[k], start, positions = current, k, None
    return out


def panels(fig: Figure) -> list:
    """The figure's panels: its axes without a causal figure's colour bar."""
    return [ax for ax in fig.axes if ax.get_label() != COLOUR_BAR]


def _colours(N: int) -> np.ndarray:
    """N distinct colours, one per sequence: tab10; up to 20, tab20's ten dark colours
    before its ten light ones (so that sequences 0-9 do not pair with their light twins);
    beyond, evenly spaced along turbo (matched by the figure's colour bar)."""
    if N <= 10:
        return np.array(mpl.colormaps["tab10"].colors[:N])
    if N <= 20:
        pairs = mpl.colormaps["tab20"].colors
        return np.array((pairs[0::2] + pairs[1::2])[:N])
    return mpl.colormaps["turbo"](np.linspace(0.05, 0.95, N))[:, :3]


def _sequence_key(fig: Figure, axes, colours: np.ndarray) -> None:
    """Which colour is which sequence: a legend for up to 20 sequences, else a colour bar
    (labelled COLOUR_BAR, so that :func:`panels` leaves it out)."""
    N = len(colours)
    if N <= 20:
        handles = [Line2D([], [], marker="o", linestyle="", color=c, label=f"sequence {j}")
                   for j, c in enumerate(colours)]
        fig.legend(handles=handles, loc="outside right upper", fontsize=7, frameon=False)
        return
    bar = fig.colorbar(ScalarMappable(Normalize(-0.5, N - 0.5), ListedColormap(colours)),
                       ax=axes, shrink=0.8)
    bar.set_label("sequence (0-based)", fontsize=8)
    bar.ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    bar.ax.tick_params(labelsize=7)
    bar.ax.set_label(COLOUR_BAR)


def _project(points: np.ndarray, d: int) -> np.ndarray:
    """The points themselves (d = 2), else onto their own first two principal directions."""
    if d == 2:
        return points
    centred = points - points.mean(axis=0)
    _, _, vt = np.linalg.svd(centred, full_matrices=False)
    basis = vt[:2].T if vt.shape[0] >= 2 else np.eye(d)[:, :2]
    return centred @ basis


def _distinct_keys(P: np.ndarray) -> list[tuple]:
    """Each row as a key, rounded so that float noise does not split one point in two."""
    return [tuple(r) for r in np.round(P, 12).tolist()]


def _finish(ax, n_distinct: int, d: int) -> None:
    """The count of distinct points, axis labels and margins every panel has."""
    ax.text(0.02, 0.98, f"{n_distinct} distinct points", transform=ax.transAxes, va="top",
            fontsize=8, color="0.3")
    ax.set_xlabel("x[0]" if d == 2 else "PC 1", fontsize=8)
    ax.set_ylabel("x[1]" if d == 2 else "PC 2", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.margins(0.08)


def _crosses(ax, xy: np.ndarray, size: float) -> None:
    ax.scatter(xy[:, 0], xy[:, 1], marker="x", c="black", s=max(size, 20), linewidths=1)


def _draw(ax, positions: list[np.ndarray], colours, targets: np.ndarray | None, d: int,
          size: float) -> None:
    """Tokens coloured by sequence; a point held by k sequences is k concentric discs, one
    per sequence however many of its tokens are there."""
    P = np.concatenate(positions)
    seq = np.repeat(np.arange(len(positions)), [len(p) for p in positions])
    both = P if targets is None else np.concatenate([P, targets])
    xy = _project(both, d)
    keys = _distinct_keys(P)
    holders: dict[tuple, list[int]] = {}  # point -> the sequences holding it, first seen first
    rows = []  # one token per (point, sequence)
    for i, k in enumerate(keys):
        held = holders.setdefault(k, [])
        if seq[i] not in held:
            held.append(seq[i])
            rows.append(i)
    rows = np.array(rows)
    rank = np.array([holders[keys[i]].index(seq[i]) for i in rows])
    k_of = np.array([len(holders[keys[i]]) for i in rows])
    sizes = size * (1 + 2 * (k_of - 1 - rank) / k_of)
    big_first = np.argsort(-sizes, kind="stable")
    order = rows[big_first]
    ax.scatter(xy[order, 0], xy[order, 1], c=colours[seq[order]], s=sizes[big_first],
               linewidths=0)
    if targets is not None:
        _crosses(ax, xy[len(P):], size)
    _finish(ax, len(holders), d)


def _draw_causal(ax, positions: list[np.ndarray], targets: np.ndarray | None, d: int,
                 size: float, norm: Normalize) -> None:
    """Tokens coloured by their position in the sequence (0-based, in sequence order), over
    faint lines that join the consecutive positions of each sequence."""
    P = np.concatenate(positions)
    both = P if targets is None else np.concatenate([P, targets])
    xy = _project(both, d)
    ends = np.cumsum([len(p) for p in positions])
    ax.add_collection(LineCollection([xy[e - len(p):e] for p, e in zip(positions, ends,
                                                                      strict=True)],
                                     colors="0.55", linewidths=0.5, alpha=0.35, zorder=1))
    where = np.concatenate([np.arange(len(p)) for p in positions])
    ax.scatter(xy[:len(P), 0], xy[:len(P), 1], c=where, cmap=POSITION_CMAP, norm=norm, s=size,
               linewidths=0, zorder=2)
    if targets is not None:
        _crosses(ax, xy[len(P):], size)
    _finish(ax, len(set(_distinct_keys(P))), d)


def _painter(dataset: Dataset | CausalDataset, size: float) -> tuple[Painter, Normalize | None]:
    """How a snapshot of this dataset is drawn, and the position scale (causal data only)."""
    _, ys = dataset.floats()
    if isinstance(dataset, CausalDataset):
        targets = np.concatenate([y[k] for y, k in zip(ys, dataset.known, strict=True)])
        norm = Normalize(0, max(1, max(dataset.lengths) - 1))
        return (lambda ax, pos, show: _draw_causal(ax, pos, targets if show else None,
                                                   dataset.d, size, norm)), norm
    colours, targets = _colours(dataset.N), np.concatenate(ys)
    return (lambda ax, pos, show: _draw(ax, pos, colours, targets if show else None,
                                        dataset.d, size)), None


def plot_phases(model: Transformer, dataset: Dataset | CausalDataset, path,
                animate=False) -> Figure:
    """Draw the token positions after each phase to ``path`` (PNG, or any format matplotlib
    infers from the suffix); return the figure, one axes per panel (see :func:`panels`: a
    causal figure also has a colour bar).

    ``animate``: False, True (a GIF beside ``path``, same name) or a path for the GIF, which
    steps through the blocks (at most MAX_FRAMES frames, always including each stage).
    """
    dataset = dataset.padded(model.d)  # d < D: drawn in the model's R^D; d > D: an error
    if model.causal != isinstance(dataset, CausalDataset):
        raise ValueError(f"a {'causal' if model.causal else 'set-to-set'} model is plotted "
                         f"with {'causal' if model.causal else 'set-to-set'} data "
                         "(docs/causal.md)")
    split, stage_list = stages(model)
    snaps = snapshots(split, dataset.floats()[0], [s.index for s in stage_list])
    size = float(np.clip(400 / np.sqrt(dataset.total_n), 2, 30))
    paint, norm = _painter(dataset, size)
    ncols = len(stage_list) if len(stage_list) <= 4 else 3
    nrows = -(-len(stage_list) // ncols)
    fig = Figure(figsize=(3.6 * ncols + (0.8 if norm else 0), 3.4 * nrows + 0.8),
                 layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for ax in axes[len(stage_list):]:
        fig.delaxes(ax)
    for k, (ax, st) in enumerate(zip(axes, stage_list, strict=False)):
        paint(ax, snaps[st.index], k in (0, len(stage_list) - 1))
        ax.set_title(st.title, fontsize=9)
    if norm is None:
        _sequence_key(fig, axes[:len(stage_list)], _colours(dataset.N))
    else:
        bar = fig.colorbar(ScalarMappable(norm, POSITION_CMAP), ax=axes[:len(stage_list)],
                           shrink=0.8)
        bar.set_label("position in the sequence (0-based)", fontsize=8)
        bar.ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        bar.ax.tick_params(labelsize=7)
        bar.ax.set_label(COLOUR_BAR)
    fig.suptitle(_headline(model, dataset), fontsize=10)
    path = Path(path)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format=path.suffix.lstrip(".").lower() or "png", dpi=110)
    if animate:
        gif = path.with_suffix(".gif") if animate is True else Path(animate)
        _animate(split, stage_list, dataset, paint, gif)
    return fig


def _headline(model: Transformer, dataset: Dataset | CausalDataset) -> str:
    where = ("tokens in R^2, drawn as they are" if dataset.d == 2 else
             f"tokens in R^{dataset.d}: each panel projected onto its points' first two "
             "principal directions")
    if dataset.padded_from is not None:
        where += f" (data in R^{dataset.padded_from}, zero-padded)"
    if isinstance(dataset, CausalDataset):
        rounds = "" if model.record is None else f" (R_c = {model.record.R})"
        return (f"causal {model.attention} transformer, N = {dataset.N} sequences, "
                f"{dataset.total_n} positions ({dataset.constrained} constrained), "
                f"L = {model.n_blocks} blocks{rounds}\n{where}\n"
                "dots: tokens, coloured by position; grey lines join consecutive positions of "
                "a sequence; black ×: targets of the constrained positions (first and last "
                "panel)")
    shape = "" if model.max_width() <= 4 and model.max_heads() <= 1 else \
        f" (width {model.max_width()}, {model.max_heads()} heads)"
    return (f"{model.attention} transformer, N = {dataset.N} sequences, L = {model.n_blocks} "
            f"blocks{shape}; {where}\ndots: tokens, coloured by sequence; black ×: target tokens "
            "(first and last panel)")


def _animate(split: Transformer, stage_list: list[Stage], dataset: Dataset | CausalDataset,
             paint: Painter, path: Path) -> None:
    from PIL import Image

    L = split.n_blocks
    frames = sorted({*np.linspace(0, L, min(L + 1, MAX_FRAMES)).round().astype(int).tolist(),
                     *(s.index for s in stage_list)})
    snaps = snapshots(split, dataset.floats()[0], frames)
    phase_of = {}
    for prev, st in zip([Stage("", 0, "input"), *stage_list], stage_list, strict=False):
        for i in range(prev.index, st.index + 1):
            phase_of.setdefault(i, st.phase)
    fig = Figure(figsize=(5, 5), layout="constrained")
    canvas = FigureCanvasAgg(fig)
    ax = fig.subplots()
    images = []
    for i in frames:
        ax.clear()
        paint(ax, snaps[i], i in (0, L))
        ax.set_title(f"{phase_of.get(i, '')}: step {i} of {L}", fontsize=10)
        canvas.draw()
        images.append(Image.frombuffer("RGBA", canvas.get_width_height(),
                                       canvas.buffer_rgba()).convert("RGB"))
    with atomic_path(path) as tmp:
        images[0].save(tmp, format="GIF", save_all=True, append_images=images[1:],
                       duration=[1200 if i in {s.index for s in stage_list} else 250
                                 for i in frames], loop=0)
