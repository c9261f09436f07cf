"""The TransformerLens layout: a model as a ``TransformerBridge`` config and state dict.

A pure converter (:func:`lens_config`, :func:`lens_state_dict`: model in, plain dict and
tensors out) and the few lines that build the bridge from them (:func:`build_bridge`); files,
runs and the verdict are :mod:`exactformer.export.lens_files`; the bridge is built by the
folder's own helper file (:mod:`exactformer.export.lens_helpers`), the one place that
imports ``transformer_lens`` (the ``lens`` extra). How our blocks become TransformerLens
blocks, and why each step is exact in floating point, is
docs/numerics.md#the-transformerlens-export.

In short: TL blocks are x ← x + attn(x); x ← x + mlp(x) with no normalisation and ReLU MLPs.
Our FF→SA blocks are laid out as the ρ/η layout pairs them, (–, FF_1), (SA_1, FF_2), …; a
layer that is not residual (η ≠ 1, ρ ≠ 1) writes its output into the other half of a stream
of width 2d and erases its input half with units relu(x) − relu(−x) = x, so the two halves
take turns and nothing is added that could round. Hardmax is softmax with the scores divided
by ``attn_scale`` = 2⁻ᵏ (:func:`hardmax_exponent`).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..lens_plan import hardmax_exponent_for, lens_shape, plan, score_bound
from ..model import FF, SA, Transformer
from .lens_helpers import boot as build_bridge
from .native import floats

LENS_DTYPES = ("float64", "float32")
# Scaled hardmax scores are kept below g·‖x‖²·2^HALF_RANGE (g: the largest score coefficient),
# half the exponent range: far from overflow for any token of norm below 2^(emax−HALF)/2, and
# far above the score gaps' underflow thresholds (EXP_UNDERFLOW).
HALF_RANGE = {"float64": 512, "float32": 64}
# exp(−t) is exactly 0 for t above these: the smallest subnormal is 2^−1074 (float64) and
# 2^−149 (float32), so exp(−t) rounds to 0 once t > ln 2 · 1075 (745.1…) or ln 2 · 150 (103.9…).
EXP_UNDERFLOW = {"float64": 746.0, "float32": 104.0}
DEFAULT_N_CTX = 2048  # set models have no positions: TL still needs a context length


# ------------------------------------------------------------------------------ hardmax scale
def hardmax_exponent(model: Transformer, dtype: str = "float64") -> int:
    """k such that softmax(2^k·s) is hardmax on the model's scores s (docs/numerics.md).

    2^k·g = 2^HALF_RANGE (rounded down to a power of two): a query whose best score beats
    every other by a margin m ≥ EXP_UNDERFLOW·2^−k gets weight exactly 0 on the others, and
    a tie of |C| equal floats gets exactly 1/|C| each. Raises ValueError where 2^−k is not a
    normal number of ``dtype``."""
    k = hardmax_exponent_for(model, HALF_RANGE[dtype])
    info = torch.finfo(getattr(torch, dtype))
    if k is None or not math.log2(info.tiny) < -k < math.log2(info.max):
        need = "" if k is None else f" (needs 2^{-k} as attn_scale)"
        raise ValueError(f"transformer-lens export: hardmax scores up to "
                         f"{score_bound(model):.3g}·‖x‖² cannot be scaled to softmax in "
                         f"{dtype}{need}")
    return k


def query_scale(model: Transformer) -> int:
    """The power of two the queries are multiplied by: 1 for hardmax (the scale is all in
    attn_scale), else 2 or 4, whichever keeps attn_scale = that·τ away from 1 (which TL
    refuses for d_head > 1, reading it as a forgotten scale)."""
    if model.attention == "hardmax":
        return 1
    tau = 1.0 if model.tau is None else float(model.tau)
    return 2 if not math.isclose(2 * tau, 1.0, abs_tol=1e-9) else 4


# ------------------------------------------------------------------------------ converter
def lens_config(model: Transformer, dtype: str = "float64", n_ctx: int | None = None) -> dict:
    """The ``TransformerBridgeConfig`` fields of ``model``'s TL form: no normalisation, ReLU,
    d_head = d + 1, one TL head per head of the widest layer, d_vocab_out = d, and the
    stream width d_model = d, or 2d where some layer is not residual."""
    if dtype not in LENS_DTYPES:
        raise ValueError(f"dtype must be one of {LENS_DTYPES}, got {dtype!r}")
    n_layers, d_model, d_mlp, n_heads = lens_shape(model)
    if model.positions is not None:
        n_ctx = len(model.positions)
    tau = 1.0 if model.tau is None else float(model.tau)
    scale = query_scale(model)
    return {"n_layers": n_layers, "d_model": d_model, "d_head": model.d + 1,
            "n_heads": n_heads, "d_mlp": d_mlp,
            "n_ctx": n_ctx or DEFAULT_N_CTX, "d_vocab": 1, "d_vocab_out": model.d,
            "act_fn": "relu", "normalization_type": None,
            "attention_dir": "causal" if model.causal else "bidirectional",
            "positional_embedding_type": "standard", "use_attn_scale": True,
            # TL divides the scores by attn_scale: 2^−k (hardmax), or s·τ with the queries
            # multiplied by s = query_scale (softmax); both are exact rescalings
            "attn_scale": 2.0 ** -hardmax_exponent(model, dtype) if scale == 1 else scale * tau,
            "init_weights": False, "dtype": dtype}


def lens_state_dict(model: Transformer, dtype: str = "float64",
                    n_ctx: int | None = None) -> dict[str, torch.Tensor]:
    """The bridge's state dict (its own keys: ``embed``, ``pos_embed``, ``blocks.{i}.attn.{q,
    k, v, o}``, ``blocks.{i}.mlp.{in, out}``, ``unembed``) of ``model``'s TL form, computed in
    exact numbers and rounded once to ``dtype``."""
    cfg = lens_config(model, dtype, n_ctx)
    d, D = model.d, cfg["d_model"]
    H, dh, w = cfg["n_heads"], cfg["d_head"], cfg["d_mlp"]
    q_scale = query_scale(model)
    out: dict[str, np.ndarray] = {"embed.weight": _zeros(1, D),
                                  "pos_embed.weight": _zeros(cfg["n_ctx"], D)}
    if model.positions is not None:
        out["pos_embed.weight"][:, :d] = model.positions
    half = 0  # the half of the stream that holds the tokens
    for i, layer in enumerate(plan(model)):
        key = f"blocks.{i}."
        attn = {n: _zeros(H * dh, D) for n in "qkv"} | {"o": _zeros(D, H * dh)}
        if layer.attn is not None:
            into = half if layer.attn.rho == 1 else 1 - half
            _attention(attn, layer.attn, d, dh, _half(half, d), _half(into, d), q_scale)
        for n, weight in attn.items():
            out[key + f"attn.{n}.weight"] = weight
            out[key + f"attn.{n}.bias"] = _zeros(weight.shape[0])
        w_in, b_in, w_out = _zeros(w, D), _zeros(w), _zeros(D, w)
        for part in layer.mlp:
            half = _mlp(part, w_in, b_in, w_out, d, half)
        out |= {key + "mlp.in.weight": w_in, key + "mlp.in.bias": b_in,
                key + "mlp.out.weight": w_out, key + "mlp.out.bias": _zeros(D)}
    unembed = _zeros(d, D)
    unembed[:, _half(half, d)] = np.eye(d, dtype=int)
    out |= {"unembed.weight": unembed, "unembed.bias": _zeros(d)}
    torch_dtype = getattr(torch, dtype)
    return {k: torch.as_tensor(floats(v), dtype=torch_dtype).contiguous()
            for k, v in out.items()}


def _zeros(*shape) -> np.ndarray:
    """An object array of exact zeros (Fractions and ints mix freely in it)."""
    return np.zeros(shape, dtype=int).astype(object)


def _half(h: int, d: int) -> slice:
    return slice(h * d, h * d + d)


def _attention(w: dict, sa: SA, d: int, dh: int, read: slice, write: slice, q_scale) -> None:
    """Head h: q = [α·x_i; c·x_i], k = [x_l; a·x_l], so q·k = α⟨x_i, x_l⟩ + (c·x_i)(a·x_l) is
    the score (times ``q_scale``); v = x, o = V_h. Reads the half ``read``, writes ``write``."""
    eye = np.eye(d, dtype=int)
    for h, head in enumerate(sa.heads):
        rows = slice(h * dh, h * dh + d)
        w["q"][rows, read] = eye * (head.A.alpha * q_scale)
        w["q"][h * dh + d, read] = head.A.c * q_scale
        w["k"][rows, read] = eye
        w["k"][h * dh + d, read] = head.A.a
        w["v"][rows, read] = eye
        w["o"][write, rows] = head.V.dense()


def _mlp(part, w_in, b_in, w_out, d: int, half: int) -> int:
    """Write one MLP part into the block's weights; the half holding the tokens after it.

    A residual FF (η = 1) reads and writes the token half. A non-residual one, and the ρ·x of
    a non-residual SA ("mix"), also use 2d units r = relu(x), r' = relu(−x): the other half
    gets η·(r − r') (resp. ρ·(r − r')) on top, and the token half −(r − r'), exactly 0 after
    the residual sum, since one of r, r' is 0 and the other is ±x."""
    kind, value = part
    read, other = _half(half, d), _half(1 - half, d)
    eye = np.eye(d, dtype=int)
    width = 0
    if kind == "ff":
        ff: FF = value
        width = ff.width
        w_in[:width, read], b_in[:width] = ff.U, ff.b
        if ff.eta == 1:
            w_out[read, :width] = ff.W
            return half
        w_out[other, :width] = ff.W
        scale = ff.eta
    else:
        scale = value
    pos, neg = slice(width, width + d), slice(width + d, width + 2 * d)
    w_in[pos, read], w_in[neg, read] = eye, -eye
    w_out[read, pos], w_out[read, neg] = -eye, eye
    w_out[other, pos], w_out[other, neg] = eye * scale, -eye * scale
    return 1 - half


# ------------------------------------------------------------------------------ bridge
def to_lens(model: Transformer, dtype: str = "float64", device=None, n_ctx: int | None = None):
    """``model`` as a TransformerLens ``TransformerBridge`` (docs/numerics.md), tagged with the
    model's attention (``exactformer_attention``), which its config cannot say: a softmax
    export at τ < 1/2 has an attn_scale below 1 as a hardmax one does (:func:`lens_verdict`)."""
    bridge = build_bridge(lens_config(model, dtype, n_ctx), lens_state_dict(model, dtype, n_ctx),
                          device)  # the helper every exported folder carries (lens_helpers.boot)
    bridge.exactformer_attention = model.attention
    return bridge
