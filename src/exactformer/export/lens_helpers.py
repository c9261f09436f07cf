"""Run a folder that ``exactformer export --layout transformer-lens`` wrote, with TransformerLens.

This file is copied into every such folder as ``lens_helpers.py``: it imports torch,
safetensors and transformer_lens only, never exactformer, so the folder runs on a machine
without it. The recipe that uses it is docs/export.md#transformerlens-alone.

* :func:`load_bridge` rebuilds the bridge from ``config.json`` and ``model.safetensors``;
* :func:`pad_batch` turns sequences of d-dimensional tokens into the model's input: the
  residual stream itself, zero-padded to ``config["d_model"]`` coordinates, and a mask;
* :func:`read_outputs` cuts the logits back into one (n_j, d_vocab_out) tensor per sequence;
* :func:`by_position` runs an attention-free model (position keys) position by position,
  in time linear in the length;
* :func:`generate` continues a causal model's prompt greedily, each output snapped to the
  nearest vocabulary vector.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

CHUNK_ROWS = 1 << 13  # rows a forward pass in by_position (larger ones leave the cache)


def boot(config: dict, state: dict, device=None):
    """``TransformerBridge.boot_native`` of ``config`` in its own dtype (boot_native builds
    float32 parameters unless told), loaded strictly with ``state`` (:func:`load_strictly`),
    in eval mode."""
    from transformer_lens.config import TransformerBridgeConfig
    from transformer_lens.model_bridge import TransformerBridge

    dtype = getattr(torch, config.get("dtype", "float32"))
    bridge = TransformerBridge.boot_native(TransformerBridgeConfig(**config), dtype=dtype,
                                           device=device)
    load_strictly(bridge, state)
    return bridge.eval()


def load_strictly(bridge, state: dict) -> None:
    """Copy ``state`` into the bridge's own tensors, which must have the same names and
    shapes (else ValueError): what ``load_state_dict(state, strict=True)`` does, in time
    linear in the layers (torch's filters the keys once per submodule, which took 20 s of
    a 500-layer boot)."""
    own = bridge.state_dict(keep_vars=True)
    if own.keys() != state.keys():
        missing, extra = sorted(own.keys() - state.keys()), sorted(state.keys() - own.keys())
        raise ValueError(f"state does not fit the bridge: missing {missing[:5]}, "
                         f"unexpected {extra[:5]}")
    with torch.no_grad():
        for name, tensor in own.items():
            if tensor.shape != state[name].shape:
                raise ValueError(f"{name}: shape {tuple(state[name].shape)} in the state, "
                                 f"{tuple(tensor.shape)} in the bridge")
            tensor.copy_(state[name])


def load_bridge(folder, device=None):
    """The bridge stored in ``folder`` (its config.json and model.safetensors)."""
    from safetensors.torch import load_file

    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text())
    return boot(config, load_file(str(folder / "model.safetensors")), device)


def pad_batch(sequences, d_model: int, dtype=torch.float64, device=None):
    """(x, mask) for a list of sequences, each n_j tokens of d ≤ d_model coordinates.

    x is (B, n, d_model) with sequence j's tokens in x[j, :n_j, :d] and zeros everywhere
    else: a model wider than its data (position keys, keyed models, non-residual layers)
    reads them zero-padded. mask is (B, n), 1 at real tokens and 0 at padding."""
    rows = [torch.as_tensor(s, dtype=dtype, device=device) for s in sequences]
    n = max(len(r) for r in rows)
    x = torch.zeros(len(rows), n, d_model, dtype=dtype, device=device)
    mask = torch.zeros(len(rows), n, dtype=torch.long, device=device)
    for j, r in enumerate(rows):
        x[j, : len(r), : r.shape[1]] = r
        mask[j, : len(r)] = 1
    return x, mask


def read_outputs(logits: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
    """Sequence j's outputs: the logits (B, n, d_vocab_out) at its real tokens."""
    return [logits[j, : int(m.sum())] for j, m in enumerate(mask)]


def nearest(vocabulary: torch.Tensor, outputs: torch.Tensor) -> torch.Tensor:
    """For each output row, the index of the nearest vocabulary row (Euclidean)."""
    return torch.cdist(outputs, vocabulary).argmin(dim=-1)


def attention_free(bridge) -> bool:
    """Whether every attention layer's weights and biases (q, k, v, o) are zero. On a finite
    residual such a layer's output is then exactly 0 (scores 0, values 0), so position i's
    output depends on its own token and position only, bit for bit as in the full pass."""
    return all(not (part.weight.any() or part.bias.any())
               for block in bridge.blocks
               for part in (block.attn.q, block.attn.k, block.attn.v, block.attn.o))


@torch.no_grad()
def by_position(bridge, x: torch.Tensor, start: int = 0, fwd_hooks=()) -> torch.Tensor:
    """The logits of an attention-free bridge (:func:`attention_free`) on x (B, n, d_model),
    the tokens at positions start..start+n−1: every (sequence, position) runs as its own
    length-1 sequence entering block 0 with its position's embedding added (the residual
    the full pass starts from), CHUNK_ROWS rows a pass. The same outputs as the full pass,
    at a cost linear in n where the full pass is quadratic (its attention scores).

    It runs on one CPU thread (restored afterwards): its operations are small (rows ×
    d_model), and on a busy machine torch's threads spent far longer waiting for each other
    than computing (a 500-layer check: 1.5 s on one thread, 54 s on two)."""
    B, n, D = x.shape
    resid = (x + bridge.pos_embed.weight[start: start + n]).reshape(B * n, 1, D)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out = torch.cat([bridge.run_with_hooks(chunk, return_type="logits", start_at_layer=0,
                                               fwd_hooks=list(fwd_hooks))[:, 0]
                         for chunk in resid.split(CHUNK_ROWS)])
    finally:
        torch.set_num_threads(threads)
    return out.reshape(B, n, -1)


@torch.no_grad()
def generate(bridge, prompt, steps: int, vocabulary) -> list[int]:
    """Greedy continuation of a causal model: ``steps`` indices into ``vocabulary`` (V × d),
    each the nearest vocabulary vector to the output at the position before it; ``prompt``
    is k × d (the vocabulary vectors of the prompt).

    An attention-free model (position keys) is tabulated: every vocabulary vector at every
    position to be read (:func:`by_position`), then walked; no forward pass per token. Any
    other model runs its whole prefix for each new token (no key-value cache)."""
    p = next(bridge.parameters())
    vocab = torch.as_tensor(vocabulary, dtype=p.dtype, device=p.device)
    tokens = torch.as_tensor(prompt, dtype=p.dtype, device=p.device)
    k, d = tokens.shape
    if k + steps - 1 > bridge.cfg.n_ctx:
        raise ValueError(f"prompt {k} + {steps} steps passes the model's "
                         f"{bridge.cfg.n_ctx} positions")
    if attention_free(bridge):
        return _walk(bridge, tokens[-1], k - 1, steps, vocab)
    out: list[int] = []
    for _ in range(steps):
        x, _ = pad_batch([tokens], bridge.cfg.d_model, p.dtype, p.device)
        last = bridge(x, return_type="logits")[0, -1, :d]  # one sequence: no mask needed
        out.append(int(nearest(vocab, last[None])[0]))
        tokens = torch.cat([tokens, vocab[out[-1]][None]])
    return out


def _walk(bridge, token: torch.Tensor, start: int, steps: int, vocab: torch.Tensor) -> list[int]:
    """Tabulate next[v, i] for vocabulary entry v at positions start..start+steps−1, then
    follow it from ``token`` at position ``start`` (which need not be in the vocabulary)."""
    d, D = vocab.shape[1], bridge.cfg.d_model
    table = torch.cat([token[None], vocab])  # row 0: the prompt's last token
    x = torch.zeros(len(table), steps, D, dtype=vocab.dtype, device=vocab.device)
    x[:, :, :d] = table[:, None, :]
    nxt = nearest(vocab, by_position(bridge, x, start)[..., :d].reshape(-1, d))
    nxt = nxt.reshape(len(table), steps)
    walk, row = [], 0
    for i in range(steps):
        walk.append(int(nxt[row, i]))
        row = walk[-1] + 1
    return walk
