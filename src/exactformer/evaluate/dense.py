"""A plain dense float64 pass: the reference that checks the fast evaluator independently."""

from __future__ import annotations

import numpy as np

from ..model import Transformer
from ..numbers import pad_columns


def dense_forward(model: Transformer, inputs: list[np.ndarray], tau=None) -> list[np.ndarray]:
    """A plain float64 pass, written apart from :func:`forward` to check it independently:
    every token of every sequence, every layer dense (A and V as d×d matrices, full n×n
    scores), no multisets and no ridge windows. Sequences of equal length run as one batch.
    Overflow is not trapped: it shows as inf or nan in the outputs (see docs/verification.md).
    Inputs narrower than the model are zero-padded, as by :func:`forward`.
    """
    params = model.to_float() if model.exact else model
    t = float(tau if tau is not None else (model.tau if model.tau is not None else 1))
    xs = pad_columns([np.asarray(x, dtype=float) for x in inputs], model.d)
    outs: list = [None] * len(xs)
    for n in sorted({len(x) for x in xs}):
        js = [j for j, x in enumerate(xs) if len(x) == n]
        X = np.stack([xs[j] for j in js])  # (B, n, d)
        with np.errstate(all="ignore"):
            for blk in params.blocks:
                X = _dense_block(X, blk, model.attention, t)
        for j, y in zip(js, X, strict=True):
            outs[j] = y
    return outs


def _dense_block(X: np.ndarray, blk, attention: str, tau: float) -> np.ndarray:
    """One block x ↦ SA(FF(x)) on a (B, n, d) batch, densely, in float64."""
    if blk.ff is not None:
        ff = blk.ff
        X = ff.eta * X + np.maximum(X @ ff.U.T + ff.b, 0.0) @ ff.W.T
    if blk.sa is None or blk.sa.is_identity():
        return X
    out = blk.sa.rho * X
    for head in blk.sa.heads:
        S = (X @ head.A.dense().T) @ np.swapaxes(X, 1, 2)  # S[b, i, l] = <A x_i, x_l>
        if attention == "hardmax":
            M = (S == S.max(axis=2, keepdims=True)).astype(float)
        else:
            M = np.exp((S - S.max(axis=2, keepdims=True)) / tau)
        M = M / M.sum(axis=2, keepdims=True)
        out = out + (M @ X) @ head.V.dense().T
    return out
