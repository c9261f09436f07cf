"""A plain dense float64 pass: the reference that checks the fast evaluator independently."""

from __future__ import annotations

import math

import numpy as np

from ..model import Transformer, first_mixing
from ..numbers import pad_columns


def dense_forward(model: Transformer, inputs: list[np.ndarray], tau=None,
                  peaks: dict | None = None) -> list[np.ndarray]:
    """A plain float64 pass, written apart from :func:`forward` to check it independently:
    every token of every sequence, every layer dense (A and V as d×d matrices, full n×n
    scores, under the causal mask in a causal model), no multisets and no ridge windows.
    Sequences of equal length run as one batch through an attention layer; a stretch of
    blocks without attention acts on each token alone, so it runs once per distinct token
    of all sequences (:func:`_tokenwise`). Overflow is not trapped: it shows as inf or nan
    in the outputs (see docs/verification.md). Inputs narrower than the model are
    zero-padded and the model's positions added, as by :func:`forward`. ``peaks``, a dict,
    receives the largest |value| of each intermediate, keyed (block, part), part one of "FF
    pre-activation", "FF output", "scores", "state" (docs/numerics.md#runtime-ranges).
    """
    params = model.to_float() if model.exact else model
    t = float(tau if tau is not None else (model.tau if model.tau is not None else 1))
    xs = pad_columns([np.asarray(x, dtype=float) for x in inputs], model.d)
    if not xs:
        return []
    if params.positions is not None:
        xs = [x + np.asarray(params.positions[:len(x)], dtype=float) for x in xs]
    blocks, i = params.blocks, 0
    with np.errstate(all="ignore"):
        while i < len(blocks):
            j = first_mixing(blocks, i)
            if j > i:
                xs = _tokenwise(xs, blocks, i, j, peaks)
            if j < len(blocks):
                xs = _batched(xs, blocks[j], j, model, t, peaks)
            i = j + 1
    return xs


def _tokenwise(xs: list[np.ndarray], blocks, i: int, j: int, peaks) -> list[np.ndarray]:
    """Blocks i..j−1, none of which mixes tokens, on every distinct row of all sequences,
    given back to each token. The largest |value| of each column is kept current, so a
    residual FF (η = 1) touches only the columns its units read and write: x + 0 is x."""
    X, inv = np.unique(np.concatenate(xs) + 0.0, axis=0, return_inverse=True)  # −0 = 0
    X = np.asfortranarray(X)
    top = np.abs(X).max(axis=0)
    for k in range(i, j):
        peak = _Peaks(peaks, k)
        if blocks[k].ff is not None:
            X = _tokenwise_ff(X, blocks[k].ff, top, peak)
        peak.note("state", top.max())
    return np.split(X[inv.reshape(-1)], np.cumsum([len(x) for x in xs])[:-1])


def _tokenwise_ff(X: np.ndarray, ff, top: np.ndarray, peak) -> np.ndarray:
    """One FF on the rows X (rows × d), with ``top``, the columns' largest |value|, kept.
    A residual FF (η = 1) on finite rows changes only the rows where a unit is active
    (elsewhere it adds exactly 0), so only those are written (:func:`_write`); a layer of
    many rows and few active ones, as a keyed model's moves, then costs its pre-activations
    alone. Only where every value is finite: an inf (inf·0 = nan) reaches every column in the
    plain pass, and so it does here."""
    reads, writes = np.flatnonzero(ff.U.any(axis=0)), np.flatnonzero(ff.W.any(axis=1))
    Z = None
    if ff.eta == 1 and np.isfinite(top).all():
        Z = X[:, reads] @ ff.U[:, reads].T + ff.b
    if Z is None or not np.isfinite(Z).all():
        Z = peak("FF pre-activation", X @ ff.U.T + ff.b)
        X = np.asfortranarray(ff.eta * X + np.maximum(Z, 0.0) @ ff.W.T)
        top[:] = np.abs(X).max(axis=0)
    else:
        on = np.flatnonzero((peak("FF pre-activation", Z) > 0).any(axis=1))
        if len(on):
            _write(X, on, writes, np.maximum(Z[on], 0.0) @ ff.W[writes].T, top)
    peak.note("FF output", top.max())
    return X


def _write(X: np.ndarray, on: np.ndarray, writes: np.ndarray, add: np.ndarray,
           top: np.ndarray) -> None:
    """X[on, writes] += add, ``on`` the rows where a unit is active (every other row would
    gain exactly 0), with ``top`` kept the columns' largest |value|: a column's largest can
    fall only where a row of ``on`` reached it, and only such a column is read again."""
    before = np.abs(X[np.ix_(on, writes)]).max(axis=0)
    X[np.ix_(on, writes)] += add
    top[writes] = np.maximum(top[writes], np.abs(X[np.ix_(on, writes)]).max(axis=0))
    fell = writes[before >= top[writes]]
    if len(fell):
        top[fell] = np.abs(X[:, fell]).max(axis=0)


def _batched(xs: list[np.ndarray], blk, i: int, model: Transformer, tau: float, peaks
             ) -> list[np.ndarray]:
    """Block i, whose attention mixes tokens, on each batch of sequences of one length."""
    out: list = [None] * len(xs)
    for n in sorted({len(x) for x in xs}):
        js = [j for j, x in enumerate(xs) if len(x) == n]
        seen = np.tril(np.ones((n, n), dtype=bool)) if model.causal else None
        Y = _dense_block(np.stack([xs[j] for j in js]), blk, model.attention, tau, seen,
                         _Peaks(peaks, i))
        for j, y in zip(js, Y, strict=True):
            out[j] = y
    return out


class _Peaks:
    """Records the largest |value| of block ``i``'s parts into ``peaks`` (None: nothing)."""

    def __init__(self, peaks: dict | None, i: int):
        self.peaks, self.i = peaks, i

    def __call__(self, part: str, values: np.ndarray) -> np.ndarray:
        if self.peaks is not None and values.size:
            self.note(part, np.abs(values).max())
        return values

    def note(self, part: str, top) -> None:
        """Record ``top``, a largest |value| of the part (nan stays nan)."""
        if self.peaks is not None:
            top, key = float(top), (self.i, part)
            self.peaks[key] = top if math.isnan(top) else max(self.peaks.get(key, 0.0), top)


def _dense_block(X: np.ndarray, blk, attention: str, tau: float, seen, peak) -> np.ndarray:
    """One block x ↦ SA(FF(x)) on a (B, n, d) batch, densely, in float64 (``seen``: the
    causal mask, None for set models)."""
    if blk.ff is not None:
        ff = blk.ff
        Z = peak("FF pre-activation", X @ ff.U.T + ff.b)
        X = peak("FF output", ff.eta * X + np.maximum(Z, 0.0) @ ff.W.T)
    if blk.sa is None or blk.sa.is_identity():
        return peak("state", X)
    out = blk.sa.rho * X
    for head in blk.sa.heads:
        S = peak("scores", (X @ head.A.dense().T) @ np.swapaxes(X, 1, 2))  # <A x_i, x_l>
        if seen is not None:
            S = np.where(seen, S, -np.inf)
        if attention == "hardmax":
            M = (S == S.max(axis=2, keepdims=True)).astype(float)
        else:
            M = np.exp((S - S.max(axis=2, keepdims=True)) / tau)
        M = M / M.sum(axis=2, keepdims=True)
        out = out + (M @ X) @ head.V.dense().T
    return peak("state", out)
