"""A compiled model opened in TransformerLens: attention patterns and the residual stream.

A small dataset (the built-in demo: 12 sequences in R^3 drawn from a pool of 7 tokens) is
compiled into a hardmax transformer, exported to a TransformerLens ``TransformerBridge``
(docs/numerics.md#the-transformerlens-export) and run with ``run_with_cache`` on every
sequence at once. The figure shows what an interpretability user would look at first:

* the attention pattern of the first separation round (every token attends to the token with
  the largest u of its sequence, a one-hot column) and of the collapse (each token attends to
  its leader), read from ``blocks.{i}.attn.hook_pattern``;
* the residual stream (its first two token coordinates, from ``blocks.{i}.hook_resid_post``)
  at the end of each phase of the construction, with the targets as crosses.

It also checks that the bridge's logits are the targets (float64, within 1e-9 of the scale).

Run: .venv/bin/python examples/interpret.py [-o interpret.png]   (extras: lens, plot)
"""

from __future__ import annotations

import argparse

import torch

import exactformer as ef
from exactformer import export as et
from exactformer.data import builtin


def main(out: str = "interpret.png", sequence: int = 0) -> dict:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = builtin.demo()
    model = ef.compile(data, width=8)
    bridge = et.to_lens(model)
    xs, ys = data.floats()
    verdict = et.lens_verdict(bridge, data)
    x, mask = et.lens_batch(bridge, xs, data.d)
    with torch.no_grad():
        _, cache = bridge.run_with_cache(x, attention_mask=mask)
    layers, halves = et.block_layers(model), et.stream_halves(model)
    phases = model.meta["phases"]
    n = len(xs[sequence])

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6))
    shown = {}
    for ax, (title, phase) in zip(axes[:2], [("first separation round", "separation"),
                                            ("collapse onto the leader tags", "collapse")],
                                  strict=True):
        start, end = phases[phase]
        layer = layers[start if phase == "separation" else end - 1]
        pattern = cache[f"blocks.{layer}.attn.hook_pattern"][sequence, 0, :n, :n].numpy()
        shown[phase] = pattern
        ax.imshow(pattern, cmap="viridis", vmin=0, vmax=1)
        ax.set_title(f"{title}: blocks.{layer}.attn pattern")
        ax.set_xlabel("key token")
        ax.set_ylabel("query token")
    ax = axes[2]
    d = data.d
    for k, (name, (_, end)) in enumerate(phases.items()):
        layer = layers[end - 1]
        resid = cache[f"blocks.{layer}.hook_resid_post"][sequence, :n].numpy()
        cols = slice(halves[layer] * d, halves[layer] * d + 2)
        ax.scatter(*resid[:, cols].T, s=30, label=f"after {name} (blocks.{layer})",
                   color=f"C{k}")
    ax.scatter(*xs[sequence][:, :2].T, s=30, marker="s", facecolors="none", color="k",
               label="input")
    ax.scatter(*ys[sequence][:, :2].T, s=80, marker="x", color="k", label="targets")
    ax.set_title(f"residual stream of sequence {sequence} (first two coordinates)")
    ax.legend(fontsize=7)
    fig.suptitle(f"demo data in TransformerLens: {bridge.cfg.n_layers} layers × d_model "
                 f"{bridge.cfg.d_model} × d_mlp {bridge.cfg.d_mlp} × {bridge.cfg.n_heads} head; "
                 f"max error / scale {verdict.error:.2g}")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    print(f"{model.n_blocks} blocks -> {bridge.cfg.n_layers} TransformerLens layers; "
          f"max error / scale {verdict.error:.3g}; figure -> {out}")
    return {"interpolates": verdict.interpolates, "error": verdict.error,
            "patterns": shown, "n_layers": bridge.cfg.n_layers}


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-o", "--output", default="interpret.png")
    p.add_argument("--sequence", type=int, default=0, help="which sequence to draw")
    args = p.parse_args()
    main(args.output, args.sequence)
