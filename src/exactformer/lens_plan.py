"""Where our layers sit in the TransformerLens layout: the plan of its blocks (pure, no torch).

The TL export (:mod:`exactformer.export.transformer_lens`) writes its weights from this plan,
and the circuit (:mod:`exactformer.circuit`) names its hooks from it, so a hook name in a
``circuit.json`` is the block that holds the layer. TL blocks are x ← x + attn(x);
x ← x + mlp(x). Our FF→SA blocks are laid out in order: an SA opens a TL block, an FF takes
the MLP of the open block if it is free, else opens one. An MLP part's hidden units are the
FF's own first (TL unit k is the FF's unit k); a part that is not residual (an FF with η ≠ 1,
or the ρ·x of an SA with ρ ≠ 1, a "mix") then adds 2D *turn* units, relu(x_c) at offset c and
relu(−x_c) at offset D + c, that move the tokens to the other half of a stream of width 2D
(docs/numerics.md#the-transformerlens-export, docs/circuit.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .model import SA, Transformer


def is_identity_sa(sa: SA | None) -> bool:
    """No layer, or ρ = 1 and V = 0: the attention changes nothing (the TL layout drops it)."""
    return sa is None or sa.is_identity()


def score_bound(model: Transformer) -> float:
    """g = max over the heads of the layers the TL layout keeps (not :func:`is_identity_sa`)
    of |α| + ‖a‖·‖c‖, so every score is at most g·‖x‖² in size; nan or inf where a weight
    is not finite."""
    terms = [abs(float(h.A.alpha)) + float(np.linalg.norm(np.asarray(h.A.a, dtype=float)) *
                                            np.linalg.norm(np.asarray(h.A.c, dtype=float)))
             for b in model.blocks if not is_identity_sa(b.sa) for h in b.sa.heads]
    return float(np.max(terms, initial=0.0))  # (np.max keeps a nan)


def hardmax_exponent_for(model: Transformer, half: int) -> int | None:
    """k with 2^k·g = 2^half rounded down to a power of two (g: :func:`score_bound`): the TL
    layout runs hardmax as the softmax of the scores times 2^k, by ``attn_scale`` = 2^−k
    (docs/numerics.md#the-transformerlens-export); None where g is not finite. One rule for
    the export and for the runtime proofs, which bound the scaled scores."""
    g = score_bound(model)
    if not math.isfinite(g):
        return None
    return half if g == 0 else half - math.ceil(math.log2(g))


@dataclass
class LensLayer:
    """One TL block: the SA in its attention (or None) and its MLP's parts, each
    ("ff", FF) or ("mix", ρ) — the ρ·x of a non-residual SA, added after its attention."""

    attn: SA | None = None
    mlp: list = field(default_factory=list)


def plan(model: Transformer) -> list[LensLayer]:
    """Our layers packed into TL blocks in order: an SA opens a block (its ρ part, if ρ ≠ 1,
    takes that block's MLP), an FF takes the MLP of the open block if free, else opens one."""
    layers: list[LensLayer] = []
    for blk in model.blocks:
        if blk.ff is not None:
            if not layers or layers[-1].mlp:
                layers.append(LensLayer())
            layers[-1].mlp.append(("ff", blk.ff))
        if not is_identity_sa(blk.sa):
            layers.append(LensLayer(attn=blk.sa))
            if blk.sa.rho != 1:
                layers[-1].mlp.append(("mix", blk.sa.rho))
    return layers or [LensLayer()]


def layer_blocks(model: Transformer) -> list[tuple[int | None, int | None]]:
    """For each of our blocks, the TL blocks that hold its FF and its SA (None: the layer is
    absent, or an identity attention the layout drops)."""
    where = {}
    for i, layer in enumerate(plan(model)):
        for part in [layer.attn, *(v for kind, v in layer.mlp if kind == "ff")]:
            if part is not None:
                where[id(part)] = i
    return [(where.get(id(b.ff)) if b.ff is not None else None,
             where.get(id(b.sa)) if b.sa is not None else None) for b in model.blocks]


def block_layers(model: Transformer) -> list[int]:
    """For each of our blocks, the TL block that ends it (holds its SA, else its FF; −1 for a
    block of two identities before any TL block): where to read a phase's output."""
    out, at = [], -1
    for ff, sa in layer_blocks(model):
        at = max([at] + [i for i in (ff, sa) if i is not None])
        out.append(at)
    return out


def stream_halves(model: Transformer) -> list[int]:
    """For each TL block, the half of the stream (0: coordinates 0..D−1, 1: D..2D−1) that
    holds the tokens after it."""
    half, out = 0, []
    for layer in plan(model):
        for kind, value in layer.mlp:
            if kind == "mix" or value.eta != 1:
                half = 1 - half
        out.append(half)
    return out


def turns(model: Transformer) -> bool:
    """Whether some layer is not residual, so the stream needs two halves."""
    return any((b.ff is not None and b.ff.eta != 1) or
               (not is_identity_sa(b.sa) and b.sa.rho != 1) for b in model.blocks)


def own_units(part) -> int:
    """The part's own hidden units, before any turn units: the FF's width, 0 for a mix."""
    kind, value = part
    return value.width if kind == "ff" else 0


def part_turns(part) -> bool:
    """Whether the part moves the tokens to the other half (2D turn units after its own)."""
    kind, value = part
    return kind == "mix" or value.eta != 1


def part_units(part, d: int) -> int:
    """Hidden units of one MLP part: its own, plus 2d turn units if it turns the halves."""
    return own_units(part) + (2 * d if part_turns(part) else 0)


def lens_shape(model: Transformer) -> tuple[int, int, int, int]:
    """(n_layers, d_model, d_mlp, n_heads) of the TransformerLens export: its blocks, the
    stream (2D where it turns halves), the widest MLP part and at least one head (a config
    with none is refused by TransformerLens, so a model without attention gets one unused)."""
    layers = plan(model)
    d_mlp = max((part_units(p, model.d) for layer in layers for p in layer.mlp), default=0)
    return (len(layers), 2 * model.d if turns(model) else model.d, max(1, d_mlp),
            max(1, model.max_heads()))
