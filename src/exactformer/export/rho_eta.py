"""The ρ/η research layout as a module: :func:`to_rho_eta` (docs/numerics.md#the-torch-export)."""

from __future__ import annotations

import numpy as np
import torch

from ..lens_plan import is_identity_sa
from ..model import Transformer
from .modules import RhoEtaTransformer, fill


def to_rho_eta(model: Transformer, dtype=torch.float64, device=None) -> RhoEtaTransformer:
    """The ρ/η-layout module of ``model``.

    Our blocks are FF→SA, the layout's are attention→FF, so the layers pair up shifted by one:
    (identity, FF_1), (SA_1, FF_2), …, (SA_L, identity); pairs of two identities are dropped.
    Scores ⟨A x_i, x_l⟩ = α x_i·x_l + (c·x_i)(a·x_l) = (W_q x_i)·(W_k x_l) with
    W_q = [α·I; cᵀ], W_k = [I; aᵀ] (h = d + 1, no square roots); W_v = V. Narrow FFs get zero
    hidden units; an identity FF is η = 1 with zero weights, an identity SA ρ = 1 with W_v = 0.
    Every layer gets the model's most heads H (docs/heads.md): head t's W_q, W_k, W_v are rows
    t·h.., t·h.., t·d.. of ``to_q``, ``to_k``, ``to_v``; a layer's missing heads have W_v = 0.
    """
    d = model.d
    ffs = [b.ff for b in model.blocks] + [None]
    sas = [None] + [None if is_identity_sa(b.sa) else b.sa for b in model.blocks]
    pairs = [(sa, ff) for sa, ff in zip(sas, ffs, strict=True)
             if sa is not None or ff is not None]
    width = max(4, model.max_width())
    tau = None if model.tau is None else float(model.tau)
    H = max(1, model.max_heads())
    module = RhoEtaTransformer(d, len(pairs), d + 1, model.attention, tau, width, dtype,
                               model.causal, None if model.positions is None
                               else len(model.positions), H)
    with torch.no_grad():
        for p in module.parameters():
            p.zero_()
    if model.positions is not None:
        fill(module, positions=model.positions)
    eye = np.eye(d, dtype=int)
    for blk, (sa, ff) in zip(module.blocks, pairs, strict=True):
        if sa is None:
            fill(blk, rho=1)
        else:
            fill(blk, rho=sa.rho)
            pad = [np.zeros((d + 1, d), dtype=int)] * (H - len(sa.heads))
            fill(blk.attn.to_q, weight=np.vstack(
                [np.vstack([eye * h.A.alpha, h.A.c[None, :]]) for h in sa.heads] + pad))
            fill(blk.attn.to_k, weight=np.vstack(
                [np.vstack([eye, h.A.a[None, :]]) for h in sa.heads] + pad))
            fill(blk.attn.to_v, weight=np.vstack(
                [h.V.dense() for h in sa.heads] + [np.zeros((d, d), dtype=int)] *
                (H - len(sa.heads))))
        if ff is None:
            fill(blk, eta=1)
        else:
            w = ff.width
            fill(blk, eta=ff.eta)
            fill(blk.ff[0], weight=np.vstack([ff.U, np.zeros((width - w, d), dtype=int)]),
                  bias=np.concatenate([ff.b, np.zeros(width - w, dtype=int)]))
            fill(blk.ff[2], weight=np.hstack([ff.W, np.zeros((d, width - w), dtype=int)]))
    return module.to(device)
